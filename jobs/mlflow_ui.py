"""Open the MLflow UI on the store the runs use, and say which one (the jobs' own resolution of it).

    python -m jobs.mlflow_ui [--config FILE] [tracking.uri=...] [--port 5000] [--print-uri]
    elastic-train ui
    ELASTIC_TRAIN_HOME=~/elastic-train elastic-train ui      # runs made through `ray job submit`

The store is the one a job would log to with the same config and environment: ``tracking.uri``, else
``$MLFLOW_TRACKING_URI``, else ``sqlite:///<home>/mlflow.db`` with home = ``$ELASTIC_TRAIN_HOME``, else the current
folder (``~/elastic-train`` on the head node for jobs run by ``ray job submit``). A tracking server (http://...)
has its own UI: this prints its address.

Exit codes: 0 the UI ran (or --print-uri), 2 bad input or no store there yet.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from jobs._cli import EXIT_BAD_INPUT, EXIT_OK, ArgumentParser, guarded


def build_parser(prog: str = "python -m jobs.mlflow_ui") -> ArgumentParser:
    import argparse

    parser = ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", metavar="FILE", help="the job config whose tracking.uri to open")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="e.g. tracking.uri=...")
    parser.add_argument("--host", default="127.0.0.1", help="interface to serve on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=5000, help="port (default 5000)")
    parser.add_argument("--print-uri", action="store_true", help="print the store's URI and exit")
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m jobs.mlflow_ui") -> int:
    args = build_parser(prog).parse_args(argv)
    return guarded(lambda: _ui(args))


def _ui(args) -> int:
    from elastic_train import config as config_mod
    from elastic_train.launch.storage import HOME_ENV, resolve_home
    from tracking.runs import is_server, resolve_uri

    cfg = config_mod.layer(args.config, args.overrides)
    home = resolve_home()
    if cfg.tracking.backend != "mlflow":
        print(f"error: tracking.backend={cfg.tracking.backend!r}: no UI; its files are in "
              f"{cfg.tracking.uri or home / 'tracking'}", file=sys.stderr)
        return EXIT_BAD_INPUT
    uri = resolve_uri(cfg.tracking.uri, home)
    if args.print_uri:
        print(uri)
        return EXIT_OK
    if is_server(uri):
        print(f"the runs are on the tracking server {uri}: open it in a browser")
        return EXIT_OK
    db = Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None
    if db is not None and not db.is_file():
        print(f"error: no MLflow store at {db} yet (home {home}): run a job first, or point {HOME_ENV} or "
              f"tracking.uri at the runs (`ray job submit` runs: {HOME_ENV}=~/elastic-train on the head node)",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"MLflow UI for {uri} on http://{args.host}:{args.port} (Ctrl-C to stop)", flush=True)
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", args.host,
           "--port", str(args.port)]
    os.execv(sys.executable, cmd)
    return EXIT_OK  # not reached


if __name__ == "__main__":
    sys.exit(main())
