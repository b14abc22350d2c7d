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

from jobs._cli import EXIT_OK, common_parser, guarded, write_json


def main(argv: list[str] | None = None) -> int:
    parser = common_parser(__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", metavar="PATH", help="a checkpoint folder, or a run folder (latest checkpoint)")
    source.add_argument("--model", metavar="URI", help="an MLflow model: models:/NAME/VERSION or runs:/RUN_ID/model")
    parser.add_argument("--summary-json", metavar="PATH", help="write the metrics here")
    args = parser.parse_args(argv)
    return guarded(lambda: _evaluate(args))


def _evaluate(args) -> int:
    from elastic_train import config
    from elastic_train.launch import run as driver
    from elastic_train.launch.evaluation import load_source, run_evaluation
    from elastic_train.launch.storage import resolve_home
    from tracking.runs import resolve_uri

    base = config.load(args.config, args.overrides)  # validates the overrides on their own first
    uri = resolve_uri(base.tracking.uri, resolve_home())
    model, trained_with, info = load_source(args.checkpoint, args.model, uri)
    tree = trained_with
    if args.config:
        tree = driver._deep_merge(tree, config.read_yaml(args.config))
    for key, value in config.parse_overrides(args.overrides).items():
        config._set_dotted(tree, key, value)
    source_name = trained_with.get("name") or "model"
    tree["name"] = f"{source_name}-eval-{time.strftime('%Y%m%d-%H%M%S')}"
    launch = driver.Launch(config.validate(tree), tree["name"], resolve_home(), "", False, args.config)
    launch.storage_path = driver.resolve_storage(launch.cfg, launch.home)
    report = driver.prepare(launch, args.address)
    bundle = report.bundle
    print(f"evaluating {info['source']} ({len(bundle.val)} validation samples)")
    spec = driver.start_tracking(launch, report, kind="evaluate")
    metrics = run_evaluation(launch.cfg, model, run_name=launch.run_name, storage_path=launch.storage_path,
                             use_gpu=report.use_gpu, bundle=bundle)
    if spec is not None:
        from tracking.mlflow_tracker import MlflowTracker
        from tracking.runs import end_run

        tracker = MlflowTracker(spec, start_system_metrics=False)
        tracker.log_metrics({k: v for k, v in metrics.items() if isinstance(v, int | float)}, step=0)
        tracker.set_tags({"source": info["source"], "source_run_id": info.get("source_run_id") or ""})
        tracker.close()
        end_run(spec.uri, spec.run_id, "FINISHED")
    summary = {**info, "metrics": metrics, "mlflow_run_id": spec.run_id if spec else None,
               "tracking_uri": spec.uri if spec else None}
    for key, value in metrics.items():
        print(f"  {key:<16} {value:.6g}" if isinstance(value, float) else f"  {key:<16} {value}")
    write_json(args.summary_json, summary)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
