"""The supported range, read from the installed project's metadata, and the one-line refusals around it (issue 50).

A real driver against a cluster of another Ray: tests/e2e/test_version_mismatch.py."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from elastic_train.errors import ConfigError
from elastic_train.launch import versions

pytestmark = pytest.mark.versions


def test_the_range_is_pyprojects_and_the_installed_pair_is_inside_it():
    ranges = versions.supported()
    assert ranges == {"ray": "<2.61,>=2.55", "mlflow": "<3.18,>=3.5"} or ranges == versions.FALLBACK_RANGES
    versions.check_installed()  # this venv's pair (newest or oldest set) passes
    line = versions.versions_line()
    assert line.startswith("versions: Ray ") and version("ray") in line and version("mlflow") in line


@pytest.mark.parametrize(("package", "found"), [("ray", "2.54.1"), ("ray", "2.61.0"), ("mlflow", "3.4.0"),
                                                ("mlflow", "3.18.0")])
def test_a_ray_or_mlflow_outside_the_range_is_one_line_with_the_range_and_the_install(monkeypatch, package, found):
    real = versions.installed
    monkeypatch.setattr(versions, "installed", lambda p: found if p == package else real(p))
    with pytest.raises(ConfigError) as e:
        versions.check_installed()
    text = str(e.value)
    assert "\n" not in text and text.startswith(f"{package}='{found}'"), text
    low, high = {"ray": (">=2.55", "<2.61"), "mlflow": (">=3.5", "<3.18")}[package]
    assert f"{package}{low},{high}" in text and "make install " in text, text


def test_an_mlflow_before_3_9_with_sqlalchemy_2_1_is_refused_with_the_pin(monkeypatch):
    pair = {"mlflow": "3.5.1", "sqlalchemy": "2.1.0"}
    real = versions.installed
    monkeypatch.setattr(versions, "installed", lambda p: pair.get(p) or real(p))
    with pytest.raises(ConfigError) as e:
        versions.check_installed()
    assert "sqlalchemy" in str(e.value) and "MLFLOW_VERSION=3.5.1" in str(e.value)


# Ray's RuntimeError from ray.init when the cluster's Ray differs (its text, Ray 2.55-2.60: ray/_private/utils.py)
MISMATCH = """Version mismatch: The cluster was started with:
    Ray: {theirs}
    Python: 3.11.7
This process on node 127.0.0.1 was started with:
    Ray: {ours}
    Python: 3.11.7
"""


def test_ray_s_version_mismatch_becomes_one_line_naming_both_and_the_matching_install():
    error = versions.cluster_mismatch(RuntimeError(MISMATCH.format(theirs="2.57.1", ours="2.60.0")), "10.0.0.5:6379")
    assert error is not None
    text = str(error)
    assert "2.57.1" in text and "2.60.0" in text and "make install RAY_VERSION=2.57.1" in text and "\n" not in text
    outside = str(versions.cluster_mismatch(RuntimeError(MISMATCH.format(theirs="2.40.0", ours="2.60.0")), "h:1"))
    assert "outside the supported range" in outside and "make install RAY_VERSION=2.40.0" not in outside
    assert versions.cluster_mismatch(RuntimeError("something else"), "h:1") is None
