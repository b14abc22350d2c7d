"""data.ray_mode=stream without Ray: the mode choice, its config errors, the id-hash validation split and the
consumed-id bookkeeping that makes a restart or a resize exactly once per epoch (with an in-memory stand-in for
the Ray Data source)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from elastic_train.data.batching import BatchPlan
from elastic_train.data.ids import val_mask
from elastic_train.data.spec import DataBundle, DataSpec, StreamSplit
from elastic_train.data.stream import ConsumedIds, StreamData, check_stream_batches, choose_mode
from elastic_train.errors import ConfigError

MB = 1_000_000


@pytest.mark.parametrize(("requested", "id_column", "size", "store", "mode"), [
    ("materialize", "id", 10**12, 100 * MB, "materialize"),
    ("stream", "id", 1, 100 * MB, "stream"),
    ("auto", "id", 30 * MB, 100 * MB, "stream"),  # more than a quarter of the store
    ("auto", "id", 20 * MB, 100 * MB, "materialize"),
    ("auto", None, 10**12, 100 * MB, "materialize"),  # nothing to stream by
    ("auto", "id", 10**12, None, "materialize"),  # not connected: no store size
])
def test_the_mode_choice(requested, id_column, size, store, mode):
    got, why = choose_mode(requested, id_column, size, store)
    assert got == mode and why


def test_stream_without_an_id_column_names_data_id_column():
    with pytest.raises(ConfigError) as e:
        choose_mode("stream", None, 1, 100 * MB)
    assert e.value.field == "data.id_column"


def test_every_world_size_must_divide_the_global_batch():
    check_stream_batches(128, 1, 2)
    check_stream_batches(96, 1, 4)
    with pytest.raises(ConfigError) as e:
        check_stream_batches(128, 2, 3)
    assert e.value.field == "train.global_batch_size" and "[3]" in str(e.value)


def test_the_validation_split_is_a_seeded_hash_of_the_id():
    ids = np.arange(100_000)
    mask = val_mask(ids, 0.2, seed=0)
    assert abs(mask.mean() - 0.2) < 0.01
    assert (val_mask(ids[::-1], 0.2, 0) == mask[::-1]).all()  # per id, not per position
    assert (val_mask(ids, 0.2, 1) != mask).any()
    words = np.array([f"img-{i}" for i in range(2000)], dtype=object)
    assert abs(val_mask(words, 0.5, 0).mean() - 0.5) < 0.05


def test_consumed_ids_count_only_steps_before_the_checkpoint():
    c = ConsumedIds()
    c.start(3, before=np.array([1, 2]))
    c.add(2, np.array([10, 11]))
    c.add(3, np.array([12, 13]))  # prepared ahead, not consumed at step_in_epoch=3
    assert c.local(3, 3).tolist() == [10, 11]
    pos = c.position(3, 3, [c.local(3, 3), np.array([20, 21])])
    assert pos["epoch"] == 3 and pos["step"] == 3 and sorted(pos["ids"].tolist()) == [1, 2, 10, 11, 20, 21]
    assert c.position(4, 0, [])["ids"].size == 0  # at an epoch boundary nothing is consumed yet


class FakeSource:
    """Ray Data's role, in memory: an epoch's rows less the excluded ids, shuffled by (seed, epoch), cut into
    ``world`` equal parts (the ragged rest dropped, as streaming_split(equal=True) does)."""

    def __init__(self, n: int):
        self.n = n

    def split(self, part, epoch, seed, world, exclude, equal):
        ids = np.arange(self.n)
        if exclude is not None:
            ids = ids[~np.isin(ids, exclude)]
        ids = np.random.default_rng([seed, epoch, len(ids)]).permutation(ids)
        m = len(ids) // world
        return [ids[r * m:(r + 1) * m] for r in range(world)]

    def batches(self, it, batch_size, prefetch, shuffle_buffer, seed) -> Iterator:
        for a in range(0, len(it), batch_size):
            ids = it[a:a + batch_size]
            yield torch.tensor(ids, dtype=torch.float32)[:, None], torch.zeros(len(ids), dtype=torch.long), ids


def stream_data(n: int, g: int, world: int, rank: int) -> StreamData:
    src = FakeSource(n)
    split = StreamSplit(src, n, np.zeros((1, 1), np.float32))
    bundle = DataBundle(split, split, DataSpec("classification", (1,), 2))
    return StreamData(bundle, BatchPlan(g, world), rank, seed=0, device=torch.device("cpu"))


def test_a_resize_mid_epoch_consumes_every_sample_once():
    """2 workers for 3 steps of an epoch, the checkpoint's gathered ids, then 1 worker from step 3: the epoch
    consumed floor(N/G)*G distinct ids (recomputed steps after the checkpoint are not counted twice)."""
    n, g, epoch = 1000, 64, 2
    ranks = [stream_data(n, g, 2, r) for r in range(2)]
    assert ranks[0].steps_per_epoch == n // g
    served: dict[int, list[int]] = {}
    for (s0, m0), (_, m1) in zip(ranks[0].epoch(epoch), ranks[1].epoch(epoch), strict=False):
        served[s0] = [int(v) for m in (m0, m1) for x, _ in m for v in x[:, 0].tolist()]
        if s0 == 4:  # steps 3 and 4 are lost in the "failure": the checkpoint was after step 2
            break
    gathered = [r.consumed.local(epoch, 3) for r in ranks]
    pos = ranks[0].consumed.position(epoch, 3, gathered)
    assert len(pos["ids"]) == 3 * g

    one = stream_data(n, g, 1, 0)
    one.restore(pos)
    for step, micro in one.epoch(epoch, start_step=3):
        served[step] = [int(v) for x, _ in micro for v in x[:, 0].tolist()]
    ids = [i for s in range(n // g) for i in served[s]]
    assert len(ids) == len(set(ids)) == (n // g) * g


def test_a_resume_without_the_consumed_ids_is_refused():
    d = stream_data(100, 10, 1, 0)
    with pytest.raises(RuntimeError, match="no consumed ids"):
        next(d.epoch(0, start_step=2))


def test_the_decoded_size_counts_fixed_width_columns_not_their_compressed_bytes(tmp_path):
    from elastic_train.data.ray_source import data_bytes, list_files
    from tests.helpers.ray_data import write_wide_parquet

    in_memory = write_wide_parquet(str(tmp_path), rows=1000, width=512, files=2)
    found = list_files(str(tmp_path), "parquet")
    assert found.total_bytes < in_memory / 20  # a label repeated compresses to almost nothing
    assert in_memory <= data_bytes("parquet", found) <= in_memory * 1.1  # x plus the id and label columns


@pytest.mark.parametrize(("cpus", "workers", "ok"), [(4, 2, True), (2, 2, False), (3, 2, True)])
def test_a_stream_needs_a_cpu_the_workers_leave(cpus, workers, ok):
    from elastic_train import config
    from elastic_train.launch.preflight import NodeInfo, PreflightReport, _check_stream_cpus

    cfg = config.compose({}, config.parse_overrides([f"scaling.num_workers={workers}"]))
    report = PreflightReport([NodeInfo("n", "127.0.0.1", cpus, 0)], False, {"CPU": 1.0}, fit_workers=cpus,
                             requested=(workers, workers), storage_path="/tmp", storage_shared=None, plans=[],
                             data={"mode": "stream"}, model_parameters=1)
    if ok:
        _check_stream_cpus(cfg, report)
    else:
        with pytest.raises(ConfigError) as e:
            _check_stream_cpus(cfg, report)
        assert e.value.field == "scaling.num_workers" and "Ray Data" in str(e.value)


def test_the_row_filter_ray_data_tasks_unpickle_imports_no_torch():
    """Ray Data's tasks unpickle the stream's row filter and import what it references: elastic_train.data.ids.
    Through an eager package __init__ that was torch, a second or more in every new Ray Data worker process."""
    import subprocess
    import sys

    code = "import sys, elastic_train.data.ids; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"


class RecordingSource(FakeSource):
    """FakeSource that records when each epoch's split is built and when its first batch is pulled."""

    def __init__(self, n: int, fail_epoch: int | None = None):
        super().__init__(n)
        self.events: list[tuple[str, int]] = []
        self.fail_epoch = fail_epoch

    def split(self, part, epoch, seed, world, exclude, equal):
        self.events.append(("split", epoch))
        return [(epoch, ids) for ids in super().split(part, epoch, seed, world, exclude, equal)]

    def batches(self, it, batch_size, prefetch, shuffle_buffer, seed) -> Iterator:
        epoch, ids = it
        self.events.append(("pull", epoch))
        if epoch == self.fail_epoch:
            raise OSError(f"the files of epoch {epoch} are gone")
        yield from super().batches(ids, batch_size, prefetch, shuffle_buffer, seed)


