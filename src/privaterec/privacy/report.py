"""The privacy report of a federated run (``RUN/privacy.json``) and noise-calibration reports.

A federated run writes ``privacy.json`` at each checkpoint and at the end of training
(:func:`write_privacy_json`): what one client releases per round (``release``), the target δ,
the completed rounds, the ledger's report at that δ and the ledger itself, so that the report
can be recomposed later at another δ or with another composition
(:func:`recompose_privacy_summary`). :func:`format_privacy_report` renders it for people,
stating which ε is the guarantee (docs/privacy.md#fednewsrecs-epsilon-is-per-coordinate:
FedNewsRec's per-coordinate ε = 2δ/λ is reported next to the whole-update ε = 2δD/λ, never
alone; docs/privacy.md#paper-and-strict-mode: parameters left uncovered by PrivateRec's paper
mode are listed in a warning).

Non-finite floats are stored as strings (``"inf"``), as
:meth:`~privaterec.privacy.ledger.PrivacyLedger.to_dict` does, so the file is strict JSON;
:func:`read_privacy_json` turns them back into floats.

:func:`calibrate_noise` maps a target budget to a noise scale for one noise mechanism of
:mod:`privaterec.privacy.noise` (the mechanism's own scale for ε), or for PrivateRec's DPA.
"""

from __future__ import annotations

import json
import math
import numbers
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from privaterec.errors import CheckpointError, ConfigError
from privaterec.files import write_atomic
from privaterec.privacy.formulas import (COMPOSITIONS, PAPER_SENSITIVITY_WARNING,
                                            Composition, SensitivityMode,
                                            amplified_budget, fednewsrec_coordinate_epsilon,
                                            fednewsrec_update_epsilon)
from privaterec.validators import check_in, is_integer

if TYPE_CHECKING:  # the ledger imports dp_accounting (~1 s): only where it is needed
    from privaterec.privacy.ledger import PrivacyLedger


PRIVACY_FILE = "privacy.json"
FORMAT = "privaterec.privacy"
VERSION = 1
REQUIRED_RELEASE_KEYS = ("method", "mechanism")
NOT_PRIVATE = "∞ (not private)"

_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}
_KNOWN_RELEASE_KEYS = (
    "method", "mechanism", "clipping", "clip_bound", "noise_scale", "sensitivity_l1",
    "sensitivity_l2", "dimension", "epsilon_per_round", "delta_per_round", "coordinate_epsilon",
    "noised_parameters", "clients_per_round", "client_fraction", "uncovered_parameters",
    "epsilon_per_round_user", "simulated_serving")
_REL_TOL = 1e-6


# ---------------------------------------------------------------------------------------------
# JSON safety
# ---------------------------------------------------------------------------------------------

