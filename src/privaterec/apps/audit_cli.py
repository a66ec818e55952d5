"""``privaterec privacy audit``: the end-to-end audit of a method's real client update
(:mod:`privaterec.audit`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from privaterec.audit import ADJACENCIES, METHODS, MODES
from privaterec.audit.canary import VIEWS
from privaterec.method_settings import NOISE_KINDS, NOISE_PLACEMENTS

EXIT_OK, EXIT_VIOLATED = 0, 1


def cmd_privacy_audit(args: argparse.Namespace) -> int:
    """Run the audit, print the table (or JSON); exit 1 if a lower bound exceeds its claim.
    With ``--run``: the one-run canary estimate of that run's training instead."""
    if args.run is not None:
        return _one_run(args)
    if not args.method or not args.adjacency or args.epsilon is None:
        from privaterec.errors import ConfigError

        raise ConfigError("privacy audit needs --method, --adjacency and --epsilon (or --run "
                          "RUN --canaries K for the one-run estimate of a training run)")
    from privaterec.audit import format_table, run_audit

    audits: list[Any] = []
    for method in args.method:
        modes = args.mode if method == "privaterec" else ["strict"]
        for mode in modes:
            for adjacency in args.adjacency:
                audits += run_audit(method, adjacency=adjacency, epsilon=args.epsilon,
                                    mode=mode, runs=args.runs, seed=args.seed,
                                    alpha=args.alpha, noise=args.noise)
    canaries = _canary_audits(args)
    audits += [c.audit for c in canaries]
    violated = [a for a in audits if a.violated]
    if args.json:
        from privaterec.privacy.report import to_json_safe

        print(json.dumps(to_json_safe([a.to_dict() for a in audits]), indent=2, sort_keys=True))
    else:
        print(format_table([a for a in audits if not a.pair.startswith("canary")]))
        if canaries:
            from privaterec.audit.canary import format_power

            print("\nWorst-case canaries (a client clipped to exactly C along a known "
                  "direction; likelihood-ratio test):\n")
            print(format_power(canaries))
        print(f"\n{len(violated)} of {len(audits)} audits found a lower bound above the "
              f"claimed epsilon" if violated else
              f"\nno lower bound above its claim ({len(audits)} audits; a bound below the "
              f"claim only says this test found no more leakage)")
    return EXIT_VIOLATED if violated else EXIT_OK


def _one_run(args: argparse.Namespace) -> int:
    """``--run RUN --canaries K``: train RUN's configuration again with K canary clients and
    print the one-run ε estimate next to the ledger's ε (always exit 0: an estimate, not a
    bound)."""
    from dataclasses import asdict

    from privaterec.audit.one_run import one_run_audit_of

    estimate = one_run_audit_of(args.run, canaries=args.canaries)
    if args.json:
        print(json.dumps(asdict(estimate), indent=2, sort_keys=True))
        return EXIT_OK
    print(f"one-run canary estimate of {args.run} (retrained with {estimate.canaries} "
          f"canary clients, T = {estimate.rounds}, q = {estimate.sampling_rate:g}, "
          f"z = {estimate.noise_multiplier:.4g}):\n"
          f"  mu = {estimate.mu:.3f}, empirical epsilon = {estimate.epsilon:.3f} at delta = "
          f"{estimate.delta:g}\n"
          f"  ledger epsilon = {estimate.ledger_epsilon:.3f} (replace-one; add/remove "
          f"{estimate.ledger_epsilon_add_remove:.3f})\n"
          f"an estimate from one run (no confidence bound): well below the ledger's epsilon "
          f"is expected; above it suggests less noise than accounted")
    return EXIT_OK


def _canary_audits(args: argparse.Namespace) -> list[Any]:
    """The worst-case canary audits (user-level) of the central-DP methods asked for (with
    ``--power``, each with its smallest noise cut caught)."""
    if args.canary_runs == 0 or "user" not in args.adjacency:
        return []
    if args.canary_view == "client-app":
        return _client_app_audits(args)
    from privaterec.audit.canary import CANARY_METHODS, run_canary_audit

    out: list[Any] = []
    for method in args.method:
        if method in CANARY_METHODS:
            out += run_canary_audit(method, epsilon=args.epsilon, runs=args.canary_runs,
                                    seed=args.seed, alpha=args.alpha, power=args.power,
                                    view=args.canary_view,
                                    noise_placement=args.noise_placement)
    return out


