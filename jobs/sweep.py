"""Sweep batch size and learning rate (any dotted config key) with Ray Tune; every trial is an elastic multi-worker run.

    python -m jobs.sweep [--config configs/sweep-digits.yaml] [section.key=value ...] [--summary-json PATH]
    python -m jobs.sweep --resume NAME          # continue an interrupted sweep; finished trials are not rerun

On a cluster:

    ray job submit --working-dir . -- python -m jobs.sweep --config configs/sweep-digits.yaml

The search space, scheduler and concurrency are the config's `sweep:` section. MLflow gets one parent run per
sweep (results table, plot, best config, checkpoint and model) with a child run per trial.

Exit codes: 0 swept (some trial produced a result), 1 every trial failed, 2 bad input (nothing was started),
130 interrupted (resume it with --resume NAME).
"""

from __future__ import annotations

import os
import sys

from jobs._cli import EXIT_FAILED, EXIT_KILLED, EXIT_OK, common_parser, guarded, write_json


def main(argv: list[str] | None = None) -> int:
    parser = common_parser(__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--summary-json", metavar="PATH", help="write the sweep summary here")
    parser.add_argument("--resume", metavar="NAME", help="continue the sweep NAME (Tuner.restore)")
    args = parser.parse_args(argv)
    return guarded(lambda: _sweep(args))


def _sweep(args) -> int:
    from elastic_train.launch import run as driver
    from elastic_train.sweep import tuner as sweep

    plan = sweep.plan_sweep(args.config, args.overrides, args.resume)
    print(f"sweep {plan.name}{' (resuming)' if plan.restoring else ''}: storage {plan.sweep_dir}")
    report = driver.prepare(plan.launch, args.address)
    limit = sweep.check_concurrency(plan.cfg, report)
    print(report.render())
    print(f"  trials at once: {limit if limit else 'no limit (autoscaling)'}")
    parent = sweep.start_parent(plan, report)
    try:
        grid, reclaimed = sweep.run_tuner(plan, report, parent, limit, fault=os.environ.get("ELASTIC_TRAIN_FAULT"))
    except KeyboardInterrupt:
        if parent is not None:
            from tracking.runs import end_run

            end_run(parent.uri, parent.run_id, "KILLED")
        print(f"interrupted: continue with  python -m jobs.sweep --resume {plan.name}", file=sys.stderr)
        raise
    rows = sweep.collect_trials(plan, grid)
    if parent is not None:
        sweep.close_children(parent, rows, plan.cfg.sweep.metric)
    summary = sweep.summarize(plan, rows, parent, reclaimed, limit)
    if parent is not None:
        sweep.finish_parent(plan, summary, rows, parent, report)
    print(sweep.render_table(summary))
    write_json(args.summary_json, summary)
    if summary["status"] == "KILLED":
        print(f"interrupted: continue with  python -m jobs.sweep --resume {plan.name}", file=sys.stderr)
        return EXIT_KILLED
    return EXIT_OK if summary["best"] else EXIT_FAILED


def cli() -> None:
    sys.exit(main())


if __name__ == "__main__":
    cli()
