"""Train one model with DDP (or FSDP) over every worker Ray gives us, tracked in MLflow.

    python -m jobs.train [--config configs/digits.yaml] [section.key=value ...] [--summary-json PATH]
    python -m jobs.train --resume NAME            # continue a run whose driver died

On a cluster:

    ray job submit --working-dir . -- python -m jobs.train --config configs/digits.yaml train.lr=3e-3

Exit codes: 0 trained, 1 training failed, 2 bad input (nothing was started), 130 interrupted.
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


def build_parser(prog: str = "python -m jobs.train") -> ArgumentParser:
    parser = common_parser(__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1], prog=prog)
    parser.add_argument("--summary-json", metavar="PATH", help="write the run summary here")
    parser.add_argument("--resume", metavar="NAME", help="resume the run NAME from its latest checkpoint")
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m jobs.train", program: bool | None = None) -> int:
    from elastic_train.launch import timeline

    # the job is the program when it reads the command line (here, or jobs.cli says so): its wall counts from the
    # process start, imports included; called in-process with arguments, from this call
    program = argv is None if program is None else program
    launched = timeline.begin(from_process_start=program).launched
    args = build_parser(prog).parse_args(argv)
    code = guarded(lambda: _train(args, launched))
    if program:
        exit_now(code)  # all written and Ray left: skip the interpreter's slow teardown (docs/startup.md)
    return code


def _train(args, launched: float | None = None) -> int:
    from elastic_train.launch import context, fit, summary, timeline

    timeline.mark("imports (torch, Ray)")

    if args.print_config:
        return print_config(context.plan(args.config, args.overrides, args.resume).cfg)
    ctx = context.prepare(args.config, args.overrides, args.resume, args.address, launched=launched)
    print(ctx.header())
    outcome = fit.fit(ctx)
    result = summary.summarize(ctx, outcome)
    summary.finish(ctx, outcome, result)
    context.disconnect_ray(ctx)
    summary.account(ctx, outcome, result)
    print(summary.render_summary(result))
    write_json(args.summary_json, result)
    return {"FINISHED": EXIT_OK, "KILLED": EXIT_KILLED}.get(outcome.status, EXIT_FAILED)


def cli() -> None:
    sys.exit(main())


if __name__ == "__main__":
    cli()
