"""Command-line interface: ``privaterec data|train|evaluate|privacy|experiment|demo``.

The only module that reads argv, environment variables and user-given paths. Every command
exits 0 on success, 1 when a check fails (``data check``), 2 on a user error (bad flag,
bad file, bad configuration) with a one-line message naming what to fix, 130 when
interrupted (Ctrl-C) and 141 when the reader of its output went away (``... | head``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from privaterec.version import __version__
from privaterec.config import (BASIS_ATTENTION_KINDS, FEDERATED_METHODS, METHODS, MODEL_PRESETS,
                               NOISE_KINDS, SENSITIVITY_MODES, FedConfig, ModelConfig, RunConfig,
                               TrainConfig, fed_with_changes, model_preset, replace)
from privaterec.data.synth import SYNTH_PRESETS
from privaterec.errors import PrivateRecError
from privaterec.ondevice.release import (NORMALIZATIONS, QUERY_MODES, SERVING_KINDS,
                                         SERVING_MODES, ServingConfig)
from privaterec.method_settings import CLIP_SPACES, SETTINGS, setting_flag, setting_flags
from privaterec.recall import RECALL_METHODS
from privaterec.recall.task import RECALL_STRATEGIES, RecallTrainConfig
from privaterec.runs.recall_setup import RecallModelConfig, RecallRunConfig

EXIT_OK, EXIT_CHECK_FAILED, EXIT_USAGE = 0, 1, 2


def basis_arg(text: str) -> int:
    """``--basis B``: an integer >= 2 (:data:`privaterec.config.BASIS_RULE`), never 0."""
    from privaterec.config import BASIS_RULE, MIN_BASIS

    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < MIN_BASIS:
        raise argparse.ArgumentTypeError(f"got {text!r}; {BASIS_RULE}. Omit --basis for the "
                                         f"default, 5")
    return value


def _positive_int(text: str) -> int:
    """An integer >= 1 (``--jobs``)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"got {text!r}, expected a positive integer")
    return value


def _print_json(payload: Any) -> None:
    print(json.dumps(payload, indent=2, sort_keys=True, default=str))


def _output(args: argparse.Namespace, payload: Any, text: Callable[[], str]) -> None:
    """``payload`` as JSON with ``--json``, else the text ``text()``."""
    if args.json:
        _print_json(payload)
    else:
        print(text())


