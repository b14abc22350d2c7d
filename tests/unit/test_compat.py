"""The canary (DESIGN invariant 13): every upstream internal listed in elastic_train/compat/registry.py still exists
with the signature we rely on, so that a Ray, MLflow or torch upgrade fails here, loudly, not silently."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from elastic_train.compat.registry import ENTRIES, Entry, problem
from tests.conftest import ROOT

KINDS = {"attr", "override", "member", "env", "literal", "calls", "const", "grpc", "fields", "module", "ours", "mirror"}


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: f"{e.kind}:{e.target}:{e.value or ''}")
def test_each_listed_internal_is_still_there(entry):
    assert entry.kind in KINDS and entry.used_in and entry.purpose and entry.why and entry.checked_on
    assert problem(entry) is None, problem(entry)


def test_a_renamed_override_or_knob_fails_the_canary():
    real = next(e for e in ENTRIES if e.target.endswith("._initialize_and_run_controller"))
    renamed = Entry(**{**vars(real), "target": real.target.replace("_initialize_and_run", "_init_and_run")})
    assert "AttributeError" in problem(renamed)
    knob = next(e for e in ENTRIES if e.kind == "env" and e.value == "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S")
    assert problem(Entry(**{**vars(knob), "value": "RAY_TRAIN_HEALTH_CHECK_S"})).startswith("now names")
    rpc = next(e for e in ENTRIES if e.kind == "grpc")
    assert problem(Entry(**{**vars(rpc), "value": "ray.rpc.NodeInfoGcsService.GetClusterIdV2"})) is not None
    literal = next(e for e in ENTRIES if e.kind == "literal")
    assert "no longer reads" in problem(Entry(**{**vars(literal), "value": "RAY_AIR_OUTPUT"}))
    calls = next(e for e in ENTRIES if e.kind == "calls")
    assert "no longer calls" in problem(Entry(**{**vars(calls), "value": "print_to_stdstream_v2"}))
    fields = next(e for e in ENTRIES if e.kind == "fields")
    assert "lacks keep_alive_s" in problem(Entry(**{**vars(fields), "value": "keep_alive_s"}))
    mirror = next(e for e in ENTRIES if e.kind == "mirror")
    assert "source changed" in problem(Entry(**{**vars(mirror), "value": "0" * 16}))
    moved = Entry(**{**vars(real), "params": ("self", "kwargs")})
    assert problem(moved).startswith("signature")


PRIVATE = re.compile(r"\b(?:ray|mlflow|torch)(?:\.\w+)*\._\w+")


def test_every_private_name_in_the_code_is_listed():
    """A private import in elastic_train/, tracking/ or jobs/ outside compat/ (the lint contract says so too), or
    a private name in compat/ that the registry does not list, fails here."""
    listed = "\n".join(f"{e.target} {e.value or ''}" for e in ENTRIES)
    for path in [*ROOT.glob("elastic_train/**/*.py"), *ROOT.glob("tracking/*.py"), *ROOT.glob("jobs/*.py")]:
        rel = path.relative_to(ROOT).as_posix()
        for line in Path(path).read_text().splitlines():
            code = line.split("#")[0]
            if not re.match(r"\s*(from|import) ", code):
                continue
            for name in PRIVATE.findall(code):
                assert rel.startswith("elastic_train/compat/"), f"{rel}: {line.strip()}"
                assert name in listed, f"{rel}: {name} is not in compat/registry.py"


def test_a_method_reads_the_same_after_ray_made_its_class_an_actor():
    """Ray adds ``_ray_trace_ctx`` to every method of a class it makes an actor, in place: the registry's
    signature check of an actor class's method (the AutoscalingCoordinator's) failed once an earlier test of the
    same session had created that actor."""
    import inspect

    import ray

    from elastic_train.compat.registry import _params

    class Book:
        def put(self, key: str) -> None:
            pass

    ray.remote(Book)
    assert "_ray_trace_ctx" in inspect.signature(Book.put).parameters  # what Ray does; if not, this test is moot
    assert _params(Book.put) == ("self", "key")
