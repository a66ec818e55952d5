"""``evaluate --serving local`` : the device ranks the downloaded score matrix itself.

Same model, same candidates: local ranking must give exactly the metrics of serving without
noise, send nothing (ε_s = 0 in the ledger) and report the bytes of the pool download.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from privaterec.cli import main
from privaterec.config import ModelConfig, RunConfig, TrainConfig, fed_config
from privaterec.data.synth import SynthConfig, write_synthetic
from privaterec.errors import ConfigError
from privaterec.eval.serving import local_download_bytes, local_ranking_seams
from privaterec.privacy.report import read_privacy_json
from privaterec.ondevice.pool_format import PoolState, encode_full
from privaterec.ondevice.release import ServingConfig, serving_event
from privaterec.serving.store import NewsPool, _space_scores
from privaterec.runs.ranking import evaluate_run, train_run

TINY = ModelConfig(word_dim=8, num_heads=2, head_dim=4, attention_dim=8, title_len=6,
                   abstract_len=4, history_len=5)
SYNTH = SynthConfig(users=60, news=150, seed=3, impressions_per_user=2, min_history=5,
                    max_history=15, max_candidates=15)
METRICS = ("auc", "mrr", "ndcg@5", "ndcg@10", "impressions")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("local-serving")
    data = root / "data"
    write_synthetic(data, SYNTH)
    out = {}
    for method in ("privaterec", "fedrec"):
        config = RunConfig(data=str(data), model=TINY, train=TrainConfig(method=method),
                           fed=fed_config(method, rounds=3, clients_per_round=5,
                                          **({"epsilon_train": 5.0} if method == "privaterec"
                                             else {})))
        out[method] = root / method
        train_run(config, out[method], progress=False)
    return out


@pytest.mark.parametrize("method", ["privaterec", "fedrec"])
def test_local_ranking_equals_serving_without_noise(runs, method):
    run = runs[method]
    exact = evaluate_run(run, progress=False, serving=ServingConfig(kind="none"))
    local = evaluate_run(run, progress=False, serving=ServingConfig(kind="local"))
    assert {m: local[m] for m in METRICS} == {m: exact[m] for m in METRICS}
    if method == "privaterec":  # ε_s = ∞ PrivateRec serving is ũ = Σ αᵢ bᵢ: the same again
        free = evaluate_run(run, progress=False,
                            serving=ServingConfig(kind="privaterec"))
        assert {m: local[m] for m in METRICS} == {m: free[m] for m in METRICS}
    info = local["serving"]
    rows = 5 if method == "privaterec" else TINY.news_dim
    assert info["bytes_per_query"] == 0 and info["event"]["epsilon"] == 0.0
    assert 4 * rows * info["pool_news"] < info["bytes_downloaded"] \
        < 4 * rows * info["pool_news"] + 16 * info["pool_news"] + 1000
    assert info["bytes_downloaded_float16"] < info["bytes_downloaded"]


def test_local_queries_are_recorded_at_epsilon_zero(runs):
    run = runs["privaterec"]
    result = evaluate_run(run, progress=False, serving=ServingConfig(kind="local"))
    summary = read_privacy_json(Path(result["serving"]["record"]))
    assert summary["release"]["serving"][-1]["kind"] == "local"
    events = [e for e in summary["ledger"]["events"] if e["phase"] == "serve"]
    assert any(e["epsilon"] == 0.0 and "nothing user-dependent" in e["note"] for e in events)
    event = serving_event(ServingConfig(kind="local"), basis_size=5, dim=8)
    assert event.epsilon == 0.0 and event.is_private


def test_seams_score_like_the_device_and_the_server(runs):
    from privaterec.runs.ranking import load_run_model

    _, _, model = load_run_model(runs["privaterec"])
    user_encoder, candidates = local_ranking_seams(model)
    g = torch.Generator().manual_seed(0)
    news = torch.randn(40, model.dim, generator=g)
    history = torch.randn(3, TINY.history_len, model.dim, generator=g)
    mask = torch.ones(3, TINY.history_len, dtype=torch.bool)
    with torch.no_grad():
        alpha = user_encoder(history, mask)  # [3, B]
        columns = candidates(news)  # [40, B]
    basis = model.basis.weight.detach().numpy()
    pool = NewsPool([], news.numpy(), {"privaterec": _space_scores(news.numpy(), basis).T})
    np.testing.assert_array_equal(columns.numpy().T, pool.scores["privaterec"])
    for a in alpha.numpy():  # the server's α̃ᵀP and the seam's pick the same order
        server = pool.space_scores("privaterec", a)
        seam = (torch.from_numpy(a)[None] * columns).sum(-1).numpy()
        np.testing.assert_allclose(seam, server, rtol=1e-5, atol=1e-6)
        assert np.argsort(-seam).tolist() == np.argsort(-server).tolist()


def test_download_size_is_the_encoded_pool():
    ids = [f"N{i}" for i in range(300)]
    state = PoolState(space="scores", dtype="float16", rows=5, model_version="a" * 12,
                      pool_id="b" * 16, version=1, ids=tuple(ids),
                      data=np.ones((300, 5), np.float16))
    assert abs(local_download_bytes(ids, 5, "float16") - len(encode_full(state))) <= 8


def test_local_takes_no_epsilon_and_the_cli_reports_bytes_downloaded(runs, capsys):
    with pytest.raises(ConfigError, match="epsilon_serve"):
        ServingConfig(kind="local", epsilon=1.0)
    run = str(runs["fedrec"])
    assert main(["evaluate", "--run", run, "--serving", "local", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "local ranking: epsilon_s = 0" in out and "bytes in float32" in out
    assert main(["evaluate", "--run", run, "--serving", "local", "--json",
                 "--no-progress"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["serving"]["kind"] == "local" and result["serving"]["bytes_per_query"] == 0
    assert main(["evaluate", "--run", run, "--serving", "local", "--epsilon-serve", "1",
                 "--no-progress"]) != 0


def test_local_scores_of_every_candidate_match_the_noise_free_scores(runs):
    from privaterec.data.features import build_news_features
    from privaterec.data.mind import load_dataset
    from privaterec.eval.evaluate import score_impressions
    from privaterec.runs.ranking import load_run_model

    config, vocabs, model = load_run_model(runs["privaterec"])
    dataset = load_dataset(config.data)
    features = build_news_features(dataset.all_news(), vocabs, title_len=TINY.title_len,
                                   abstract_len=TINY.abstract_len)
    user_encoder, candidates = local_ranking_seams(model)
    local = score_impressions(model, dataset.test, features, history_len=TINY.history_len,
                              user_encoder=user_encoder, candidate_transform=candidates)
    exact = score_impressions(model, dataset.test, features, history_len=TINY.history_len)
    assert len(local.pairs) == len(exact.pairs) > 0
    for (labels, s_local), (same, s_exact) in zip(local.pairs, exact.pairs):
        np.testing.assert_array_equal(labels, same)
        np.testing.assert_allclose(s_local, s_exact, rtol=1e-5, atol=1e-6)
        assert np.argsort(-s_local, kind="stable").tolist() == \
            np.argsort(-s_exact, kind="stable").tolist()
