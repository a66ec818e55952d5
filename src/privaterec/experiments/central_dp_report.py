"""``experiment central-dp``'s output: the markdown tables and caption, and the figure.

* :func:`pivot_table` — the untrained model's and the central rows' AUC by target ε, one line
  per population and model;
* :func:`rows_table` — every row with its setting, its ledger ε and its AUC;
* :func:`caption` — q, T, δ, C, N and clients per round, as the runs recorded them;
* :func:`plot` — one panel per model: AUC against the ledger's user-level ε.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from privaterec.experiments.central_dp_rows import (LDP_EPSILON, PRIVATEREC_BASIS,
                                                    SERVE_PADDING, RowResult)
from privaterec.experiments.common import (SCALE, format_epsilon,
                                           format_summary, markdown_table, model_label,
                                           parse_model)
from privaterec.experiments.plots import new_figure, save_png, set_log_x
from privaterec.experiments.populations import Population
from privaterec.experiments.run_privacy import epsilon_cell, short_epsilon


_AUC_HEADER = f"test AUC (×{SCALE:g})"


def rows_table(results: Sequence[RowResult]) -> str:
    cells = []
    for r in results:
        ledger = r.ledger
        z = f" (z = {r.noise_multiplier:.4g})" if r.noise_multiplier is not None else ""
        eps_s = r.row.epsilon_serve
        cells.append([r.population.label, model_label(r.model), r.row.label,
                      r.setting + z, epsilon_cell(ledger),
                      "-" if eps_s is None else format_epsilon(eps_s),
                      format_summary(r.summaries["auc"]), str(len(r.seeds))])
    return markdown_table(["Users", "Model", "Method", "Setting", "user-level ε of training "
                           "(max / median over users)", "ε_s / query", _AUC_HEADER, "n"],
                          cells)


def pivot_table(results: Sequence[RowResult], epsilons: Sequence[float], *,
                seeds: int) -> str:
    """AUC of the untrained model (ε = 0) and of the central rows by target ε (∞: FedRec),
    one line per population, model and clipping space (a column says which, unless every
    DP-FedAvg row clipped its gradient, the default); a cell with fewer than ``seeds``
    finished seeds says how many it has (``(n = k)``). The untrained model and FedRec, which
    clip nothing, are on every line of their population and model."""
    shared: dict[tuple[str, str], dict[float, str]] = {}
    lines: dict[tuple[str, str, str], dict[float, str]] = {}
    for r in results:
        key = (r.population.label, model_label(r.model))
        partial = f" (n = {len(r.seeds)})" if len(r.seeds) < seeds else ""
        cell = format_summary(r.summaries["auc"]) + partial
        spec = r.row.spec
        if r.row.group == "untrained":
            shared.setdefault(key, {})[0.0] = cell
        elif r.row.group == "central":
            target = spec.target_epsilon
            if target is None:  # FedRec
                shared.setdefault(key, {})[math.inf] = cell
            else:
                lines.setdefault((*key, spec.clip_space), {})[target] = cell
    for key in shared:  # a population and model without DP-FedAvg runs: one line
        if not any(line[:2] == key for line in lines):
            lines[(*key, "parameters")] = {}
    spaces = sorted({space for _, _, space in lines})
    by_space = spaces != ["parameters"]  # say which clipping unless it is the default alone
    columns = (0.0, *epsilons)
    cells = [[users, model, *([_CLIP_SPACE_NAMES[space]] if by_space else []),
              *[{**shared.get((users, model), {}), **values}.get(e, "–") for e in columns]]
             for (users, model, space), values in lines.items()]
    return markdown_table(["Users", "Model", *(["DP-FedAvg clips"] if by_space else []),
                           "ε = 0 (untrained θ₀)",
                           *[f"ε = {format_epsilon(e)}" + (" (FedRec)" if math.isinf(e) else "")
                             for e in epsilons]], cells)


_CLIP_SPACE_NAMES = {"parameters": "the gradient", "news_vectors": "news-vector cotangents"}


def caption(populations: Sequence[Population], results: Sequence[RowResult],
             settings: dict[str, Any], *, seeds: Sequence[int], quick: bool) -> list[str]:
    q, rounds, delta, clip = (settings[k] for k in ("client_fraction", "rounds", "delta",
                                                    "clip"))
    bases = " and ".join(str(b) for b in sorted(
        {r.row.spec.basis for r in results if r.row.group == "privaterec"}
        or {PRIVATEREC_BASIS}))
    notes = [f"Central rows: DP-FedAvg with Poisson sampling at q = {q:g} per round, T = "
             f"{rounds} rounds{' (--quick)' if quick else ''}, updates clipped to L2 norm "
             f"C = {clip:g}, Gaussian noise z·C once on the sum, FedAdam; z calibrated by "
             f"`--target-epsilon` for the whole run at δ = {delta:g} under replacement (one "
             f"user's data replaced, the ledger's adjacency; PLD accountant). ε = ∞ is FedRec "
             f"(r = {q:g}, no clipping, no noise). ε = 0 is each seed's initial model θ₀ (the "
             f"one its runs start from), evaluated without training: it uses no user data, and "
             f"what a private row learned is its gain over it (an encoder whose untrained news "
             f"vectors already share structure, e.g. NAML's category embeddings, starts above "
             f"0.5)."]
    if any(r.row.spec.clip_space == "news_vectors" for r in results):
        notes.append("Clipped in news-vector space (`--clip-space news_vectors`): one gradient "
                     "per client; each client clips the vector [user-side gradient ; the "
                     "cotangents of the news vectors it used] to L2 norm C, the noise z·C is "
                     "added to every coordinate of the sum (the user-side parameters and d "
                     "per news of the table) and the server forms the news-encoder gradient "
                     "with one backward pass over the public table (post-processing). Same "
                     "sensitivity C, sampling, z and accounting as the parameter-space rows "
                     "(docs/privacy.md, \"Clipping in news-vector space\").")
    variants = sorted({r.model for r in results if parse_model(r.model)[1] is not None})
    if variants:
        notes.append(f"{', '.join(model_label(m) for m in variants)}: the news encoder with "
                     "other frozen word vectors than the default random ones. `corpus` vectors "
                     "are fitted on the texts of the training news (PPMI-SVD), treated as the "
                     "public catalogue like the vocabulary: no click, history or impression "
                     "is read and no ε is charged (docs/privacy.md, \"Data used for tuning "
                     "and vocabularies\"). Every row of that model, its untrained θ₀ and "
                     "FedRec included, starts from them.")
    for population in populations:
        ledgers = [s.ledger for r in results if r.population is population
                   and r.row.group != "untrained" for s in r.seeds]
        central = [s.ledger for r in results if r.population is population
                   and r.row.spec.method == "dp-fedavg" for s in r.seeds]
        fixed = [v.clients_per_round for v in ledgers if v.clients_per_round]
        text = f"{population.label} users (`{population.data}`): "
        if central:
            n = max(v.population for v in central)
            text += (f"N = {n:,} training users, δ = {central[0].delta:g} "
                     f"({'<' if central[0].delta < 1 / n else 'NOT <'} 1/N), "
                     f"{q * n:,.0f} expected clients per round (qN)")
        else:
            text += "no DP-FedAvg run finished (N not read from a ledger)"
        if fixed:
            text += (f"; FedRec and the local-DP rows sample {min(fixed):,} clients per round "
                     f"without replacement")
        text += ("; local-DP and PrivateRec rows run here." if population.ldp
                 else "; FedRec and DP-FedAvg only (the local-DP rows run at `--ldp-users`).")
        notes.append(text)
    notes += [
        f"Local-DP rows: each upload is noised on the device (DP-FedRec and PrivateRec at "
        f"ε_t = {LDP_EPSILON:g} per round, FedNewsRec at its paper defaults); the ε shown is "
        "each user's total over the rounds it took part in, at user-level adjacency, as the "
        "ledger composes it (max / median over users; the max over seeds). PrivateRec's "
        "candidate-path gradient reveals which displayed news were drawn, so no total covers "
        "a whole user (∞); paper mode also uploads the history-path gradient raw, so its "
        "stated guarantee does not hold at all.",
        "Trust models differ at the same adjacency: a central row's ε holds against everyone "
        "who sees the released models but not who was sampled, with the aggregator trusted to "
        "add the noise (the simulator's server, or on Flower the SecAgg+ server, which sees "
        "only the sum); a local-DP row's ε holds against the server itself, which sees each "
        "noised upload (docs/privacy.md).",
        f"PrivateRec by DP-FedAvg: the PrivateRec model (B = {bases}) trained by "
        "DP-FedAvg at the largest finite target ε (its training ε is the one shown), then "
        "served by local ranking (the device downloads the pool's score matrix and sends "
        f"nothing: ε_s = 0) or by DPA (padding p = {SERVE_PADDING:g}, Laplace on the B "
        "weights, ε_s per query; serving ε composes over a user's queries: "
        "`privaterec privacy report --run RUN`).",
        f"Test AUC ×{SCALE:g}, mean ± sample std (ddof = 1) over the seeds that finished "
        f"(asked: {', '.join(map(str, seeds))}); n = number of seeds (n = 1: no std). "
        "z is the noise multiplier each DP-FedAvg run calibrated."]
    return notes


# DP-FedAvg's curve per clipping space: marker, line style, label suffix.
_CLIP_SPACE_CURVES = {"parameters": ("o", "-", ""),
                      "news_vectors": ("D", (0, (4, 1)), " (news-vector clipping)")}
_LDP_COLORS = {"dp-fedrec": "C6", "fednewsrec": "C7", "paper": "C8", "strict": "C9"}
_SERVE_MARKERS = {"local": "s", "dpa-1": "v", "dpa-10": "^"}


def _basis_fill(basis: int, results: Sequence[RowResult]) -> str:
    """Marker fill of the PrivateRec rows of ``basis`` basic vectors: full for the first B
    of the table, then hollow, left half, bottom half (their markers would overlap)."""
    bases = sorted({r.row.spec.basis for r in results if r.row.group == "privaterec"})
    fills = ("full", "none", "left", "bottom", "right", "top")
    return fills[bases.index(basis) % len(fills)] if basis in bases else "full"


def plot(path: Path, results: Sequence[RowResult], models: Sequence[str],
          populations: Sequence[Population], epsilons: Sequence[float]) -> Path:
    """One panel per model: DP-FedAvg AUC against the ledger's user-level ε per population
    (FedRec dashed, the untrained model dash-dotted), the local-DP rows dotted, PrivateRec
    central-trained as markers."""
    entries = max((sum(r.model == m for r in results) for m in models), default=0)
    figure, axes = new_figure(columns=len(models), width=6.8, height=4.8 + 0.17 * entries)
    colors = {id(p): f"C{i % 6}" for i, p in enumerate(populations)}
    for ax, model in zip(axes, models):
        mine = [r for r in results if r.model == model]
        for population in populations:
            color = colors[id(population)]
            rows = [r for r in mine if r.population is population]
            for space, (marker, style, name) in _CLIP_SPACE_CURVES.items():
                curve = sorted(((r.ledger.user_max, r.summaries["auc"]) for r in rows
                                if r.row.group == "central" and r.row.spec.method == "dp-fedavg"
                                and r.row.spec.clip_space == space), key=lambda p: p[0])
                if curve:
                    ax.errorbar([x for x, _ in curve], [s.mean * SCALE for _, s in curve],
                                yerr=[(s.std or 0.0) * SCALE for _, s in curve], marker=marker,
                                linestyle=style, capsize=3, color=color,
                                label=f"DP-FedAvg{name}, {population.label} users")
            for r in rows:
                auc = r.summaries["auc"].mean * SCALE
                spec = r.row.spec
                if r.row.group == "untrained":
                    ax.axhline(auc, linestyle="-.", linewidth=1, color=color,
                               label=f"untrained θ₀ (ε = 0), {population.label} users")
                elif spec.method == "fedrec":
                    ax.axhline(auc, linestyle="--", color=color,
                               label=f"FedRec (ε = ∞), {population.label} users")
                elif r.row.group == "ldp":
                    ax.axhline(auc, linestyle=":", linewidth=1.5,
                               color=_LDP_COLORS.get(spec.privacy_mode
                                                     if spec.method == "privaterec"
                                                     else spec.method, "k"),
                               label=f"{r.row.label}, {population.label} users: user ε "
                                     f"{short_epsilon(r.ledger)}")
                elif r.row.group == "privaterec":
                    assert r.row.serving is not None
                    served = r.row.key.rsplit("+", 1)[1]
                    name = ("local ranking (ε_s = 0)" if served == "local"
                            else f"DPA ε_s = {format_epsilon(r.row.serving.epsilon)}")
                    ax.plot([r.ledger.user_max], [auc], linestyle="none",
                            marker=_SERVE_MARKERS.get(served, "D"), color=color,
                            markersize=8, fillstyle=_basis_fill(spec.basis, results),
                            label=f"PrivateRec (B = {spec.basis}) by DP-FedAvg + {name}, "
                                  f"{population.label} users")
        if mine:
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=1)
        else:
            ax.text(0.5, 0.5, "no finished runs", ha="center", va="center",
                    transform=ax.transAxes)
        set_log_x(ax, [e for e in epsilons if math.isfinite(e)])
        ax.grid(True, alpha=0.3)
        ax.set(xlabel="user-level ε of the whole training run (ledger; log scale)",
               ylabel=_AUC_HEADER, title=f"Central vs local DP: {model_label(model)}")
    return save_png(figure, path)


__all__ = ["caption", "pivot_table", "plot", "rows_table"]
