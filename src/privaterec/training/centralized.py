"""Centralized training: the non-private upper bound (PrivateRec §4 "Centralized").

Mini-batch training of the recommender on all users' samples pooled on one machine, with the
InfoNCE loss over 1 clicked + k non-clicked candidates of the same impression (FedNewsRec
Eq. 3). Resumable: a checkpoint holds the model, optimizer, position in the epoch and RNG
state, so a run killed and resumed ends with the parameters of an uninterrupted run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from privaterec.config import TrainConfig
from privaterec.data.clients import ClientDataset
from privaterec.models.recommender import Recommender
from privaterec.privacy.samplers import SimulationNoise
from privaterec.runtime.checkpoint import load_checkpoint, save_checkpoint
from privaterec.runtime.determinism import deterministic_algorithms
from privaterec.runtime.device import module_device

EpochCallback = Callable[[int, dict[str, float]], dict[str, Any] | None]


def info_nce_loss(logits: torch.Tensor) -> torch.Tensor:
    """Mean InfoNCE loss of logits ``[b, 1 + k]`` whose column 0 is the clicked news."""
    return F.cross_entropy(logits, torch.zeros(logits.shape[0], dtype=torch.long,
                                               device=logits.device))


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator of one epoch's negative draws and sample order (seed, epoch) → stream."""
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


def train_centralized(model: Recommender, clients: ClientDataset, config: TrainConfig, *,
                      checkpoint_path: str | Path | None = None,
                      checkpoint_every: int = 200, progress: bool = True,
                      stop_after_steps: int | None = None,
                      on_epoch_end: EpochCallback | None = None) -> list[dict[str, Any]]:
    """Train ``model`` on the pooled samples of ``clients``; resume from ``checkpoint_path``.

    Parameters
    ----------
    model:
        The recommender, with the news table of ``clients``' rows attached.
    clients:
        Training samples (history ``[U, H]``, candidates drawn anew each epoch).
    config:
        ``epochs``, ``lr`` (Adam), ``batch_size``, ``negatives`` (k), ``seed``.
    checkpoint_path:
        Where to save/resume; saved every ``checkpoint_every`` steps and after each epoch.
    stop_after_steps:
        Stop (after checkpointing) once this many optimizer steps ran in this call; used to
        test resumption.
    on_epoch_end:
        Called with (epoch, {"loss": mean loss}) after each epoch; its returned dict is
        stored in the epoch's log entry (e.g. validation metrics).

    Returns
    -------
    One log entry per completed epoch: ``{"epoch", "loss", ...}``.

    Training runs with deterministic algorithms (see :mod:`privaterec.runtime.determinism`),
    so the same seed gives bitwise the same parameters in any process.
    """
    with deterministic_algorithms():
        return _train(model, clients, config, checkpoint_path=checkpoint_path,
                      checkpoint_every=checkpoint_every, progress=progress,
                      stop_after_steps=stop_after_steps, on_epoch_end=on_epoch_end)


def parameter_groups(model: Recommender, config: TrainConfig) -> list[dict[str, Any]]:
    """Adam parameter groups: everything trained at ``config.lr``, except fine-tuned
    pre-trained layers (PLM-NR's MiniLM) at ``config.plm_lr`` in a second group."""
    pretrained = set(model.pretrained_parameter_names())
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in trained if n not in pretrained], "lr": config.lr}]
    if pretrained:
        groups.append({"params": [p for n, p in trained if n in pretrained],
                       "lr": config.plm_lr})
    return groups


def _train(model: Recommender, clients: ClientDataset, config: TrainConfig, *,
           checkpoint_path: str | Path | None, checkpoint_every: int, progress: bool,
           stop_after_steps: int | None,
           on_epoch_end: EpochCallback | None) -> list[dict[str, Any]]:
    optimizer = torch.optim.Adam(parameter_groups(model, config))
    epoch, step_in_epoch, log = 0, 0, []
    loss_sum, loss_count = 0.0, 0
    resumed_rng: torch.Tensor | None = None
    if checkpoint_path is not None and Path(checkpoint_path).exists():
        state = load_checkpoint(checkpoint_path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        epoch, step_in_epoch = state["epoch"], state["step_in_epoch"]
        log, loss_sum, loss_count = state["log"], state["loss_sum"], state["loss_count"]
        resumed_rng = state["torch_rng"]
    model.prepare_news_table(progress=progress)

    def checkpoint() -> None:
        if checkpoint_path is not None:
            save_checkpoint(checkpoint_path, {  # on the CPU whatever the training device
                "model": {k: v.cpu() for k, v in model.state_dict().items()},
                "optimizer": optimizer.state_dict(),
                "epoch": epoch, "step_in_epoch": step_in_epoch, "log": log,
                "loss_sum": loss_sum, "loss_count": loss_count,
                "torch_rng": torch.get_rng_state(), "method": "centralized",
            })

    steps_run = 0
    device = module_device(model)
    n = clients.num_samples
    steps_per_epoch = (n + config.batch_size - 1) // config.batch_size
    while epoch < config.epochs:
        generator = epoch_generator(config.seed, epoch)
        candidates = clients.draw_candidates(negatives=config.negatives,
                                          noise=SimulationNoise(generator))
        order = torch.randperm(n, generator=generator)
        if step_in_epoch == 0:
            torch.manual_seed(config.seed * 7919 + epoch)  # dropout stream of this epoch
        elif resumed_rng is not None:
            torch.set_rng_state(resumed_rng)  # mid-epoch resume: continue the stream
        resumed_rng = None
        model.train()
        bar = tqdm(total=steps_per_epoch, initial=step_in_epoch, disable=not progress,
                   desc=f"epoch {epoch + 1}/{config.epochs}", unit="batch", leave=False)
        while step_in_epoch < steps_per_epoch:
            batch = order[step_in_epoch * config.batch_size:(step_in_epoch + 1) * config.batch_size]
            users = clients.sample_user[batch]
            logits = model(clients.history[users].to(device),
                           clients.history_mask[users].to(device), candidates[batch].to(device))
            loss = info_nce_loss(logits)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            loss_sum += float(loss.detach()) * len(batch)
            loss_count += len(batch)
            step_in_epoch += 1
            steps_run += 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss_sum / loss_count:.4f}")
            if step_in_epoch % checkpoint_every == 0 or (
                    stop_after_steps is not None and steps_run >= stop_after_steps):
                checkpoint()
            if stop_after_steps is not None and steps_run >= stop_after_steps:
                bar.close()
                return log
        bar.close()
        entry: dict[str, Any] = {"epoch": epoch + 1, "loss": loss_sum / max(loss_count, 1)}
        if on_epoch_end is not None:
            entry.update(on_epoch_end(epoch + 1, entry) or {})
        log.append(entry)
        epoch, step_in_epoch, loss_sum, loss_count = epoch + 1, 0, 0.0, 0
        checkpoint()
    return log