def _metrics_table(rows: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """Markdown table of evaluation results (AUC, MRR, nDCG@5, nDCG@10, impressions)."""
    lines = ["| run | AUC | MRR | nDCG@5 | nDCG@10 | impressions |",
             "|---|---|---|---|---|---|"]
    for name, m in rows:
        lines.append(f"| {name} | {m['auc']:.4f} | {m['mrr']:.4f} | {m['ndcg@5']:.4f} | "
                     f"{m['ndcg@10']:.4f} | {m['impressions']} |")
    return "\n".join(lines)


def _basis_line(basis: dict[str, Any]) -> str:
    """One line of PrivateRec's collapse diagnostics (``metrics.json``'s ``basis``)."""
    top = max(range(len(basis["argmax_counts"])), key=lambda i: basis["argmax_counts"][i])
    line = (f"basis attention over {basis['users']} users: entropy "
            f"{basis['entropy_mean']:.3f} of ln B = {math.log(basis['basis_size']):.3f} nats, "
            f"{100 * basis['argmax_share']:.0f}% on basis vector {top}, spread "
            f"{basis['spread']:.3f}; |u| mean {basis['user_norm_mean']:.2f} (max "
            f"{basis['user_norm_max']:.2f}), |u~| mean {basis['scored_norm_mean']:.2f}")
    if basis["collapsed"]:
        line += ("\nWARNING: the basis attention has COLLAPSED: every user gets nearly the "
                 "same alpha, so the ranking is the same for everyone (docs/privaterec.md, "
                 "\"Collapse of the basis attention\"; train with the default "
                 "--basis-attention centered)")
    return line


# ----------------------------------------------------------------------------- data
def cmd_data_check(args: argparse.Namespace) -> int:
    from privaterec.data.stats import check_dataset, format_statistics
    from privaterec.errors import DataFormatError

    if not Path(args.path).exists():  # a wrong path is a user error (2), not invalid data (1)
        raise DataFormatError(args.path, None, "does not exist; pass a MIND data directory "
                                               "(news.tsv and behaviors.tsv, or train/ and "
                                               "test/)")
    valid, report = check_dataset(args.path, drop_missing=args.drop_missing)
    _output(args, report, lambda: format_statistics(report))
    return EXIT_OK if valid else EXIT_CHECK_FAILED


def cmd_data_synth(args: argparse.Namespace) -> int:
    from privaterec.data.synth import SynthConfig, format_synth_summary, write_synthetic

    overrides = {k: getattr(args, k) for k in ("users", "news", "topics", "days", "seed")
                 if getattr(args, k) is not None}
    preset = SYNTH_PRESETS[args.preset] if args.preset is not None else {}
    config = SynthConfig(**{**preset, **overrides})
    pool = None
    if args.news_from is not None:
        from privaterec.data.mind import read_news
        pool = read_news(args.news_from)
    summary = write_synthetic(args.out, config, news_pool=pool, overwrite=args.overwrite)
    _output(args, summary, lambda: format_synth_summary(summary))
    return EXIT_OK


def cmd_data_convert(args: argparse.Namespace) -> int:
    from privaterec.data.ebnerd import convert_ebnerd

    report = convert_ebnerd(args.src, args.out, articles=args.articles,
                            test_days=args.test_days or None, max_history=args.max_history,
                            overwrite=args.overwrite)
    _print_json(report)
    return EXIT_OK


def cmd_data_public_dir(args: argparse.Namespace) -> int:
    from privaterec.data.roster import ROSTER_FILE, write_public_dir

    users = write_public_dir(args.data, args.out)
    summary = {"out": str(args.out), "news": "news.tsv", "roster": ROSTER_FILE,
               "users": len(users)}
    _output(args, summary, lambda: (
        f"wrote {args.out}: news.tsv (the public catalogue) and {ROSTER_FILE} "
        f"({len(users)} enrolled user ids); start the Flower server with "
        f"--run-config \"public-dir='{Path(args.out).resolve()}'\""))
    return EXIT_OK


def cmd_data_device_dirs(args: argparse.Namespace) -> int:
    from privaterec.data.roster import write_device_dirs

    dirs = write_device_dirs(args.data, args.out)
    first = next(iter(dirs), "U1")
    _output(args, {"out": str(args.out), "users": len(dirs)}, lambda: (
        f"wrote {args.out}: one data directory per user ({len(dirs)}), each with that "
        f"user's impressions only; start each user's SuperNode with --node-config "
        f"\"user-id='{first}' data-dir='{Path(args.out).resolve() / first}'\""))
    return EXIT_OK


# ---------------------------------------------------------------------------- train
def _given(args: argparse.Namespace, *kinds: type[Any], by_flag: bool = False,
           **more: Any) -> dict[str, Any]:
    """The settings of the dataclasses ``kinds`` that their generated flags give
    (:func:`_add_flags`), and ``more``, by configuration key; unset ones left out."""
    given = {flag.dest: getattr(args, _dest(flag, by_flag)) for flag in setting_flags(kinds)}
    return {k: v for k, v in {**given, **more}.items() if v is not None}


def run_config_from_args(args: argparse.Namespace) -> RunConfig:
    """The run configuration: ``--config`` YAML (if any) overridden by explicit flags."""
    config = RunConfig.from_yaml(args.config) if args.config else RunConfig()
    if args.preset is not None:  # on top of --config; the flags below override it
        config = replace(config, model=model_preset(args.preset, config.model))
    model_changes = _given(args, ModelConfig, basis_size=args.basis,
                           basis_attention=args.basis_attention, basis_scale=args.basis_scale)
    train_changes = _given(args, TrainConfig, method=args.method)
    fed_changes = _given(args, FedConfig, *SETTINGS.values())  # the engine's, the methods'
    data = str(Path(args.data).resolve()) if args.data else config.data
    if not data:
        raise PrivateRecError("no training data: pass --data DIR (or 'data:' in --config)")
    method = train_changes.get("method", config.train.method)
    if fed_changes and method not in FEDERATED_METHODS:
        flags = ", ".join(setting_flag(k) for k in sorted(fed_changes))
        raise PrivateRecError(f"{flags} only apply to federated methods "
                              f"({', '.join(FEDERATED_METHODS)}), not --method {method}")
    # A flag of a method's own settings that the method does not have is refused, naming
    # the flags it has (privaterec.config.fed_with_changes).
    fed = (fed_with_changes(config.fed, method, fed_changes, name=setting_flag)
           if method in FEDERATED_METHODS else config.fed)
    return replace(config, data=data, model=replace(config.model, **model_changes),
                   train=replace(config.train, **train_changes), fed=fed)


# Flags of the ranking training that recall training does not read (a ranking method's
# settings are refused by Uni-FedRec's settings, naming the flags it has).
_RECALL_IGNORED = ("news_encoder", "preset", "user_encoder", "embeddings", "word_dim",
                   "history_len", "epochs", "lr", "batch_size", "local_steps", "local_lr",
                   "eval_every", "basis", "basis_attention", "basis_scale")


def recall_config_from_args(args: argparse.Namespace) -> RecallRunConfig:
    """``--method unifedrec``: the Uni-FedRec run configuration (``--config`` = a
    ``recall.yaml``) overridden by explicit flags."""
    given = [k for k in _RECALL_IGNORED if getattr(args, k, None) is not None]
    if given:
        flags = ", ".join(setting_flag(k, (ModelConfig, TrainConfig, FedConfig)) for k in given)
        raise PrivateRecError(f"{flags} do not apply to --method unifedrec (its ranking model "
                              f"is trained by another method and passed with --ranker RUN)")
    if args.strategy is not None and args.strategy not in RECALL_STRATEGIES:
        raise PrivateRecError(f"--strategy {args.strategy}: --method unifedrec takes "
                              f"{' or '.join(RECALL_STRATEGIES)}")
    config = (RecallRunConfig.from_yaml(Path(args.config)) if args.config
              else RecallRunConfig(ranker=args.ranker or "-"))
    top = {k: v for k, v in {
        "ranker": str(Path(args.ranker).resolve()) if args.ranker else None,
        "data": str(Path(args.data).resolve()) if args.data else None,
        "seed": args.seed}.items() if v is not None}
    if not args.ranker and not args.config:
        raise PrivateRecError("--method unifedrec needs --ranker RUN: a ranking run trained by "
                              "another method (e.g. --method fedrec)")
    model = _given(args, RecallModelConfig, by_flag=True)
    train = _given(args, RecallTrainConfig, by_flag=True)
    fed = _given(args, FedConfig, *SETTINGS.values())
    return replace(config, **top, model=replace(config.model, **model),
                   fed=fed_with_changes(config.fed, "unifedrec", fed, name=setting_flag),
                   train=replace(config.train, **train))


def cmd_train_unifedrec(args: argparse.Namespace) -> int:
    from privaterec.runs.recall import train_recall_run

    config = recall_config_from_args(args)
    metrics = train_recall_run(config, args.out, progress=not args.no_progress,
                               drop_missing=args.drop_missing)
    _output(args, metrics, lambda: (
        f"Uni-FedRec recall model: {metrics['rounds']} rounds, loss "
        f"{metrics['first_loss']:.4f} -> {metrics['last_loss']:.4f}, training epsilon "
        f"per round {metrics['train_epsilon_per_round']}, serving epsilon per channel "
        f"{config.model.channel_epsilon:g} (quotas in the clear)"))
    print(f"run written to {args.out}; evaluate with `privaterec evaluate --run {args.out} "
          f"--recall unifedrec`", file=sys.stderr)
    return EXIT_OK


def cmd_train(args: argparse.Namespace) -> int:
    from privaterec.runs.ranking import train_run

    if args.method == "unifedrec":
        return cmd_train_unifedrec(args)
    if args.ranker is not None:
        raise PrivateRecError("--ranker only applies to --method unifedrec")
    config = run_config_from_args(args)
    _warn_paper_mode(config)
    metrics = train_run(config, args.out, drop_missing=args.drop_missing,
                        progress=not args.no_progress)
    test = metrics.get("test")
    if args.json:
        _print_json(metrics)
    elif test:
        print(_metrics_table([(f"{config.train.method}/{config.model.news_encoder}", test)]))
        if "basis" in metrics:
            print(_basis_line(metrics["basis"]))
    if not args.json and metrics.get("test_federated"):
        found = metrics["test_federated"]
        print("federated evaluation (accounted in privacy.json; +- the noise's std): "
              + ", ".join(f"{name} {found[name]:.4f} +- {found['std'][name]:.4f}"
                          for name in ("auc", "mrr", "ndcg@5", "ndcg@10"))
              + f" ({found['devices']} devices)")
    print(f"run written to {args.out}", file=sys.stderr)
    return EXIT_OK


def _warn_paper_mode(config: RunConfig) -> None:
    """PrivateRec's paper mode, asked for: say at train time that its ε is no guarantee."""
    settings = config.fed.settings
    if config.train.method == "privaterec" and getattr(settings, "privacy_mode", "") == "paper":
        print("WARNING: --privacy-mode paper trains PrivateRec as published (Alg. 3): the "
              "history-path gradient is uploaded without noise, so the run's epsilon is NOT "
              "a guarantee (user-level epsilon = inf; docs/privacy.md#paper-and-strict-mode). "
              "Use it to reproduce the published tables only; the default, strict, covers "
              "that gradient", file=sys.stderr)


def _serving_config(args: argparse.Namespace, kind: str) -> ServingConfig:
    """The ``ServingConfig`` of mode ``kind`` with evaluate's serving flags."""
    return ServingConfig(kind=kind, epsilon=args.epsilon_serve, delta=args.delta_serve,
                         padding_p=args.padding_p, mechanism=args.noise,
                         sensitivity_mode=args.sensitivity_mode, vdp_clip=args.vdp_clip,
                         seed=args.seed, normalization=args.normalization)


def cmd_evaluate(args: argparse.Namespace) -> int:
    from privaterec.runs.ranking import evaluate_run

    serving = None
    if args.serving is not None:
        serving = _serving_config(args, args.serving)
    elif args.epsilon_serve != math.inf and args.recall not in QUERY_MODES:
        modes = "|".join(QUERY_MODES)
        raise PrivateRecError(f"--epsilon-serve needs --serving {modes} or --recall {modes}")
    if args.recall is not None:
        return cmd_evaluate_recall(args, serving)
    result = evaluate_run(args.run, args.data, split=args.split,
                          drop_missing=args.drop_missing, progress=not args.no_progress,
                          serving=serving)
    if args.json:
        _print_json(result)
        return EXIT_OK
    label = str(args.run) if serving is None else f"{args.run} [{serving.kind} serving]"
    print(_metrics_table([(label, result)]))
    if "basis" in result:
        print(_basis_line(result["basis"]))
    if serving is not None and serving.mode.on_device:
        info = result["serving"]
        print(f"local ranking: epsilon_s = 0 ({info['queries']} queries of {info['users']} "
              f"users, 0 bytes sent per query; the device downloads the pool of "
              f"{info['pool_news']} news once: {info['bytes_downloaded']} bytes in float32, "
              f"{info['bytes_downloaded_float16']} in float16); SIMULATED queries recorded "
              f"in {info['record']} (not in the run's privacy.json)")
    elif serving is not None:
        info = result["serving"]
        print(f"serving {serving.kind} at epsilon_s = {serving.epsilon:g} per query "
              f"({info['queries']} queries of {info['users']} users, {info['bytes_per_query']} "
              f"bytes sent per query); SIMULATED releases recorded in {info['record']} (not "
              f"in the run's privacy.json), per-user serving epsilon (max) = "
              f"{info['epsilon_serve_user_max']:.6g} at delta = {info['privacy_delta']:g}")
    return EXIT_OK


def cmd_evaluate_recall(args: argparse.Namespace, serving: Any) -> int:
    from privaterec.runs.recall import evaluate_recall_run

    if args.recall in QUERY_MODES:
        if serving is not None and serving.kind != args.recall:
            raise PrivateRecError(f"--serving {serving.kind} contradicts --recall {args.recall}")
        serving = _serving_config(args, args.recall)
    elif serving is not None:
        raise PrivateRecError(f"--serving does not apply to --recall {args.recall}")
    result = evaluate_recall_run(args.run, method=args.recall, data=args.data, split=args.split,
                                 seed=args.seed, serve_noise=not args.no_serve_noise,
                                 quota_noise_scale=args.quota_noise,
                                 interest_noise=args.interest_noise_serve, serving=serving,
                                 drop_missing=args.drop_missing,
                                 progress=not args.no_progress)
    if args.json:
        _print_json(result)
        return EXIT_OK
    ks = sorted(int(k.split("@")[1]) for k in result if k.startswith("future_recall@"))
    lines = ["| recall | " + " | ".join(f"R@{k}" for k in ks) + " | AUC (R=400) |",
             "|---|" + "---|" * (len(ks) + 1)]
    for what, auc in (("future", f"{result['auc']:.4f}"), ("history (leakage)", "")):
        key = what.split()[0]
        cells = " | ".join(f"{result[f'{key}_recall@{k}']:.4f}" for k in ks)
        lines.append(f"| {what} clicks | {cells} | {auc} |")
    print("\n".join(lines))
    eps = result["query_epsilon_max"]
    print(f"{args.recall}: {result['users']} users queried a pool of {result['pool_size']} "
          f"news; {result['bytes_per_query']:.0f} bytes sent per query (mean); epsilon per "
          f"query {eps:g}"
          + (" + quotas sent in the clear (no guarantee)" if result["quotas_in_clear"] else ""))
    return EXIT_OK


# The flags of `experiment central-dp` only, by run_central_dp's keyword each one sets.
_CENTRAL_DP_FLAGS = {"users": "--users", "ldp_users": "--ldp-users",
                     "epsilons": "--epsilons", "client_fraction": "--client-fraction",
                     "rounds": "--rounds", "report_only": "--report-only",
                     "clip_spaces": "--clip-space", "privaterec_bases": "--privaterec-basis"}


def cmd_experiment(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.name != "central-dp":
        given = [flag for name, flag in _CENTRAL_DP_FLAGS.items()
                 if getattr(args, name) not in (None, False)]
        if given:
            raise PrivateRecError(f"{', '.join(given)} apply to 'experiment central-dp' only")
    if args.name == "central-dp":
        from privaterec.experiments.central_dp import run_central_dp

        result = run_central_dp(out, data=args.data, models=args.models, seeds=args.seeds,
                                quick=args.quick, progress=not args.no_progress,
                                **{name: getattr(args, name) for name in _CENTRAL_DP_FLAGS})
    elif args.name == "unifedrec":
        from privaterec.experiments.unifedrec import run_unifedrec

        if args.models:
            raise PrivateRecError("experiment unifedrec uses NRMS rankers; drop --models")
        result = run_unifedrec(out, data=args.data, seeds=args.seeds, quick=args.quick,
                               progress=not args.no_progress)
    elif args.name == "tradeoff":
        from privaterec.experiments.tradeoff import run_tradeoff

        if args.models and len(args.models) != 1:
            raise PrivateRecError("experiment tradeoff takes one --models value")
        result = run_tradeoff(out, data=args.data, model=(args.models or ["nrms"])[0],
                              seeds=args.seeds, quick=args.quick, progress=not args.no_progress)
    else:
        from privaterec.experiments.paper import run_table1, run_table2

        run = run_table1 if args.name == "table1" else run_table2
        models = args.models or (["nrms"] if args.quick else ["nrms", "naml", "plm"])
        result = run(out, data=args.data, models=models, seeds=args.seeds, quick=args.quick,
                     progress=not args.no_progress)
    print(result["table"])
    print(f"results written to {out}", file=sys.stderr)
    return EXIT_OK


def default_demo_root() -> Path:
    """Where ``privaterec demo`` works without ``--out``: ``$XDG_CACHE_HOME/privaterec/demo``
    (``~/.cache/privaterec/demo`` when unset)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "privaterec" / "demo"


def cmd_demo(args: argparse.Namespace) -> int:
    from privaterec.experiments.demo import default_jobs, run_demo
    from privaterec.experiments.demo_summary import MAIN_HEADER, MAIN_SEPARATOR, format_main_row

    root = Path(args.out) if args.out is not None else default_demo_root()
    print(MAIN_HEADER, MAIN_SEPARATOR, sep="\n", flush=True)  # rows follow as they are done
    result = run_demo(root, quick=args.quick, progress=not args.no_progress, jobs=args.jobs or default_jobs(),
                      on_row=lambda row: print(format_main_row(row), flush=True))
    print(result.text_after_table())
    return EXIT_OK


# --- privacy ----------------------------------------------------------------------------
def cmd_privacy_report(args: argparse.Namespace) -> int:
    from privaterec.privacy.report import (format_privacy_report, read_privacy_json,
                                           recompose_privacy_summary, to_json_safe)

    _explain_missing_privacy_json(Path(args.run))
    summary = read_privacy_json(Path(args.run))
    summary = recompose_privacy_summary(summary, delta=args.delta, composition=args.composition)
    if args.json:
        payload = to_json_safe({k: v for k, v in summary.items() if k != "ledger"})
        print(json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False))
    else:
        print(format_privacy_report(summary))
    return EXIT_OK


def _explain_missing_privacy_json(run: Path) -> None:
    """A run directory without ``privacy.json``: say why, from its ``config.yaml``.

    A federated run writes ``privacy.json`` at its first checkpoint, so before that there is
    no report yet (an unfinished privaterec run is not a centralized one).
    """
    from privaterec.config import FEDERATED_METHODS
    from privaterec.errors import CheckpointError
    from privaterec.runs.directory import RunDirectory

    directory = RunDirectory(run)
    if not run.is_dir() or directory.privacy_path.exists() or not directory.config_path.exists():
        return  # read_privacy_json names the problem
    method = directory.config().train.method
    if method in FEDERATED_METHODS:
        raise CheckpointError(f"{run}: no round of this {method} run has been checkpointed "
                              f"yet, so it has no privacy report; it is written with the first "
                              f"checkpoint. Resume training with 'privaterec train --out {run}' "
                              f"and the same options")
    raise CheckpointError(f"{run}: a {method} run has no privacy report: its training data "
                          f"are collected centrally, so there is no privacy guarantee "
                          f"(epsilon = inf). Private serving (evaluate --serving) adds one")


def cmd_privacy_calibrate(args: argparse.Namespace) -> int:
    from privaterec.privacy.report import calibrate_noise, format_calibration, to_json_safe

    options = {}
    if args.mechanism == "dpa":
        options = {"padding_p": args.padding_p, "basis": args.basis,
                   "sensitivity_mode": args.sensitivity_mode}
    elif args.basis is not None or args.padding_p != 0.0:
        raise PrivateRecError("--padding-p and --basis apply to --mechanism dpa only")
    result = calibrate_noise(args.mechanism, epsilon=args.epsilon, delta=args.delta,
                             sensitivity=args.sensitivity, **options)
    if args.json:
        print(json.dumps(to_json_safe(result), indent=2, sort_keys=True, ensure_ascii=False))
    else:
        print(format_calibration(result))
    return EXIT_OK


def _add_privacy_parser(sub: Any) -> None:
    """``privaterec privacy report|calibrate``."""
    from privaterec.privacy.report import CALIBRATED, COMPOSITIONS

    privacy = sub.add_parser("privacy", help="privacy reports of runs, noise calibration")
    privacy_sub = privacy.add_subparsers(dest="privacy_command", required=True)
    report = privacy_sub.add_parser(
        "report", help="the privacy report of a federated run (RUN/privacy.json)")
    report.add_argument("--run", required=True, help="run directory of a federated training")
    report.add_argument("--delta", type=float, default=None,
                        help="target delta of the per-user totals (default: the run's)")
    report.add_argument("--composition", choices=COMPOSITIONS, default=None,
                        help="composition of each user's releases (default: the run's)")
    report.add_argument("--json", action="store_true",
                        help="print the summary as JSON (the raw ledger stays in privacy.json)")
    report.set_defaults(func=cmd_privacy_report)

    calibrate = privacy_sub.add_parser(
        "calibrate", help="noise scale of a mechanism for a target epsilon (and delta)")
    calibrate.add_argument("--mechanism", required=True,
                           choices=sorted((*NOISE_KINDS, *CALIBRATED)))
    calibrate.add_argument("--epsilon", type=float, required=True, help="target epsilon > 0")
    calibrate.add_argument("--delta", type=float, default=None,
                           help="target delta (required by gaussian)")
    calibrate.add_argument("--sensitivity", type=float, default=None,
                           help="L1 (laplace) or L2 (gaussian) sensitivity of one release")
    calibrate.add_argument("--padding-p", type=float, default=0.0,
                           help="dpa: behaviour padding probability p (PrivateRec Alg. 2)")
    calibrate.add_argument("--basis", type=basis_arg, default=None,
                           help="dpa: number B >= 2 of basic vectors (the released alpha's "
                                "size)")
    calibrate.add_argument("--sensitivity-mode", choices=SENSITIVITY_MODES, default="true",
                           help="dpa: the simplex's true sensitivity (default) or the paper's "
                                "S = 1, which is NOT a valid guarantee")
    calibrate.add_argument("--json", action="store_true", help="print the result as JSON")
    calibrate.set_defaults(func=cmd_privacy_calibrate)

    from privaterec.apps.audit_cli import add_audit_parser

    add_audit_parser(privacy_sub)


# ----------------------------------------------------------------------------- main
def cmd_serve(args: argparse.Namespace) -> int:
    from privaterec.serving.server import serve

    serve(args.run, args.news, host=args.host, port=args.port, store_path=args.store,
          max_body_bytes=args.max_body_bytes, log_level=args.log_level,
          write_token_file=args.write_token_file, no_ingest=args.no_ingest)
    return EXIT_OK


def _add_serve_parser(sub: Any) -> None:
    # literals, not privaterec.serving.server's constants: building the parser must not
    # import FastAPI (the optional 'serve' extra)
    DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8000
    serve = sub.add_parser("serve", help="serve private recommendations over HTTP (FastAPI)")
    serve.add_argument("--run", required=True,
                       help="a ranking run or a Uni-FedRec run directory")
    serve.add_argument("--news", default=None,
                       help="news.tsv or a MIND data directory; its articles missing from the "
                            "store are encoded and added (optional once the store is filled)")
    serve.add_argument("--host", default=DEFAULT_HOST, help=f"default {DEFAULT_HOST}")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    serve.add_argument("--store", default=None,
                       help="news store directory, kept across restarts (default "
                            "RUN/serving-store)")
    serve.add_argument("--max-body-bytes", type=int, default=1_000_000,
                       help="larger request bodies get 413 (default 1000000)")
    serve.add_argument("--write-token-file", default=None, metavar="PATH",
                       help="file (chmod 600) holding the bearer token that POST /v1/news "
                            "needs (else $PRIVATEREC_WRITE_TOKEN); one of this or --no-ingest "
                            "is required")
    serve.add_argument("--no-ingest", action="store_true",
                       help="disable the write API: serve the pool as it is (POST /v1/news "
                            "gets 403)")
    serve.add_argument("--log-level", default="warning",
                       choices=("critical", "error", "warning", "info", "debug"),
                       help="uvicorn log level (no access log is ever written)")
    serve.set_defaults(func=cmd_serve)


def _add_setting_flags(train: argparse.ArgumentParser, fed: Any) -> dict[str, Any]:
    """The flags of the engine's settings and of the methods' own, generated from their
    declaration (:func:`privaterec.method_settings.setting_flags`): a method's own flag goes
    into its group, the others into ``fed``. Returns the groups by method name."""
    groups = {m: train.add_argument_group(f"{kind.title} (--method {m})")
              for m, kind in SETTINGS.items()}  # a group without flags is not shown
    _add_flags(fed, setting_flags((FedConfig,)))
    for flag in setting_flags():
        _add_flags(groups[flag.methods[0]] if len(flag.methods) == 1 else fed, [flag])
    return groups


def _add_flags(group: Any, flags: Sequence[Any], *, by_flag: bool = False) -> None:
    """Add the generated ``flags`` (:class:`~privaterec.method_settings.SettingFlag`) to
    ``group``; each defaults to ``None``, so that ``--config``'s value stays unless given, and
    a bool is a ``--name``/``--no-name`` pair. ``by_flag``: each is stored under its flag's
    name (``--interest-clip``: ``interest_clip``), not its setting's (``clip``)."""
    for flag in flags:
        kind = ({"action": argparse.BooleanOptionalAction} if flag.type is bool
                else {"type": flag.type, "choices": flag.choices})
        group.add_argument(*flag.flags, dest=_dest(flag, by_flag), default=None, help=flag.help,
                           **kind)


def _dest(flag: Any, by_flag: bool) -> str:
    return flag.flags[0][2:].replace("-", "_") if by_flag else flag.dest


_DROP_MISSING_HELP = "drop references to news absent from news.tsv (and report them)"


def _add_device_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", metavar="DEVICE",
                        help="where models, rounds and evaluation run: auto (CUDA when "
                             "PyTorch sees a GPU, else the CPU), cpu, cuda or cuda:N "
                             "(default auto; docs/gpu.md)")


def build_parser() -> argparse.ArgumentParser:

    parser = argparse.ArgumentParser(
        prog="privaterec",
        description="Privacy-preserving federated news recommendation "
                    "(PrivateRec, Uni-FedRec, FedNewsRec).")
    parser.add_argument("--version", action="version", version=f"privaterec {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    data = sub.add_parser("data", help="make, validate and convert data sets (MIND format)")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    check = data_sub.add_parser("check", help="validate a MIND-format directory, print statistics")
    check.add_argument("path", help="a directory with news.tsv/behaviors.tsv or train/ and test/")
    check.add_argument("--json", action="store_true", help="print JSON")
    check.add_argument("--drop-missing", action="store_true", help=_DROP_MISSING_HELP)
    check.set_defaults(func=cmd_data_check)

    from privaterec.data.synth import SYNTH_FLAG_HELP

    synth = data_sub.add_parser("synth", help="write a synthetic MIND-like data set")
    synth.add_argument("--out", required=True, help="output directory (gets train/ and test/)")
    for name, text in SYNTH_FLAG_HELP.items():  # None: the generator's default (in the help)
        synth.add_argument(f"--{name}", type=int, default=None, help=text)
    synth.add_argument("--preset", choices=sorted(SYNTH_PRESETS), default=None,
                       help="a named population: mind-small = 50,000 users and 51,000 news "
                            "(MIND-small's size; 68 s of CPU time and 210 MB peak, written as it "
                            "is simulated; BENCHMARKS.md); --users etc. override it (default: "
                            "none)")
    synth.add_argument("--news-from", default=None,
                       help="a news.tsv whose real news form the pool, clicked by simulated "
                            "users (default: synthetic news)")
    synth.add_argument("--json", action="store_true",
                       help="print the summary as JSON (default: a text summary)")
    synth.add_argument("--overwrite", action="store_true",
                       help="replace the data set in a non-empty output directory (default: "
                            "refuse it)")
    synth.set_defaults(func=cmd_data_synth)

    convert = data_sub.add_parser("convert", help="convert another format to MIND format")
    convert.add_argument("--from", dest="source_format", required=True, choices=["ebnerd"])
    convert.add_argument("src", help="EB-NeRD split directory (behaviors.parquet, history.parquet)")
    convert.add_argument("--out", required=True)
    convert.add_argument("--articles", default=None, help="EB-NeRD articles.parquet (optional)")
    convert.add_argument("--test-days", type=int, default=1,
                         help="the last N days become test/ (0: one split only)")
    convert.add_argument("--max-history", type=int, default=50,
                         help="keep each user's last N history clicks (default 50)")
    convert.add_argument("--overwrite", action="store_true",
                         help="write into a non-empty output directory")
    convert.set_defaults(func=cmd_data_convert)

    public_dir = data_sub.add_parser(
        "public-dir", help="write a deployed Flower server's public directory: the news "
                           "catalogue and the roster of enrolled user ids, no user data")
    public_dir.add_argument("data", help="the data set whose train split's news.tsv is the "
                                         "catalogue and whose users are enrolled")
    public_dir.add_argument("--out", required=True,
                            help="the directory to write news.tsv and roster.txt into")
    public_dir.add_argument("--json", action="store_true", help="print JSON")
    public_dir.set_defaults(func=cmd_data_public_dir)

    device_dirs = data_sub.add_parser(
        "device-dirs", help="write one device data directory per user (that user's "
                            "impressions only), to rehearse a Flower deployment on one "
                            "machine")
    device_dirs.add_argument("data", help="the data set to split by user")
    device_dirs.add_argument("--out", required=True,
                             help="a new directory to write <user id>/train (and test)/ into")
    device_dirs.add_argument("--json", action="store_true", help="print JSON")
    device_dirs.set_defaults(func=cmd_data_device_dirs)

    train = sub.add_parser("train", help="train a recommender into a run directory")
    # None defaults keep --config values unless a flag is given; the help shows the built-in
    # default, read from the configuration dataclasses so that it stays true
    train_defaults = TrainConfig()
    train.add_argument("--data", help="data directory (train/ and test/)")
    train.add_argument("--method", choices=(*METHODS, *(m for m in SETTINGS if m not in METHODS)),
                       default=None,
                       help=f"training method (default {train_defaults.method})")
    _add_flags(train, setting_flags((ModelConfig, TrainConfig)))
    train.add_argument("--preset", choices=sorted(MODEL_PRESETS), default=None,
                       help="a named model size: nrms-published = NRMS at its published "
                            "size (300-d corpus word vectors, 20 heads x 20, additive "
                            "attention 200, titles of 30 words; about 1.0M trained "
                            "parameters); other model flags override it (default: none)")
    fed = train.add_argument_group(
        f"federated training ({', '.join(FEDERATED_METHODS)}; unset = the method's default; a "
        f"flag that is not a setting of the method is refused)")
    groups = _add_setting_flags(train, fed)
    private = groups["privaterec"]
    private.add_argument("--basis", type=basis_arg, default=None,
                         help="B basic vectors, an integer >= 2 (default 5)")
    private.add_argument("--basis-attention", choices=BASIS_ATTENTION_KINDS, default=None,
                         help="alpha from u: centered (default), softmax(s*cos(u - c, b_i)) "
                              "with c the user vector of a reference history of public news; "
                              "dot, softmax(u.b/sqrt(d)) as published (collapses; "
                              "docs/privaterec.md)")
    private.add_argument("--basis-scale", type=float, default=None,
                         help="s of centered attention (default 5.0)")
    recall = groups["unifedrec"]
    recall.description = ("also --rounds --client-fraction --clients-per-round --strategy "
                          "sgd|fedadam --server-lr --clip --noise-scale --max-client-samples "
                          "--seed --data")
    recall.add_argument("--ranker", default=None,
                        help="ranking run (trained by another method) whose news encoder "
                             "gives the news vectors and whose model ranks the candidates")
    _add_flags(recall, setting_flags((RecallModelConfig, RecallTrainConfig)), by_flag=True)
    _add_device_flag(train)
    train.add_argument("--config", default=None, help="YAML run configuration; flags override it")
    train.add_argument("--out", required=True, help="run directory (resumed if it exists)")
    train.add_argument("--drop-missing", action="store_true",
                       help=f"{_DROP_MISSING_HELP} instead of refusing the data")
    train.add_argument("--no-progress", action="store_true", help="no progress bars")
    train.add_argument("--json", action="store_true",
                       help="print the run's metrics as JSON instead of a table")
    train.set_defaults(func=cmd_train)

    evaluate = sub.add_parser("evaluate", help="evaluate a run directory")
    evaluate.add_argument("--run", required=True, help="run directory written by train --out")
    evaluate.add_argument("--data", default=None, help="data directory (default: the run's)")
    evaluate.add_argument("--split", default="test", choices=["train", "test"],
                          help="split to evaluate on (default test)")
    evaluate.add_argument("--json", action="store_true",
                          help="print the metrics as JSON instead of a table")
    evaluate.add_argument("--drop-missing", action="store_true", help=_DROP_MISSING_HELP)
    evaluate.add_argument("--no-progress", action="store_true", help="no progress bars")
    evaluate.add_argument("--serving", choices=SERVING_KINDS, default=None,
                          help="private serving: each test impression is a query (PrivateRec "
                               "Alg. 1) released under --epsilon-serve. " + "; ".join(
                                   f"{m.name}: {m.help}" for m in SERVING_MODES.values()))
    evaluate.add_argument("--epsilon-serve", type=float, default=math.inf,
                          help="epsilon_s per query (default inf: no noise)")
    evaluate.add_argument("--delta-serve", type=float, default=0.0,
                          help="delta_s (Gaussian only)")
    evaluate.add_argument("--padding-p", type=float, default=0.5,
                          help="PrivateRec serving padding probability p")
    evaluate.add_argument("--noise", choices=NOISE_KINDS, default="laplace",
                          help="serving noise: laplace (default) or gaussian (needs "
                               "--delta-serve)")
    evaluate.add_argument("--sensitivity-mode", choices=SENSITIVITY_MODES, default="true",
                          help="PrivateRec serving: true simplex sensitivity (default) or "
                               "the paper's (not a guarantee)")
    evaluate.add_argument("--vdp-clip", type=float, default=0.001,
                          help="VDP clipping norm theta of the user vector")
    evaluate.add_argument("--seed", type=int, default=0, help="seed of the simulated devices")
    evaluate.add_argument("--normalization", choices=NORMALIZATIONS, default="softplus",
                          help="how the device maps alpha + noise to the simplex: softplus "
                               "(Alg. 2 line 10), relu (the training normalisation) or "
                               "simplex (Euclidean projection); post-processing, no extra ε")
    evaluate.add_argument("--recall", choices=RECALL_METHODS, default=None,
                          help="recall evaluation (Uni-FedRec Tables 2-4): R@100..400 of "
                               "future and history clicks and the AUC of ranking R = 400 "
                               "recalled candidates")
    evaluate.add_argument("--quota-noise", type=float, default=None,
                          help="--recall unifedrec: Laplace scale of noise on the quotas "
                               "(default: quotas in the clear, as the paper)")
    evaluate.add_argument("--interest-noise", dest="interest_noise_serve", type=float,
                          default=None,
                          help="--recall unifedrec: serve with this lambda_I instead of the "
                               "run's (epsilon per channel = 2*delta*B/lambda_I)")
    evaluate.add_argument("--no-serve-noise", action="store_true",
                          help="--recall unifedrec: no noise on the released scores (ablation)")
    _add_device_flag(evaluate)
    evaluate.set_defaults(func=cmd_evaluate)

    experiment = sub.add_parser(
        "experiment", help="paper experiments: PrivateRec table1 (training), table2 "
                           "(serving), tradeoff (figures 4-7); Uni-FedRec unifedrec (tables "
                           "2-4, figure 5); central-dp (central against local DP at several "
                           "population sizes); markdown, CSV and PNG")
    experiment.add_argument("name", choices=["table1", "table2", "tradeoff", "unifedrec",
                                             "central-dp"])
    experiment.add_argument("--out", default="experiments-out",
                            help="output directory (runs are cached there and reused)")
    experiment.add_argument("--data", default=None,
                            help="data directory (default: the embedded synthetic data)")
    experiment.add_argument("--models", nargs="+", default=None,
                            help="news encoders (tables: nrms naml plm; tradeoff: nrms; "
                                 "central-dp: nrms naml), each optionally with other word "
                                 "vectors: nrms+corpus (vectors fitted on the news texts)")
    experiment.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    experiment.add_argument("--quick", action="store_true",
                            help="small data, few rounds, nrms only: runs in minutes")
    experiment.add_argument("--no-progress", action="store_true", help="no progress bars")
    central = experiment.add_argument_group("central-dp only")
    central.add_argument("--users", nargs="+", type=int, default=None,
                         help="synthetic population sizes (default 2000 20000 50000; "
                              "--quick: 400); each is synthesised once under OUT/data")
    central.add_argument("--ldp-users", nargs="*", type=int, default=None,
                         help="sizes that also get the local-DP and PrivateRec rows "
                              "(default: the smallest; they need per-client gradients; "
                              "the flag alone: none)")
    central.add_argument("--epsilons", nargs="+", type=float, default=None,
                         help="user-level epsilon of the whole DP-FedAvg run (inf: FedRec; "
                              "default 1 2 4 8 inf, --quick: 1 8 inf)")
    central.add_argument("--client-fraction", type=float, default=None,
                         help="q (r) of every federated run (default 0.02)")
    central.add_argument("--rounds", type=int, default=None,
                         help="T of every federated run (default 300, --quick 20)")
    central.add_argument("--clip-space", dest="clip_spaces", nargs="+", choices=CLIP_SPACES,
                         default=None,
                         help="what the DP-FedAvg rows clip: parameters (the gradient, "
                              "default) and/or news_vectors (user-side gradient and "
                              "news-vector cotangents, a round about as fast as FedRec's); "
                              "one set of DP-FedAvg rows per value")
    central.add_argument("--privaterec-basis", dest="privaterec_bases", nargs="+", type=int,
                         default=None,
                         help="B of the PrivateRec rows trained by DP-FedAvg, one set of "
                              "rows per value (default 5; under central DP with local "
                              "ranking a larger B costs no epsilon)")
    central.add_argument("--report-only", action="store_true",
                         help="train and evaluate nothing: write the table from the runs "
                              "that have finished")
    _add_device_flag(experiment)
    experiment.set_defaults(func=cmd_experiment)

    demo = sub.add_parser("demo", help="synthesise data, train, evaluate, print a table")
    demo.add_argument("--out", default=None, help="where to keep data and runs "
                      "(default: ~/.cache/privaterec/demo)")
    demo.add_argument("--quick", action="store_true", help="smaller, for a smoke test")
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    demo.add_argument("--jobs", type=_positive_int, default=None,
                      help="worker processes, one training run each at a time (default: one "
                           "per core, at most 4; 1 runs everything in this process with "
                           "progress bars)")
    _add_device_flag(demo)
    demo.set_defaults(func=cmd_demo)

    _add_privacy_parser(sub)
    _add_serve_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``privaterec`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "device", None) is None:
            code = int(args.func(args))
        else:
            from privaterec.runtime.device import using_device

            with using_device(args.device):
                code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe fails here, inside the handler, not at exit
        return code
    except PrivateRecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to resume from the last checkpoint",
              file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _closed_pipe()


EXIT_BROKEN_PIPE = 141
"""Exit status when the reader of stdout went away (``... | head``): 128 + SIGPIPE, as a
process killed by the signal."""


def _closed_pipe() -> int:
    """stdout's reader closed the pipe: no traceback, and no second error when Python
    flushes stdout at exit (it is pointed at /dev/null)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file descriptor (e.g. captured)
        pass
    finally:
        os.close(devnull)
    return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
