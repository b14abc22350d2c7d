"""Start an MLflow tracking server: a database backend, an artifact root, loopback unless told otherwise.

    python -m tracking.server                          # 127.0.0.1:5000, store in ./mlflow-server/
    python -m tracking.server --host 0.0.0.0 --allowed-hosts 'head-node:5000,10.0.0.5:5000'
    MLFLOW_AUTH_ADMIN_PASSWORD=... python -m tracking.server --basic-auth

Point runs at it with ``tracking.uri=http://HOST:PORT`` (or ``MLFLOW_TRACKING_URI``). With ``--basic-auth``
every request needs a user (``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` on the client; the
driver passes them to the workers). The admin account is created on first start from
``$MLFLOW_AUTH_ADMIN_PASSWORD``. The process execs ``mlflow server``, so signals reach it directly.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

AUTH_INI = """[mlflow]
default_permission = {permission}
database_uri = sqlite:///{db}
admin_username = {admin}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
"""


def build_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The ``mlflow server`` argv and extra environment for ``args``."""
    home = Path(args.home).expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", args.backend_store_uri or f"sqlite:///{home / 'mlflow.db'}",
        "--artifacts-destination", args.artifacts_destination or (home / "artifacts").as_uri(),
        "--serve-artifacts",
        "--host", args.host,
        "--port", str(args.port),
        "--workers", str(args.workers),
    ]
    if args.allowed_hosts:
        cmd += ["--allowed-hosts", args.allowed_hosts]
    env: dict[str, str] = {}
    # MLflow 3's server starts a job runner by default: 8 huey consumer processes (~235 MB each, and seconds of
    # CPU at start) for GenAI evaluation jobs this project never submits. Off unless the user turns it on.
    if "MLFLOW_SERVER_ENABLE_JOB_EXECUTION" not in os.environ:
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    if args.basic_auth:
        if not os.environ.get("MLFLOW_AUTH_ADMIN_PASSWORD"):
            raise SystemExit("error: --basic-auth needs MLFLOW_AUTH_ADMIN_PASSWORD (the admin account's password)")
        ini = home / "basic_auth.ini"
        ini.write_text(AUTH_INI.format(permission=args.default_permission, db=home / "basic_auth.db", admin=args.admin))
        ini.chmod(0o600)
        cmd += ["--app-name", "basic-auth"]
        env["MLFLOW_AUTH_CONFIG_PATH"] = str(ini)
        env["MLFLOW_FLASK_SERVER_SECRET_KEY"] = os.environ.get("MLFLOW_FLASK_SERVER_SECRET_KEY") or _secret_key(home)
    return cmd, env


def _secret_key(home: Path) -> str:
    """The CSRF key basic-auth needs, generated once per store and kept (mode 600) so restarts agree."""
    path = home / "flask_secret_key"
    if not path.exists():
        import secrets

        path.write_text(secrets.token_hex(32))
        path.chmod(0o600)
    return path.read_text().strip()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tracking.server", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--home", default="mlflow-server", help="folder for the database and artifacts")
    p.add_argument("--backend-store-uri", help="database URI (default: sqlite in --home); postgresql:// for teams")
    p.add_argument("--artifacts-destination",
                   help="artifact root (default: --home/artifacts; s3:// or gs:// on clusters)")
    p.add_argument("--allowed-hosts",
                   help="Host headers to accept when binding beyond loopback (MLflow's DNS-rebinding guard)")
    p.add_argument("--workers", type=int, default=2, help="server worker processes")
    p.add_argument("--basic-auth", action="store_true", help="require a user and password (MLflow basic-auth app)")
    p.add_argument("--admin", default="admin", help="basic-auth admin user name")
    p.add_argument("--default-permission", default="READ", choices=["READ", "EDIT", "MANAGE", "NO_PERMISSIONS"],
                   help="basic-auth: what users get on resources they do not own")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    cmd, env = build_command(args)
    print(f"MLflow server on http://{args.host}:{args.port} (store: {Path(args.home).resolve()})", flush=True)
    os.execve(cmd[0], cmd, {**os.environ, **env})
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