def recording_data(src: RecordingSource, g: int) -> StreamData:
    split = StreamSplit(src, src.n, np.zeros((1, 1), np.float32))
    return StreamData(DataBundle(split, split, DataSpec("classification", (1,), 2)), BatchPlan(g, 1), 0, seed=0,
                      device=torch.device("cpu"))


def served_ids(steps) -> list[list[int]]:
    return [[int(v) for x, _ in micro for v in x[:, 0].tolist()] for _, micro in steps]


def test_the_next_epoch_starts_half_way_through_this_one_and_serves_the_same_rows():
    n, g = 200, 10
    src = RecordingSource(n)
    data = recording_data(src, g)
    first = []
    for step, micro in data.epoch(0, then=1):
        first.append(micro)
        if step == n // g // 2 - 1:  # the step before half-way: epoch 1 not started yet
            assert ("split", 1) not in src.events
    assert src.events.index(("split", 1)) < len(src.events)  # built during epoch 0 ...
    data._ahead._thread.join(timeout=10)
    assert ("pull", 1) in src.events  # ... and its first batch pulled before epoch 1 was asked for
    ahead = served_ids(data.epoch(1))
    assert src.events.count(("split", 1)) == 1  # epoch 1 used the split built ahead
    fresh = served_ids(recording_data(RecordingSource(n), g).epoch(1))
    assert ahead == fresh and len(ahead) == n // g  # the same rows in the same steps as without the lookahead


