"""A checkpoint on storage that Ray Train never registered is taken only when every rank's part is there."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.fs
import pytest

from elastic_train.train.worker import complete_on_storage

FS = pyarrow.fs.LocalFileSystem()


def write_parts(d: Path, world: int, sharded: bool = False, skip: str | None = None) -> str:
    files = {"meta.json": json.dumps({"metrics": {"world_size": world}}), "train_state.pt": ""}
    if not sharded:
        files["model.pt"] = ""
    files.update({f"rng/rank_{r}.pt": "" for r in range(world)})
    if sharded:
        files.update({f"dcp/__{r}_0.distcp": "" for r in range(world)})
        files["dcp/.metadata"] = ""
    for rel, text in files.items():
        if rel != skip:
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_text(text)
    return str(d)


@pytest.mark.parametrize("sharded", [False, True])
def test_every_part_present_is_complete(tmp_path, sharded):
    assert complete_on_storage(FS, write_parts(tmp_path, world=2, sharded=sharded))


@pytest.mark.parametrize("missing", ["meta.json", "train_state.pt", "model.pt", "rng/rank_1.pt", "rng/rank_0.pt"])
def test_a_missing_rank_part_or_meta_is_incomplete(tmp_path, missing):
    assert not complete_on_storage(FS, write_parts(tmp_path, world=2, skip=missing))


@pytest.mark.parametrize("missing", ["dcp/__1_0.distcp", "dcp/.metadata"])
def test_a_missing_shard_or_index_is_incomplete(tmp_path, missing):
    assert not complete_on_storage(FS, write_parts(tmp_path, world=2, sharded=True, skip=missing))


def test_a_meta_without_a_world_size_is_not_trusted(tmp_path):
    d = write_parts(tmp_path, world=1)
    (tmp_path / "meta.json").write_text("{}")
    assert not complete_on_storage(FS, d)
