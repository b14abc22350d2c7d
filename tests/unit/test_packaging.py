"""What the package claims agrees with what it pins (issue 34 item 11): pyproject's ``requires-python`` is at
least every pinned dependency's ``Requires-Python`` (read from the installed dists' metadata), and every
third-party package the code imports directly is declared. ~1 s."""

from __future__ import annotations

import importlib.metadata as md
import re
import tomllib

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tests.conftest import ROOT

PINNED = ("numpy", "pandas", "scipy", "scikit-learn", "matplotlib", "pyarrow", "pydantic", "mlflow", "ray")


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[re.sub(r"[-_.]+", "-", name.strip().lower())] = version.strip()
    return pins


def _lowest_minor(claim: str) -> Version:
    low = [Version(s.version) for s in SpecifierSet(claim) if s.operator in (">=", "~=")]
    assert low, f"requires-python {claim!r} has no lower bound"
    return max(low)


def test_requires_python_is_what_the_pins_need():
    claim = _lowest_minor(_project()["requires-python"])
    pins = _pins()
    for name in PINNED:
        assert pins.get(name) == md.version(name), f"{name}: installed {md.version(name)}, pinned {pins.get(name)}"
        needs = md.metadata(name).get("Requires-Python")
        if needs:  # the claimed oldest Python must satisfy every pin's own requirement
            assert SpecifierSet(needs).contains(f"{claim.major}.{claim.minor}.99"), (
                f"requires-python >={claim} but {name}=={pins[name]} needs Python {needs}")
    readme = (ROOT / "README.md").read_text()
    assert f"Python {claim.major}.{claim.minor} or newer" in readme


def test_what_the_code_imports_is_declared():
    declared = " ".join(_project()["dependencies"] + _project()["optional-dependencies"]["dev"]).lower()
    for name in ("pyarrow", "pydantic-core", "psutil", "pillow"):
        assert name in declared, f"{name} is imported (or needed by a default) but not declared"
    assert "psutil" in _pins()