def test_a_resume_mid_epoch_drops_the_split_built_ahead():
    src = RecordingSource(100)
    data = recording_data(src, 10)
    for _ in data.epoch(0, then=1):
        pass
    data.restore({"epoch": 1, "step": 2, "ids": np.arange(20)})  # as if the run resumed at epoch 1 step 2
    rest = served_ids(data.epoch(1, start_step=2))
    assert src.events.count(("split", 1)) == 2 and len(rest) == 8
    assert not set(range(20)) & {i for step in rest for i in step}


def test_an_error_reading_the_next_epoch_ahead_is_raised_when_that_epoch_starts():
    data = recording_data(RecordingSource(100, fail_epoch=1), 10)
    assert len(served_ids(data.epoch(0, then=1))) == 10  # epoch 0 trains in full
    with pytest.raises(OSError, match="epoch 1 are gone"):
        next(data.epoch(1))


class HeldSource(FakeSource):
    """FakeSource whose splits can be watched for their end (a split is its coordinator actor in Ray Data: it
    lives while rank 0 references it)."""

    class Split(list):
        pass

    def __init__(self, n: int):
        super().__init__(n)
        self.alive: dict[tuple[str, int], weakref.ref] = {}

    def split(self, part, epoch, seed, world, exclude, equal):
        s = self.Split(super().split(part, epoch, seed, world, exclude, equal))
        self.alive[part, epoch] = weakref.ref(s)
        return s

    def live(self, part: str, epoch: int) -> bool:
        gc.collect()
        return self.alive[part, epoch]() is not None


def test_rank_0_keeps_a_split_it_finished_until_the_next_step_has_run_on_every_rank():
    """Another rank may still read its tail of a split rank 0 has finished (seen: rank 1 failing mid-validation,
    its coordinator gone). The next step's all-reduce is where every rank is past it."""
    src = HeldSource(100)
    split = StreamSplit(src, src.n, np.zeros((1, 1), np.float32))
    data = StreamData(DataBundle(split, split, DataSpec("classification", (1,), 2)), BatchPlan(10, 1), 0, seed=0,
                      device=torch.device("cpu"))
    steps = data.epoch(0)
    next(steps)
    assert list(data.val_batches(10)) and src.live("val", 0)  # this rank's pass is done; the split lives on
    next(steps)
    assert not src.live("val", 0) and src.live("train", 0)  # a step later: gone; the epoch's own split still read
    for _ in steps:
        pass
    assert src.live("train", 0)  # the epoch ended on this rank: kept until the next epoch's first step has run
    later = data.epoch(1)
    next(later), next(later)
    assert not src.live("train", 0)


class CountingSource(FakeSource):
    """FakeSource that notes each split it builds, by part."""

    def __init__(self, n: int):
        super().__init__(n)
        self.splits: list[str] = []

    def split(self, part, epoch, seed, world, exclude, equal):
        self.splits.append(part)
        return super().split(part, epoch, seed, world, exclude, equal)


def counting_stream(n: int, g: int) -> tuple[StreamData, CountingSource]:
    src = CountingSource(n)
    split = StreamSplit(src, n, np.zeros((1, 1), np.float32))
    return StreamData(DataBundle(split, split, DataSpec("classification", (1,), 2)), BatchPlan(g, 1), 0, seed=0,
                      device=torch.device("cpu")), src


def test_the_first_validation_is_started_after_the_first_step_and_read_from_there_once():
    data, src = counting_stream(100, 10)
    steps = data.epoch(0)
    next(steps)
    assert src.splits == ["train"]  # the first step waits for nothing but its own batch
    next(steps)
    assert src.splits == ["train", "val"]  # started while the second step trains
    first = [x for x, _ in data.val_batches(256)]
    assert src.splits == ["train", "val"] and sum(len(x) for x in first) == 100  # the split started ahead, whole
    again = [x for x, _ in data.val_batches(256)]
    assert src.splits == ["train", "val"] and torch.equal(torch.cat(again), torch.cat(first))  # from the cache
    for _ in steps:
        pass
    list(data.epoch(1))
    assert src.splits == ["train", "val", "train"]  # nothing started ahead once validation has been read


def test_a_validation_before_the_second_step_reads_its_own_split_and_none_is_started_later():
    data, src = counting_stream(100, 10)
    steps = data.epoch(0)
    next(steps)
    assert sum(len(x) for x, _ in data.val_batches(256)) == 100
    for _ in steps:
        pass
    assert src.splits == ["train", "val"]
