"""Evaluate a trained model on its validation set over every worker, and log the metrics to MLflow.

    python -m jobs.evaluate --checkpoint results/digits-20261129-161740            # a run: its latest checkpoint
    python -m jobs.evaluate --checkpoint results/RUN/checkpoint_000000110 scaling.num_workers=4
    python -m jobs.evaluate --model models:/digits-mlp/3 [section.key=value ...]

On a cluster:

    ray job submit --working-dir . -- python -m jobs.evaluate --model models:/digits-mlp/3

The model is rebuilt from the config it was trained with (stored in the checkpoint, or in the MLflow model's
metadata); overrides apply on top (e.g. data.path for another text corpus, scaling.num_workers). Metrics are
sums all-reduced over the workers' shards: exactly the whole validation set's. Exit codes as jobs.train.
"""

from __future__ import annotations

import sys
import time

from jobs._cli import EXIT_OK, ArgumentParser, add_model_source, common_parser, guarded, print_config, write_json


def build_parser(prog: str = "python -m jobs.evaluate") -> ArgumentParser:
    parser = common_parser(__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1], prog=prog)
    add_model_source(parser)
    parser.add_argument("--summary-json", metavar="PATH", help="write the metrics here")
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m jobs.evaluate") -> int:
    args = build_parser(prog).parse_args(argv)
    return guarded(lambda: _evaluate(args))


def _evaluate(args) -> int:
    from elastic_train.launch import context, evaluation

    base = context.plan(args.config, args.overrides)  # the file and overrides, checked on their own first
    model, trained_with, info = evaluation.load_source(args.checkpoint, args.model, context.tracking_backend(base))
    name = f"{trained_with.get('name') or 'model'}-eval-{time.strftime('%Y%m%d-%H%M%S')}"
    planned = context.plan(args.config, args.overrides, stored=trained_with, name=name)
    if args.print_config:  # --model reads the model's metadata from the registry; no run is started
        return print_config(planned.cfg)
    ctx = context.connect(planned, args.address)
    print(f"evaluating {info['source']} ({len(ctx.bundle.val)} validation samples)")
    ctx = context.track(ctx, kind="evaluate")
    metrics = evaluation.run_evaluation(ctx, model)
    evaluation.record_evaluation(ctx, metrics, info)
    spec = ctx.tracking
    summary = {**info, "metrics": metrics, "mlflow_run_id": spec.run_id if spec else None,
               "tracking_uri": spec.uri if spec else None}
    for key, value in metrics.items():
        print(f"  {key:<16} {value:.6g}" if isinstance(value, float) else f"  {key:<16} {value}")
    write_json(args.summary_json, summary)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
