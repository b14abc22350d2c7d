"""Check a training plan against the cluster without training: nodes, CPUs, GPUs, whether the workers fit,
whether the storage path is writable and visible from every node, and the batch plan for each world size.

    python -m jobs.preflight [--config configs/digits.yaml] [section.key=value ...] [--json PATH]

On a cluster:

    ray job submit --working-dir . -- python -m jobs.preflight --config configs/digits.yaml scaling.num_workers=8

Exit codes: 0 the plan fits, 2 bad input or the plan does not fit (the message names the field), 130 interrupted.
"""

from __future__ import annotations

import sys

from jobs._cli import EXIT_OK, ArgumentParser, common_parser, guarded, print_config, write_json


def build_parser(prog: str = "python -m jobs.preflight") -> ArgumentParser:
    parser = common_parser(__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1], prog=prog)
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON here")
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m jobs.preflight") -> int:
    args = build_parser(prog).parse_args(argv)
    return guarded(lambda: _preflight(args))


def _preflight(args) -> int:
    from elastic_train.launch import context

    planned = context.plan(args.config, args.overrides)
    if args.print_config:
        return print_config(planned.cfg)
    ctx = context.connect(planned, args.address)
    print(ctx.header())
    write_json(args.json, ctx.cluster.to_dict())
    return EXIT_OK


def cli() -> None:
    sys.exit(main())


if __name__ == "__main__":
    cli()
