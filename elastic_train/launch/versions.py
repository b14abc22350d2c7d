"""The Ray and MLflow releases this engine supports, checked before anything starts (DESIGN invariant 14).

A Ray job's Ray must equal its cluster's, and the cluster's is chosen by whoever runs it, so the engine supports a
range (``pyproject.toml``: the one place it is declared; read back here from the installed package's metadata)
and CI tests both ends (``constraints.txt``, ``constraints-oldest.txt``). :func:`check_installed` refuses a Ray or
MLflow outside the range (exit 2, the range and the line that installs a supported one); :func:`cluster_mismatch`
turns Ray's own "Version mismatch" error into one line naming both versions and the install line that matches
the cluster. Features that need a newer release than the oldest supported turn off with one preflight line
(compat/features.py).
"""

from __future__ import annotations

import re
import sys
from functools import cache
from importlib.metadata import PackageNotFoundError, requires, version

from elastic_train.errors import ConfigError

PROJECT = "elastic-train"
# Used when the project is not installed as a package (a checkout run in place): pyproject.toml's ranges.
FALLBACK_RANGES = {"ray": ">=2.55,<2.61", "mlflow": ">=3.5,<3.18"}


@cache
def supported() -> dict[str, str]:
    """``{"ray": ">=2.55,<2.61", "mlflow": ">=3.5,<3.18"}`` as the installed project declares them."""
    try:
        declared = requires(PROJECT) or []
    except PackageNotFoundError:
        return dict(FALLBACK_RANGES)
    ranges = dict(FALLBACK_RANGES)
    for req in declared:
        m = re.match(r"^\s*(ray|mlflow)\s*(?:\[[^\]]*\])?\s*([<>=!~][^;]*)", req)
        if m and "extra ==" not in req:
            ranges[m.group(1)] = m.group(2).replace(" ", "")
    return ranges


def installed(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def install_line(ray: str | None = None, mlflow: str | None = None) -> str:
    """The one line that installs these versions into the project's venv (Makefile; README "Install")."""
    parts = ["make install"]
    if ray:
        parts.append(f"RAY_VERSION={ray}")
    if mlflow:
        parts.append(f"MLFLOW_VERSION={mlflow}")
    return " ".join(parts)


def _in_range(value: str, spec: str) -> bool:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    return Version(value) in SpecifierSet(spec)


def _ordered(spec: str) -> str:
    """``<2.61,>=2.55`` as ``>=2.55,<2.61``: the lower bound first."""
    return ",".join(sorted(spec.split(","), key=lambda s: not s.startswith(">")))


def check_installed() -> None:
    """ConfigError (exit 2) when the installed Ray or MLflow is outside the supported range, or an MLflow before 3.9
    meets a SQLAlchemy it cannot import (its own requirement allows any sqlalchemy<3)."""
    for package, spec in supported().items():
        found = installed(package)
        if found is not None and not _in_range(found, spec):
            newest = {"ray": "2.60.0", "mlflow": "3.17.2"}[package]
            raise ConfigError(package, found, f"outside the supported range {package}{_ordered(spec)}: "
                              f"`{install_line(**{package: newest})}` installs a supported one "
                              f"(or any {package}{_ordered(spec)})")
    mlflow, sqlalchemy = installed("mlflow"), installed("sqlalchemy")
    if mlflow and sqlalchemy and _in_range(mlflow, "<3.9") and _in_range(sqlalchemy, ">=2.1"):
        raise ConfigError("sqlalchemy", sqlalchemy, f"MLflow {mlflow} needs SQLAlchemy < 2.1 (it imports a pool 2.1 "
                          f"removed): `{install_line(mlflow=mlflow)}` pins it, or pip install 'sqlalchemy<2.1'")


def versions_line() -> str:
    """``versions: Ray 2.60.0, MLflow 3.17.2, torch 2.13.0, Python 3.11.9``: the preflight's first line."""
    names = {"ray": "Ray", "mlflow": "MLflow", "torch": "torch"}
    found = ", ".join(f"{label} {installed(pkg) or 'not installed'}" for pkg, label in names.items())
    return f"versions: {found}, Python {sys.version.split()[0]}"


_RAY_LINE = re.compile(r"^\s*Ray: (\S+)$", re.MULTILINE)
_PY_LINE = re.compile(r"^\s*Python: (\S+)$", re.MULTILINE)


def cluster_mismatch(error: BaseException, address: str) -> ConfigError | None:
    """Ray's "Version mismatch" error from ``ray.init`` (the cluster's Ray or Python differs from this process's) as
    one ConfigError naming both and what fixes it; None for any other error."""
    text = str(error)
    if "Version mismatch" not in text:
        return None
    rays, pythons = _RAY_LINE.findall(text), _PY_LINE.findall(text)
    if len(rays) == 2 and rays[0] != rays[1]:
        theirs, ours = rays
        spec = supported()["ray"]
        fix = (f"`{install_line(ray=theirs)}` here (a job's Ray must equal its cluster's)"
               if _in_range(theirs, spec) else
               f"that Ray is outside the supported range ray{spec}: run the cluster on a supported Ray")
        return ConfigError("ray", ours, f"the cluster at {address} runs Ray {theirs}: {fix}")
    if len(pythons) == 2:
        return ConfigError("python", pythons[1], f"the cluster at {address} runs Python {pythons[0]}: Ray needs the "
                           "same Python on the driver (RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL=minor accepts another "
                           "patch release)")
    return ConfigError("ray", installed("ray") or "?", f"the cluster at {address} runs another Ray: "
                       + text.splitlines()[0])
