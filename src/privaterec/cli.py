"""Command-line interface: ``privaterec data|train|evaluate|demo``.

The only module that reads argv, environment variables and user-given paths. Every command
exits 0 on success, 1 when a check fails (``data check``), 2 on a user error (bad flag,
bad file, bad configuration) with a one-line message naming what to fix.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from privaterec import __version__
from privaterec.config import (EMBEDDINGS, METHODS, NEWS_ENCODERS, USER_ENCODERS, ModelConfig,
                               RunConfig, TrainConfig, replace)
from privaterec.errors import PrivateRecError

EXIT_OK, EXIT_CHECK_FAILED, EXIT_USAGE = 0, 1, 2


def _print_json(payload: Any) -> None:
    print(json.dumps(payload, indent=2, sort_keys=True, default=str))


def _metrics_table(rows: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """Markdown table of evaluation results (AUC, MRR, nDCG@5, nDCG@10, impressions)."""
    lines = ["| run | AUC | MRR | nDCG@5 | nDCG@10 | impressions |",
             "|---|---|---|---|---|---|"]
    for name, m in rows:
        lines.append(f"| {name} | {m['auc']:.4f} | {m['mrr']:.4f} | {m['ndcg@5']:.4f} | "
                     f"{m['ndcg@10']:.4f} | {m['impressions']} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- data
def cmd_data_check(args: argparse.Namespace) -> int:
    from privaterec.data.stats import check_dataset, format_statistics

    valid, report = check_dataset(args.path, drop_missing=args.drop_missing)
    if args.json:
        _print_json(report)
    else:
        print(format_statistics(report))
    return EXIT_OK if valid else EXIT_CHECK_FAILED


def cmd_data_synth(args: argparse.Namespace) -> int:
    from privaterec.data.synth import SynthConfig, write_synthetic

    overrides = {k: getattr(args, k) for k in ("users", "news", "topics", "days", "seed")
                 if getattr(args, k) is not None}
    config = SynthConfig(**overrides)
    pool = None
    if args.news_from is not None:
        from privaterec.data.mind import read_news
        pool = read_news(args.news_from)
    summary = write_synthetic(args.out, config, news_pool=pool)
    if args.json:
        _print_json(summary)
    else:
        print("\n".join(f"{k}: {v}" for k, v in summary.items()))
    return EXIT_OK


def cmd_data_convert(args: argparse.Namespace) -> int:
    from privaterec.data.ebnerd import convert_ebnerd

    report = convert_ebnerd(args.src, args.out, articles=args.articles,
                            test_days=args.test_days or None, max_history=args.max_history,
                            overwrite=args.overwrite)
    _print_json(report)
    return EXIT_OK


# ---------------------------------------------------------------------------- train
def run_config_from_args(args: argparse.Namespace) -> RunConfig:
    """The run configuration: ``--config`` YAML (if any) overridden by explicit flags."""
    config = RunConfig.from_yaml(args.config) if args.config else RunConfig()
    model_changes = {k: v for k, v in {
        "news_encoder": args.model, "user_encoder": args.user_encoder,
        "embeddings": args.embeddings, "history_len": args.history_len,
    }.items() if v is not None}
    train_changes = {k: v for k, v in {
        "method": args.method, "epochs": args.epochs, "lr": args.lr,
        "batch_size": args.batch_size, "seed": args.seed,
    }.items() if v is not None}
    data = str(Path(args.data).resolve()) if args.data else config.data
    if not data:
        raise PrivateRecError("no training data: pass --data DIR (or 'data:' in --config)")
    return replace(config, data=data, model=replace(config.model, **model_changes),
                   train=replace(config.train, **train_changes))


def cmd_train(args: argparse.Namespace) -> int:
    from privaterec.training.pipeline import train_run

    config = run_config_from_args(args)
    metrics = train_run(config, args.out, drop_missing=args.drop_missing,
                        progress=not args.no_progress)
    test = metrics.get("test")
    if args.json:
        _print_json(metrics)
    elif test:
        print(_metrics_table([(f"{config.train.method}/{config.model.news_encoder}", test)]))
    print(f"run written to {args.out}", file=sys.stderr)
    return EXIT_OK


def cmd_evaluate(args: argparse.Namespace) -> int:
    from privaterec.training.pipeline import evaluate_run

    result = evaluate_run(args.run, args.data, split=args.split,
                          drop_missing=args.drop_missing, progress=not args.no_progress)
    if args.json:
        _print_json(result)
    else:
        print(_metrics_table([(str(args.run), result)]))
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from privaterec.experiments.demo import run_demo

    return run_demo(out=args.out, quick=args.quick, progress=not args.no_progress)


# ----------------------------------------------------------------------------- main
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
    check.add_argument("--drop-missing", action="store_true",
                       help="drop references to news absent from news.tsv (and report them)")
    check.set_defaults(func=cmd_data_check)

    synth = data_sub.add_parser("synth", help="write a synthetic MIND-like data set")
    synth.add_argument("--out", required=True, help="output directory (gets train/ and test/)")
    for name in ("users", "news", "topics", "days", "seed"):
        synth.add_argument(f"--{name}", type=int, default=None)
    synth.add_argument("--news-from", default=None,
                       help="a news.tsv whose real news form the pool (simulated clicks)")
    synth.add_argument("--json", action="store_true")
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

    train = sub.add_parser("train", help="train a recommender into a run directory")
    train.add_argument("--data", help="data directory (train/ and test/)")
    train.add_argument("--method", choices=METHODS, default=None)
    train.add_argument("--model", choices=NEWS_ENCODERS, default=None, help="news encoder")
    train.add_argument("--user-encoder", choices=USER_ENCODERS, default=None)
    train.add_argument("--embeddings", choices=EMBEDDINGS, default=None)
    train.add_argument("--history-len", type=int, default=None)
    train.add_argument("--epochs", type=int, default=None)
    train.add_argument("--lr", type=float, default=None)
    train.add_argument("--batch-size", type=int, default=None)
    train.add_argument("--seed", type=int, default=None)
    train.add_argument("--config", default=None, help="YAML run configuration; flags override it")
    train.add_argument("--out", required=True, help="run directory (resumed if it exists)")
    train.add_argument("--drop-missing", action="store_true")
    train.add_argument("--no-progress", action="store_true")
    train.add_argument("--json", action="store_true")
    train.set_defaults(func=cmd_train)

    evaluate = sub.add_parser("evaluate", help="evaluate a run directory")
    evaluate.add_argument("--run", required=True)
    evaluate.add_argument("--data", default=None, help="data directory (default: the run's)")
    evaluate.add_argument("--split", default="test", choices=["train", "test"])
    evaluate.add_argument("--json", action="store_true")
    evaluate.add_argument("--drop-missing", action="store_true")
    evaluate.add_argument("--no-progress", action="store_true")
    evaluate.set_defaults(func=cmd_evaluate)

    demo = sub.add_parser("demo", help="synthesise data, train, evaluate, print a table")
    demo.add_argument("--out", default=None, help="where to keep data and runs "
                      "(default: ~/.cache/privaterec/demo)")
    demo.add_argument("--quick", action="store_true", help="smaller, for a smoke test")
    demo.add_argument("--no-progress", action="store_true")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``privaterec`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except PrivateRecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to resume from the last checkpoint",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