def to_json_safe(value: Any, *, where: str = "value") -> Any:
    """Strict-JSON form of ``value``: non-finite floats become ``"inf"``/``"-inf"``/``"nan"``.

    Mappings become dicts with string keys, tuples become lists, numpy scalars become Python
    numbers. Raises :class:`ConfigError` naming ``where`` for anything else.
    """
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        x = float(value)
        return x if math.isfinite(x) else repr(x)
    if isinstance(value, Mapping):
        return {str(k): to_json_safe(v, where=f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_safe(v, where=f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Path):
        return str(value)
    raise ConfigError(f"privacy report field '{where}' has type {type(value).__name__}, which "
                      f"cannot be written to JSON; pass numbers, strings, lists or dicts")


def _decode(value: Any) -> Any:
    """Inverse of :func:`to_json_safe` for dict values (list items that are strings stay)."""
    if isinstance(value, dict):
        return {k: _NON_FINITE.get(v, v) if isinstance(v, str) else _decode(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [v if isinstance(v, str) else _decode(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------
# Building, writing, reading
# ---------------------------------------------------------------------------------------------

def _check_inputs(release: Any, delta: Any, rounds: Any, composition: Any) -> None:
    if not isinstance(release, Mapping):
        raise ConfigError(f"privacy report 'release' must be a mapping, got "
                          f"{type(release).__name__}")
    missing = [k for k in REQUIRED_RELEASE_KEYS if k not in release]
    if missing:
        raise ConfigError(f"privacy report 'release' lacks the keys {missing}; it must "
                          f"describe one client's per-round release (method, mechanism, ...)")
    check_in(delta, "delta", 0, 1, "a number in [0, 1)")
    if isinstance(rounds, bool) or not (is_integer(rounds) and rounds >= 0):
        raise ConfigError(f"invalid 'rounds': got {rounds!r}, expected an integer >= 0")
    if composition not in COMPOSITIONS:
        raise ConfigError(f"invalid composition {composition!r}; expected one of "
                          f"{', '.join(COMPOSITIONS)}")


def build_privacy_summary(ledger: PrivacyLedger, *, release: Mapping[str, Any], delta: float,
                          rounds: int, composition: Composition = "pld") -> dict[str, Any]:
    """The content of ``privacy.json`` (in memory: non-finite floats are floats).

    Parameters
    ----------
    ledger:
        The run's privacy ledger (every client release recorded).
    release:
        One client's per-round release (``method``, ``mechanism``, ``clipping``,
        ``clip_bound``, ``noise_scale``, ``sensitivity_l1``/``sensitivity_l2``,
        ``dimension``, ``epsilon_per_round``, ``delta_per_round``, ``coordinate_epsilon``,
        ...); unknown keys are kept as they are.
    delta:
        Target δ of the per-user totals.
    rounds:
        Completed rounds.
    composition:
        ``"pld"`` (default), ``"rdp"`` or ``"basic"``.

    Returns
    -------
    dict
        ``format``, ``version``, ``release``, ``delta``, ``rounds``, ``composition``,
        ``report`` (:meth:`~privaterec.privacy.ledger.PrivacyLedger.report`), ``checks``
        (consistency warnings of the release against the ledger, see :func:`release_checks`) and
        ``ledger`` (:meth:`~privaterec.privacy.ledger.PrivacyLedger.to_dict`).
    """
    _check_inputs(release, delta, rounds, composition)
    release = _decode(to_json_safe(release, where="release"))
    report = _decode(to_json_safe(ledger.report(delta=float(delta), composition=composition)))
    checks = release_checks(release, report)
    # N: the run's population when the release states it (a local-DP ledger holds only the
    # users sampled so far), else the ledger's users; never fewer than the ledger holds.
    stated = release.get("population")
    seen = len(ledger.users)
    users, whose = ((int(stated), "the run's population")
                    if is_integer(stated) and not isinstance(stated, bool)
                    and int(stated) >= seen
                    else (seen, "the users of the ledger"))
    if users and not float(delta) < 1 / users:
        checks.append(f"target delta = {float(delta):g} is not below 1/N = {1 / users:.3g} "
                      f"for N = {users}, {whose}: a delta that large allows releasing one "
                      f"user's data outright; report at a smaller --delta")
    return {"format": FORMAT, "version": VERSION, "release": release, "delta": float(delta),
            "rounds": int(rounds), "composition": composition, "report": report,
            "checks": checks, "ledger": ledger.to_dict()}


def write_privacy_json(path: Path, ledger: PrivacyLedger, *, release: Mapping[str, Any],
                       delta: float, rounds: int,
                       composition: Composition = "pld") -> dict[str, Any]:
    """Write ``privacy.json`` atomically (:func:`~privaterec.files.write_atomic`) and return it.

    Parameters are those of :func:`build_privacy_summary`; ``path`` is the file (usually
    ``RUN/privacy.json``; its directory is created if needed).

    Returns
    -------
    dict
        The summary as written, with non-finite floats as floats.
    """
    summary = build_privacy_summary(ledger, release=release, delta=delta, rounds=rounds,
                                    composition=composition)
    write_atomic(Path(path), json.dumps(to_json_safe(summary), indent=1, allow_nan=False))
    return summary


SIMULATED_SERVING_NOTE = (
    "SIMULATED serving: these queries were released offline by 'privaterec evaluate "
    "--serving', with seeded noise, on the run's test impressions; no device released them. "
    "This record is the run's training ledger plus this one evaluation; the run's "
    "privacy.json (what the deployment released) does not include it")


def write_serving_record(path: Path, training: Path, queries: Mapping[str, Any],
                         description: Mapping[str, Any], *, release_if_new: Mapping[str, Any],
                         delta_if_new: float) -> dict[str, Any]:
    """Write one simulated serving evaluation's own privacy record (replacing ``path``).

    The record holds the training ledger of ``training`` (the run's ``privacy.json``, read
    and never written) plus the evaluation's queries (phase ``serve``), so its per-user
    totals are training plus this one evaluation. Evaluating again with the same settings
    replaces the record: simulated evaluations never accumulate, and the run's release
    record stays what the deployment released (docs/privacy.md#the-ledger).

    Parameters
    ----------
    path:
        The record to write (e.g. ``RUN/serving-evaluations/<kind>-<key>.json``).
    training:
        The run's ``privacy.json``; when missing (centralized training) the record starts
        from an empty ledger with ``release_if_new`` and ``delta_if_new``.
    queries:
        User id → sequence of ``(PrivacyEvent, count)`` pairs that user's queries released.
    description:
        The release's ``serving`` entry (what was served, how, how often).
    """
    from privaterec.privacy.ledger import PrivacyLedger

    if training.exists():
        summary = read_privacy_json(training)
        ledger = PrivacyLedger.from_dict(summary["ledger"])
        release, delta, rounds = dict(summary["release"]), summary["delta"], summary["rounds"]
    else:
        ledger, release, delta, rounds = PrivacyLedger(), dict(release_if_new), delta_if_new, 0
    for user, pairs in sorted(queries.items()):
        for event, count in pairs:
            ledger.record(user, event, count)
    release["serving"] = [{**dict(description), "simulated": True}]
    release["simulated_serving"] = SIMULATED_SERVING_NOTE
    return write_privacy_json(path, ledger, release=release, delta=delta, rounds=rounds)


def read_privacy_json(path: Path) -> dict[str, Any]:
    """Read ``privacy.json`` (or ``RUN/privacy.json`` when ``path`` is a run directory).

    Returns
    -------
    dict
        The summary with non-finite floats restored; the ledger is checked to load.

    Raises
    ------
    CheckpointError
        If the run directory or file is missing, or the file is not a valid privacy report.
    """
    path = Path(path)
    file = path / PRIVACY_FILE if path.is_dir() else path
    if not file.exists():
        run = file.parent if file.suffix == ".json" else file
        if not run.is_dir():
            raise CheckpointError(f"{run}: no such run directory; pass the --out "
                                  f"directory of a 'privaterec train' run")
        raise CheckpointError(
            f"{file}: not found; privacy reports are written by federated runs (--method "
            f"fedrec, fednewsrec or dp-fedrec): this run is centralized, was trained before "
            f"privacy reports existed, or has not reached its first checkpoint")
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{file}: unreadable or corrupt privacy report ({exc}); "
                              f"rerun or resume training to rewrite it") from exc
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise CheckpointError(f"{file}: not a privaterec privacy report (expected "
                              f"\"format\": \"{FORMAT}\")")
    if raw.get("version") != VERSION:
        raise CheckpointError(f"{file}: privacy report version {raw.get('version')!r} is not "
                              f"supported; this privaterec reads version {VERSION}")
    missing = [k for k in ("release", "delta", "rounds", "report", "ledger") if k not in raw]
    if missing:
        raise CheckpointError(f"{file}: privacy report lacks {missing}; the file is "
                              f"incomplete, rerun or resume training to rewrite it")
    from privaterec.privacy.ledger import PrivacyLedger

    ledger = raw.pop("ledger")
    summary = _decode(raw)
    try:
        PrivacyLedger.from_dict(ledger)
    except CheckpointError as exc:
        raise CheckpointError(f"{file}: {exc}") from exc
    summary["ledger"] = ledger  # kept in PrivacyLedger.to_dict() form
    summary.setdefault("composition", summary["report"].get("composition", "pld"))
    summary.setdefault("checks", [])
    return summary


def recompose_privacy_summary(summary: Mapping[str, Any], *, delta: float | None = None,
                              composition: Composition | None = None) -> dict[str, Any]:
    """The same run's summary at another target δ and/or composition, from its ledger.

    Returns ``summary`` unchanged (as a new dict) when neither differs; otherwise a new
    summary whose ``recomposed_from`` holds the stored δ and composition.
    """
    old_delta, old_comp = summary["delta"], summary.get("composition", "pld")
    new_delta = old_delta if delta is None else delta
    new_comp = old_comp if composition is None else composition
    if new_delta == old_delta and new_comp == old_comp:
        return dict(summary)
    from privaterec.privacy.ledger import PrivacyLedger

    ledger = PrivacyLedger.from_dict(summary["ledger"])
    out = build_privacy_summary(ledger, release=summary["release"], delta=new_delta,
                                rounds=summary["rounds"], composition=new_comp)
    out["recomposed_from"] = {"delta": old_delta, "composition": old_comp}
    return out


# ---------------------------------------------------------------------------------------------
# Consistency checks and FedNewsRec's two epsilons
# ---------------------------------------------------------------------------------------------

def fednewsrec_epsilons(release: Mapping[str, Any]) -> dict[str, float] | None:
    """Per-coordinate ε = 2δ/λ and whole-update ε = 2δD/λ of an element-wise clipped release.

    Computed from ``clip_bound`` (δ), ``noise_scale`` (λ) and ``dimension`` (D) with
    :func:`fednewsrec_coordinate_epsilon` / :func:`fednewsrec_update_epsilon`
    (docs/privacy.md#fednewsrecs-epsilon-is-per-coordinate). None unless the release is
    element-wise clipped Laplace with those fields.
    """
    if release.get("clipping") != "elementwise" or release.get("mechanism") != "laplace":
        return None
    clip, scale, dim = (release.get(k) for k in ("clip_bound", "noise_scale", "dimension"))
    if clip is None or scale is None or dim is None:
        return None
    return {"coordinate_epsilon": fednewsrec_coordinate_epsilon(clip_bound=clip,
                                                                noise_scale=scale),
            "update_epsilon": fednewsrec_update_epsilon(clip_bound=clip, noise_scale=scale,
                                                        dimension=int(dim))}


def _close(a: float, b: float) -> bool:
    return a == b or math.isclose(a, b, rel_tol=_REL_TOL)


def release_checks(release: Mapping[str, Any], report: Mapping[str, Any]) -> list[str]:
    """Warnings where the release description disagrees with itself or with the ledger."""
    out: list[str] = []
    fnr = fednewsrec_epsilons(release)
    if fnr is not None:
        for key, ref_key, label in (("coordinate_epsilon", "coordinate_epsilon", "2*clip/lambda"),
                                    ("epsilon_per_round", "update_epsilon", "2*clip*D/lambda")):
            ref, stated = fnr[ref_key], release.get(key)
            if isinstance(stated, numbers.Real) and not _close(float(stated), ref):
                out.append(f"release {key}={stated:.6g} differs from {label}={ref:.6g}")
    stated = release.get("epsilon_per_round")
    train = [m for m in report.get("mechanisms", []) if m.get("phase") == "train"]
    # PrivateRec strict mode's per-round ε is the sum of its DPA and history-gradient events.
    if isinstance(stated, numbers.Real) and train and "history_gradient" not in release:
        recorded = [float(m["epsilon"]) for m in train]  # "inf" as written: float("inf")
        if not any(_close(float(stated), e) for e in recorded):
            out.append(f"release epsilon_per_round={stated:.6g} matches no recorded train "
                       f"event (recorded: {', '.join(f'{e:.6g}' for e in recorded)})")
    return out


# ---------------------------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------------------------

def format_epsilon(value: Any) -> str:
    """ε for people: ``"∞ (not private)"`` for ∞, else 6 significant digits."""
    if value is None:
        return "-"
    x = float(_NON_FINITE.get(value, value)) if isinstance(value, str) else float(value)
    return NOT_PRIVATE if math.isinf(x) else f"{x:.6g}"


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return _short(value)
    return format_epsilon(value) if isinstance(value, float) else str(value)


def _nested_rows(prefix: str, block: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(label, text)`` rows of a nested release block, one per leaf, labelled by its path
    (``central: trust: threat_model``): never a raw dict."""
    rows: list[tuple[str, str]] = []
    for key, value in block.items():
        label = f"{prefix}: {key}"
        if isinstance(value, Mapping):
            rows += _nested_rows(label, value)
        elif isinstance(value, (list, tuple)) and value and isinstance(value[0], Mapping):
            for i, item in enumerate(value):
                rows += _nested_rows(f"{label} #{i + 1}", item)
        else:
            rows.append((label, _fmt(value)))
    return rows


def _short(value: Any, limit: int = 6) -> str:
    if isinstance(value, (list, tuple)):
        head = ", ".join(str(v) for v in value[:limit])
        more = f", ... ({len(value)} in all)" if len(value) > limit else ""
        return f"[{head}{more}]"
    return str(value)


_COMPOSITION_NAMES = {"pld": "PLD composition", "rdp": "RDP composition",
                      "basic": "basic composition"}


def format_privacy_report(summary: Mapping[str, Any]) -> str:
    """Human-readable privacy report of a federated run.

    Shows the release of one client per round (method, mechanism, clipping and bound, noise
    scale, sensitivity, per-round ε and δ; for FedNewsRec both the per-coordinate ε = 2δ/λ
    and the whole-update ε = 2δD/λ, stating that the latter is the guarantee), the per-user
    totals at the target δ (max and median under the composition used, and the
    basic-composition upper bound), how many users spent budget and their maximum number of
    releases, and every warning (ledger, consistency, uncovered parameters) first.
    """
    summary = _decode(to_json_safe({k: v for k, v in summary.items() if k != "ledger"},
                                   where="summary"))
    release: dict[str, Any] = summary["release"]
    report: dict[str, Any] = summary["report"]
    composition = summary.get("composition", report.get("composition", "pld"))
    delta = summary["delta"]
    lines: list[str] = []
    warnings = list(report.get("warnings", [])) + list(summary.get("checks", []))
    if release.get("simulated_serving"):
        warnings.insert(0, str(release["simulated_serving"]))
    uncovered = release.get("uncovered_parameters")
    if uncovered:
        lines += ["!" * 78,
                  f"!! WARNING: the gradients of {len(uncovered)} parameter group(s) are NOT "
                  f"covered by the DP guarantee",
                  "!! (PrivateRec paper mode, docs/privacy.md \"Paper and strict mode\"): the "
                  "epsilon below does not protect them:"]
        lines += [f"!!   {name}" for name in uncovered]
        lines += ["!" * 78, ""]
    if warnings:
        lines.append("WARNINGS:")
        lines += [f"  - {w}" for w in warnings]
        lines.append("")

    lines.append(f"Privacy report: method {release['method']}, {summary['rounds']} round(s) "
                 f"completed")
    if release.get("trust"):  # whose randomness the epsilon rests on, and against whom
        lines.append(f"Mode: {release['trust']}")
    if release.get("evaluation"):  # what the server evaluated on: a holdout, its split, none
        lines.append(f"Evaluation: {release['evaluation']}")
    federated = release.get("federated_evaluation")
    if federated:  # its releases are in the ledger; this is their share, composed alone
        lines.append(f"  federated evaluations run: {federated['evaluations']}; a user asked in "
                     f"every one spent epsilon = "
                     f"{_fmt(federated['epsilon_all_evaluations'])} on them (user-level, "
                     f"delta = {_fmt(federated['epsilon_delta'])}; included in the totals "
                     f"below)")
    adjacency = report.get("adjacency")
    if adjacency:
        lines.append("Adjacency: every epsilon below is stated for one of")
        lines.append(f"  click-level: {adjacency['click']}")
        lines.append(f"  user-level:  {adjacency['user']}")
    else:
        lines.append("Adjacency: this privacy.json predates per-adjacency totals; its totals "
                     "are for one click (see docs/privacy.md)")
    lines.append("")
    lines.append("Release of one client per round")
    rows: list[tuple[str, str]] = [("mechanism", str(release["mechanism"]))]
    if "clipping" in release:
        bound = release.get("clip_bound")
        rows.append(("clipping", f"{release['clipping']}"
                     + (f", bound {_fmt(bound)}" if bound is not None else "")))
    if "noise_scale" in release:
        from privaterec.privacy.noise import MECHANISMS  # torch: only where it is needed

        name = getattr(MECHANISMS.get(release["mechanism"]), "parameter", "b")
        rows.append((f"noise scale ({name})", _fmt(release["noise_scale"])))
    for key, label in (("sensitivity_l1", "sensitivity (L1)"),
                       ("sensitivity_l2", "sensitivity (L2)")):
        if release.get(key) is not None:
            rows.append((label, _fmt(release[key])))
    if release.get("dimension") is not None:
        rows.append(("dimension D", f"{release['dimension']} released coordinates"))
    if release.get("noised_parameters") is not None:
        rows.append(("noised parameters", _short(release["noised_parameters"])))
    if release.get("clients_per_round") is not None:
        frac = release.get("client_fraction")
        rows.append(("clients per round", f"{release['clients_per_round']}"
                     + (f" (fraction {_fmt(frac)})" if frac is not None else "")))
    fnr = fednewsrec_epsilons(release)
    if fnr is not None:
        d = release["dimension"]
        rows.append(("epsilon per round", f"{format_epsilon(fnr['update_epsilon'])}  = "
                     f"2*clip*D/lambda, whole update of D = {d}: THIS is the guarantee"))
        rows.append(("per-coordinate eps", f"{format_epsilon(fnr['coordinate_epsilon'])}  = "
                     f"2*clip/lambda (FedNewsRec sec. 3.3): one coordinate only, NOT a "
                     f"guarantee for the update"))
    else:
        rows.append(("epsilon per round", format_epsilon(release.get("epsilon_per_round"))
                     + (" (click-level)" if "epsilon_per_round_user" in release else "")))
        if "epsilon_per_round_user" in release:
            rows.append(("epsilon per round", format_epsilon(release["epsilon_per_round_user"])
                         + " (user-level)"))
        if release.get("coordinate_epsilon") is not None:
            rows.append(("per-coordinate eps", f"{format_epsilon(release['coordinate_epsilon'])}"
                         f"  (one coordinate only, NOT the guarantee)"))
    if release.get("delta_per_round") is not None:
        rows.append(("delta per round", _fmt(release["delta_per_round"])))
    extra: list[tuple[str, str]] = []
    for k, v in release.items():
        if k in _KNOWN_RELEASE_KEYS:
            continue
        if isinstance(v, dict):  # e.g. PrivateRec's dpa / dpl blocks, central DP's trust
            extra += _nested_rows(k, v)
        elif isinstance(v, (list, tuple)) and v and isinstance(v[0], dict):  # serving
            for i, item in enumerate(v):
                extra.append((f"{k} #{i + 1}", ", ".join(f"{a}={_fmt(b)}"
                                                         for a, b in item.items())))
        else:
            extra.append((k, _fmt(v)))
    lines += _table(rows + extra)

    lines.append("")
    comp_name = _COMPOSITION_NAMES.get(composition, composition)
    lines.append(f"Per-user totals over the run at target delta = {delta:g}, {comp_name}")
    recomposed = summary.get("recomposed_from")
    if recomposed:
        lines.append(f"  (recomposed from the stored ledger; training reported delta = "
                     f"{recomposed['delta']:g}, {recomposed['composition']})")
    phases = report["phases"]
    shown = [p for p in ("train", "serve") if phases.get(p, {}).get("num_users")]
    if len(shown) > 1 or not shown:
        shown.append("total")
    blocks = [("click-level", phases)]
    if report.get("phases_user"):
        blocks.append(("user-level", report["phases_user"]))
    for level, by_phase in blocks:
        for phase in shown:
            ph = by_phase[phase]
            label = f"[{level}] " if len(shown) == 1 else f"[{level}, {phase}] "
            rows = [(f"{label}total epsilon per user",
                     f"max {format_epsilon(ph['epsilon_max'])}, median "
                     f"{format_epsilon(ph['epsilon_median'])} ({composition})"),
                    (f"{label}basic composition bound",
                     f"max epsilon {format_epsilon(ph['basic_epsilon_max'])}, max delta "
                     f"{ph['basic_delta_max']:g} (sums over releases: an upper bound)")]
            if level == "click-level":
                rows = [(f"{label}users who spent budget", str(ph["num_users"])),
                        (f"{label}releases per user", f"max {ph['releases_max']}")] + rows
            lines += _table(rows)
    notes = report.get("notes", [])
    if notes:
        lines.append("")
        lines.append("Notes:")
        lines += [f"  - {n}" for n in notes]
    return "\n".join(lines)


def _table(rows: list[tuple[str, str]]) -> list[str]:
    width = max((len(k) for k, _ in rows), default=0)
    return [f"  {k:<{width}}  {v}" for k, v in rows]


# ---------------------------------------------------------------------------------------------
# Noise calibration (``privaterec privacy calibrate``)
# ---------------------------------------------------------------------------------------------

CALIBRATED = ("dpa",)
"""The releases ``privaterec privacy calibrate`` knows besides the noise mechanisms
(:mod:`privaterec.privacy.noise`)."""


def _require(value: float | None, name: str, mechanism: str, example: str) -> float:
    if value is None:
        raise ConfigError(f"missing privacy parameter '{name}': the {mechanism} mechanism "
                          f"needs it (CLI: --{name} {example})")
    return value


def _calibrate_mechanism(mechanism: str, *, epsilon: float, delta: float | None,
                         sensitivity: float | None) -> dict[str, Any]:
    """One release of a noise mechanism at (ε, δ): its scale for ε, from the mechanism."""
    from privaterec.privacy.noise import MECHANISMS  # torch: only where it is needed

    noise = MECHANISMS.get(mechanism)
    if noise is None:
        raise ConfigError(f"invalid mechanism {mechanism!r}; expected one of "
                          f"{', '.join(sorted((*MECHANISMS, *CALIBRATED)))}")
    s = _require(sensitivity, "sensitivity", noise.name,
                 f"S, the {noise.norm.upper()} sensitivity")
    d = 0.0 if noise.pure else _require(delta, "delta", noise.name, "1e-5")
    notes = [noise.note]
    if noise.pure and delta:
        notes.append(f"delta={delta:g} is ignored: the {noise.name} mechanism has delta = 0")
    return {"mechanism": noise.name, "epsilon": epsilon, "delta": d, "sensitivity": s,
            "sensitivity_norm": noise.norm, "noise_parameter": noise.parameter,
            "noise_scale": noise.scale(epsilon=epsilon, delta=d, sensitivity=s),
            "formula": noise.formula,
            "alternatives": noise.alternatives(epsilon=epsilon, delta=d, sensitivity=s),
            "notes": notes}


def _calibrate_dpa(*, epsilon: float, delta: float | None, sensitivity: float | None,
                   padding_p: float = 0.0, basis: int | None = None,
                   sensitivity_mode: SensitivityMode = "true") -> dict[str, Any]:
    """PrivateRec's attention release α (Alg. 2): padding-amplified budget, simplex sensitivity
    (:func:`~privaterec.privacy.dpa.dpa_calibration`).

    Laplace on the L1 sensitivity when δ is 0 or not given, analytic Gaussian on the L2
    sensitivity otherwise; the noise runs at ε′ = ln((e^ε − p)/(1 − p)), δ′ = δ/(1 − p).
    """
    from privaterec.privacy.dpa import dpa_calibration  # torch: only where it is needed

    if sensitivity is not None:
        raise ConfigError("the dpa mechanism fixes its sensitivity (the simplex: L1 2, L2 "
                          "sqrt(2)); drop --sensitivity (or use --sensitivity-mode paper)")
    if basis is None or not (isinstance(basis, int) and basis >= 2):
        raise ConfigError(f"invalid 'basis': got {basis!r}; the dpa mechanism needs the "
                          f"number B >= 2 of basic vectors (CLI: --basis 5)")
    eps_base, delta_base = amplified_budget(epsilon=epsilon, delta=delta or 0.0,
                                            padding_p=padding_p)
    calibration = dpa_calibration(epsilon=epsilon, delta=delta or 0.0, padding_p=padding_p,
                                  mechanism="gaussian" if delta else "laplace",
                                  sensitivity=sensitivity_mode, dimension=basis)
    noise = calibration.noise
    assert noise is not None and calibration.event.sensitivity is not None
    notes = [f"released: alpha, {basis} floats on the probability simplex (PrivateRec Alg. 2)",
             f"padding p = {padding_p:g}: base budget epsilon' = {eps_base:.6g}, "
             f"delta' = {delta_base:.6g} (docs/privacy.md#padding-amplification); adjacency: one item of "
             f"the fixed-length history substituted"]
    if sensitivity_mode == "paper":
        notes.append(PAPER_SENSITIVITY_WARNING)
    return {"mechanism": "dpa", "epsilon": epsilon, "delta": delta or 0.0,
            "sensitivity": calibration.event.sensitivity, "sensitivity_norm": noise.norm,
            "noise_parameter": noise.parameter, "noise_scale": calibration.scale,
            "formula": ("b = S / epsilon'" if noise.pure else
                        "analytic Gaussian at (epsilon', delta')"),
            "epsilon_base": eps_base, "delta_base": delta_base,
            "padding_p": padding_p, "basis": basis, "sensitivity_mode": sensitivity_mode,
            "valid": sensitivity_mode != "paper", "alternatives": [], "notes": notes}


def calibrate_noise(mechanism: str, *, epsilon: float, delta: float | None = None,
                    sensitivity: float | None = None, **options: Any) -> dict[str, Any]:
    """Noise scale of ``mechanism`` for one release at (ε, δ) and the given sensitivity.

    Parameters
    ----------
    mechanism:
        A noise mechanism of :mod:`privaterec.privacy.noise` (``"laplace"``: b = S/ε;
        ``"gaussian"``: analytic σ, with the classical σ for comparison), or ``"dpa"``
        (PrivateRec's attention release, options ``padding_p``, ``basis``,
        ``sensitivity_mode``).
    epsilon:
        Target ε > 0 (``math.inf``: no noise).
    delta:
        Target δ (required by ``"gaussian"``).
    sensitivity:
        L1 (Laplace) or L2 (Gaussian) sensitivity S.
    options:
        Mechanism-specific parameters, passed to the calibrator.

    Returns
    -------
    dict
        ``mechanism``, ``epsilon``, ``delta``, ``sensitivity``, ``sensitivity_norm``,
        ``noise_parameter``, ``noise_scale``, ``formula``, ``alternatives`` (other
        calibrations with ``valid``), ``notes``.
    """
    if mechanism == "dpa":
        return _calibrate_dpa(epsilon=epsilon, delta=delta, sensitivity=sensitivity, **options)
    return _calibrate_mechanism(mechanism, epsilon=epsilon, delta=delta,
                                sensitivity=sensitivity, **options)


def format_calibration(result: Mapping[str, Any]) -> str:
    """Human-readable form of :func:`calibrate_noise`'s result."""
    rows = [("mechanism", str(result["mechanism"])),
            ("epsilon", format_epsilon(result["epsilon"]))]
    if result["mechanism"] != "laplace":
        rows.append(("delta", f"{result['delta']:g}"))
    if result["mechanism"] == "dpa":
        rows.append(("base budget", f"epsilon' = {result['epsilon_base']:.6g}, "
                                    f"delta' = {result['delta_base']:.6g} "
                                    f"(padding p = {result['padding_p']:g})"))
    rows.append((f"sensitivity ({result['sensitivity_norm'].upper()})",
                 f"{result['sensitivity']:g}"))
    rows.append((f"noise scale {result['noise_parameter']}",
                 f"{result['noise_scale']:.6g}  ({result['formula']})"))
    for alt in result["alternatives"]:
        rows.append((alt["name"], f"{alt['value']:.6g}  ({alt['formula']}) -- {alt['remark']}"))
    lines = _table(rows)
    lines += [f"  note: {n}" for n in result["notes"]]
    return "\n".join(lines)
