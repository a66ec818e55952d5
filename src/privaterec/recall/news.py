"""The news vectors the recall model reads: a ranking model's encodings of the news table
(Uni-FedRec §3.3, footnote 3: the recall model reuses the ranker's news encoder)."""

from __future__ import annotations

import torch
from torch import Tensor
from tqdm.auto import tqdm

from privaterec.data.features import NewsFeatures
from privaterec.models.layers import eval_mode
from privaterec.models.recommender import Recommender
from privaterec.validators import fail, is_integer


@torch.no_grad()
def encode_news_table(model: Recommender, features: NewsFeatures, *, batch_size: int = 256,
                      progress: bool = False) -> Tensor:
    """Every row of ``features`` through the ranking model's news encoder → ``Tensor[N, d]``.

    Row 0 (the anonymous all-padding news) is encoded too, so history padding has a vector.
    The model is put in eval mode and restored afterwards.
    """
    if not (is_integer(batch_size) and not isinstance(batch_size, bool) and batch_size >= 1):
        fail("batch_size", batch_size, "an integer >= 1", kind="recall training parameter")
    rows = torch.arange(len(features))
    with eval_mode(model):
        chunks = [model.encode_features(features.select(chunk))
                  for chunk in tqdm(rows.split(batch_size), desc="encoding news",
                                    unit="batch", disable=not progress)]
    return torch.cat(chunks).detach().float()


__all__ = ["encode_news_table"]