def _client_app_audits(args: argparse.Namespace) -> list[Any]:
    """``--canary-view client-app``: the canary games on what the Flower ClientApp's ``train``
    handler returns (:mod:`privaterec.audit.flower_reply`): dp-fedavg's reply through the
    aggregator's noise (``--power`` as for the simulator), dp-fedrec's reply itself (local
    DP; ``--canary-runs`` replies per side, default 320)."""
    from privaterec.audit.canary import POWER_FACTORS, CanaryAudit, audit_power
    from privaterec.audit.flower_reply import flower_canary_games, flower_game, play_flower

    out: list[Any] = []
    for method in args.method:
        if method == "dp-fedavg":
            out += [audit_power(game, runs=args.canary_runs or 200_000, seed=args.seed,
                                alpha=args.alpha, factors=POWER_FACTORS if args.power else ())
                    for game in flower_canary_games(epsilon=args.epsilon)]
        elif method == "dp-fedrec":
            reply_game = flower_game("dp-fedrec", epsilon=args.epsilon, noise=args.noise)
            out.append(CanaryAudit(play_flower(reply_game, runs=args.canary_runs or 320,
                                               seed=args.seed, alpha=args.alpha)))
    return out


def add_audit_parser(privacy_sub: Any) -> None:
    """Add ``audit`` to the ``privaterec privacy`` subcommands."""
    audit = privacy_sub.add_parser(
        "audit", help="end-to-end privacy audit of a method's real client update: a "
                      "distinguishing game on neighbouring clients, 95%% lower bound on "
                      "epsilon vs the claim (exit 1 if above)")
    audit.add_argument("--method", nargs="+", choices=METHODS,
                       help="method(s) whose client upload is audited")
    audit.add_argument("--mode", nargs="+", choices=MODES, default=["strict"],
                       help="privaterec: privacy mode(s) (default strict)")
    audit.add_argument("--adjacency", nargs="+", choices=ADJACENCIES,
                       help="click: one history click substituted or the clicks of one "
                            "impression changed; user: the user's whole data replaced")
    audit.add_argument("--epsilon", type=float,
                       help="per-round epsilon the method is configured with (fednewsrec: "
                            "lambda = 2*delta*D/epsilon; unifedrec: lambda_g = "
                            "2*theta/epsilon; fedrec claims inf; dp-fedavg, "
                            "dp-fedavg-adaptive, dp-fedavg-news: the round's user-level "
                            "epsilon at q = 1, what the aggregator releases from the user's "
                            "clipped update and, adaptive, its clip indicator; news: "
                            "clipped in news-vector space, --clip-space news_vectors)")
    audit.add_argument("--runs", type=int, default=1000,
                       help="uploads per neighbouring dataset (default 1000; half are "
                            "test runs, which cap the bound at about ln(runs/7.4))")
    audit.add_argument("--seed", type=int, default=0, help="seed of the runs' generators")
    audit.add_argument("--alpha", type=float, default=0.05,
                       help="the bound holds with probability 1 - alpha (default 0.05)")
    audit.add_argument("--noise", choices=NOISE_KINDS, default="laplace",
                       help="dp-fedrec, privaterec: noise mechanism (default laplace)")
    audit.add_argument("--canary-runs", type=int, default=None,
                       help="dp-fedavg, dp-fedavg-adaptive, dp-fedavg-news: rounds per side "
                            "of the worst-case canary audit (a client clipped to exactly C "
                            "along a known direction; default 200000; --canary-view "
                            "client-app with dp-fedrec: ClientApp replies, default 320; 0: "
                            "no canary audit)")
    audit.add_argument("--canary-view", default="simulator", choices=(*VIEWS, "client-app"),
                       help="which release the canary game audits: the simulator's seeded "
                            "noise (default), a deployed server's float-safe SecureNoise, "
                            "the server's view of a SecAgg+ round (seeded, or "
                            "SecureNoise), or what the Flower ClientApp's train handler "
                            "returns (dp-fedavg, through the aggregator's noise; dp-fedrec, "
                            "its local-DP reply); deployed draws about 1e5 coordinates a "
                            "second: pass a smaller --canary-runs")
    audit.add_argument("--noise-placement", default="central", choices=NOISE_PLACEMENTS,
                       help="--canary-view secagg*: the server adds the noise, or each "
                            "client adds its share before masking")
    audit.add_argument("--power", action="store_true",
                       help="also run each canary audit with the central noise cut 2x, "
                            "4x, 8x, 16x and report the smallest cut it catches")
    audit.add_argument("--run", default=None, metavar="RUN",
                       help="one-run estimate (Andrew et al. 2024) of a dp-fedavg run "
                            "directory: its configuration is trained again with --canaries "
                            "K canary clients (random unit updates) and the final model's "
                            "cosines with them give an empirical epsilon, printed next to "
                            "the ledger's")
    audit.add_argument("--canaries", type=int, default=1000,
                       help="--run: canary clients inserted (default 1000; as many held out)")
    audit.add_argument("--json", action="store_true", help="print the audits as JSON")
    audit.set_defaults(func=cmd_privacy_audit)


__all__ = ["add_audit_parser", "cmd_privacy_audit"]
