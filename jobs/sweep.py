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

import sys

from jobs._cli import (
    EXIT_FAILED,
    EXIT_KILLED,
    EXIT_OK,
    ArgumentParser,
    common_parser,
    exit_now,
    guarded,
    print_config,
    write_json,
)


def build_parser(prog: str = "python -m jobs.sweep") -> ArgumentParser:
    parser = common_parser(__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1], prog=prog)
    parser.add_argument("--summary-json", metavar="PATH", help="write the sweep summary here")
    parser.add_argument("--resume", metavar="NAME", help="continue the sweep NAME (Tuner.restore)")
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m jobs.sweep", program: bool | None = None) -> int:
    from elastic_train.launch import timeline

    # as jobs.train: the wall counts from the process start when the sweep is the program, else from this call
    program = argv is None if program is None else program
    launched = timeline.begin(from_process_start=program).launched
    args = build_parser(prog).parse_args(argv)
    code = guarded(lambda: _sweep(args, launched))
    if program:  # all written: leave Ray (what its atexit hook would do), then skip the interpreter's slow
        import ray  # teardown (docs/startup.md)

        if ray.is_initialized():
            ray.shutdown()
        exit_now(code)
    return code


def _sweep(args, launched: float | None = None) -> int:
    from dataclasses import replace

    from elastic_train.launch import context, timeline
    from elastic_train.sweep import plan as sweep_plan
    from elastic_train.sweep import results, tuner

    timeline.mark("imports (torch, Ray)")
    plan = sweep_plan.plan_sweep(args.config, args.overrides, args.resume, launched=launched)
    if args.print_config:
        return print_config(plan.cfg)
    # the sweep's reaper ends its trials' placement groups instead of Ray Train's cleaners (sweep/placement_groups.py)
    plan = replace(plan, ctx=context.connect_warming_store(plan.ctx, args.address,
                                                           starts_cleaner=not tuner.reaps_placement_groups()))
    limit = sweep_plan.check_concurrency(plan.cfg, plan.ctx.cluster)
    print(plan.header())
    print(f"  trials at once: {limit if limit else 'no limit (autoscaling)'}")
    plan = replace(plan, ctx=context.track(plan.ctx, kind="sweep"))
    try:
        grid, reclaimed = tuner.run_tuner(plan, limit)
    except KeyboardInterrupt:
        results.end_parent(plan, "KILLED")
        print(f"interrupted: continue with  python -m jobs.sweep --resume {plan.name}", file=sys.stderr)
        raise
    timeline.mark("trials")
    rows = results.collect_trials(plan, grid)
    results.close_children(plan, rows)
    timeline.mark("trial results + runs")
    summary = results.summarize(plan, rows, reclaimed, limit)
    results.finish_parent(plan, summary, rows)
    timeline.mark("parent run + best model")
    results.account(plan, summary)
    print(results.render_table(summary))
    write_json(args.summary_json, summary)
    if summary["status"] == "KILLED":
        print(f"interrupted: continue with  python -m jobs.sweep --resume {plan.name}", file=sys.stderr)
        return EXIT_KILLED
    return EXIT_OK if summary["best"] else EXIT_FAILED


def cli() -> None:
    sys.exit(main())


if __name__ == "__main__":
    cli()
