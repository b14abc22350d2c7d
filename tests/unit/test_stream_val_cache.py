"""Two gloo ranks whose validation parts straddle the cache bound: both read a new split at the next validation
(before, the rank that kept its part read from memory while the other built a split, a broadcast that met the
validation's all-reduce). Real torch.distributed (gloo), 2 processes, no Ray: ~3 s."""

import socket

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from elastic_train.data.batching import BatchPlan
from elastic_train.data.spec import DataBundle, DataSpec, StreamSplit
from elastic_train.data.stream import StreamData


class UnevenSource:
    """Validation parts of 10 rows (rank 0) and 30 rows (rank 1), as an unequal split can give."""

    def __init__(self, log):
        self.log = log

    def split(self, part, epoch, seed, world, exclude, equal):
        self.log.append(part)
        return [np.arange(10), np.arange(10, 40)]

    def batches(self, it, batch_size, prefetch, shuffle_buffer, seed):
        for a in range(0, len(it), batch_size):
            ids = it[a:a + batch_size]
            yield torch.tensor(ids, dtype=torch.float32)[:, None], torch.zeros(len(ids), dtype=torch.long), ids


class SmallCache(StreamData):
    VAL_CACHE_MAX_BYTES = 20 * 4 + 20 * 8  # 20 rows of (x float32, y int64): rank 0's part fits, rank 1's not


def _rank(rank: int, port: int, out) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    log: list[str] = []
    split = StreamSplit(UnevenSource(log), 40, np.zeros((1, 1), np.float32))
    data = SmallCache(DataBundle(split, split, DataSpec("classification", (1,), 2)), BatchPlan(2, 2), rank, seed=0,
                      device=torch.device("cpu"))
    sums = []
    for _ in range(2):
        total = torch.tensor([sum(float(x.sum()) for x, _ in data.val_batches(8))])
        dist.all_reduce(total)  # the validation's own all-reduce
        sums.append(total.item())
    out.put((rank, log, sums))
    dist.destroy_process_group()


def test_ranks_agree_whether_to_keep_their_validation_part():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    try:  # a mismatched collective hangs both ranks: bounded here
        results = dict((r, (log, sums)) for r, log, sums in (out.get(timeout=60) for _ in procs))
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    total = float(sum(range(40)))
    assert results[0] == (["val", "val"], [total, total])  # rank 0 read a new split too: none was kept
    assert results[1][1] == [total, total]
