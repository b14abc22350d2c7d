"""``data.name=tokens``: memory-mapped token shards (made by ``python -m jobs.prepare_tokens``).

Sample ``i`` is the window of ``seq_len + 1`` tokens starting at a fixed offset: shard ``k``, token
``(i - first_window[k]) * seq_len``; inputs are its first ``seq_len`` tokens, targets the last ``seq_len``. The
offset is a pure function of ``i``, and ``i`` a pure function of (seed, epoch, step, slot) through the engine's
sampler, so DESIGN invariant 3 holds exactly as for in-memory sets: a resume at the same world size is bitwise.

Nothing is loaded and nothing is mapped: every process opens the shards (lazily, so a pickled dataset stays
small) and :meth:`TokenWindows.gather` reads just the windows of one micro-batch, one positional read
(``os.preadv``) per window into one buffer. The process's memory is that buffer, whatever the corpus size: no
mapping grows its address space or its resident set with the corpus (an ``np.memmap`` of a shard larger than an
address-space limit cannot even be created), and the kernel's page cache, shared by every worker on a node and
reclaimable, is the only cache. Torch and numpy only.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import Dataset

from elastic_train.data.prepare import INDEX, TOKENIZER, read_index
from elastic_train.data.spec import DataBundle, DataSpec, SourceInfo
from elastic_train.errors import ConfigError

if TYPE_CHECKING:
    from elastic_train.config import JobConfig


class TokenWindows(Dataset):
    """Non-overlapping windows of ``seq_len + 1`` tokens over a list of shard files, read on demand."""

    MAX_OPEN = 256  # shard files held open at once (the oldest is closed beyond): far under any fd limit

    def __init__(self, files: list[str], tokens: list[int], dtype: str, seq_len: int, limit: int | None = None):
        self.files, self.dtype, self.t = list(files), np.dtype(dtype), seq_len
        per_shard = [max(0, (n - 1) // seq_len) for n in tokens]
        self.first = np.concatenate([[0], np.cumsum(per_shard)]).astype(np.int64)  # first window of shard k
        total = int(self.first[-1])
        self.n = total if limit is None else min(total, limit)
        self._fds: list[int | None] = [None] * len(self.files)
        self._opened: collections.deque[int] = collections.deque()

    def __len__(self) -> int:
        return self.n

    def __getstate__(self) -> dict[str, Any]:  # DataLoader workers / Ray: ship paths, not open files
        return {**self.__dict__, "_fds": [None] * len(self.files), "_opened": collections.deque()}

    def _fd(self, k: int) -> int:
        fd = self._fds[k]
        if fd is None:
            if len(self._opened) >= self.MAX_OPEN:
                old = self._opened.popleft()
                os.close(self._fds[old])
                self._fds[old] = None
            fd = self._fds[k] = os.open(self.files[k], os.O_RDONLY)
            self._opened.append(k)
        return fd

    def close(self) -> None:
        while self._opened:
            k = self._opened.popleft()
            fd, self._fds[k] = self._fds[k], None
            os.close(fd)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def gather(self, idx: torch.Tensor | np.ndarray | list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets (int64, (B, seq_len)) of windows ``idx``: one positional read per window."""
        ids = np.asarray(idx.cpu() if isinstance(idx, torch.Tensor) else idx, dtype=np.int64).reshape(-1)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.n):
            raise IndexError(f"window ids out of range [0, {self.n})")
        shard = np.searchsorted(self.first, ids, side="right") - 1
        offset = (ids - self.first[shard]) * (self.t * self.dtype.itemsize)
        buf = np.empty((len(ids), self.t + 1), dtype=self.dtype)
        want = buf.itemsize * (self.t + 1)
        for row, k, at in zip(buf, shard.tolist(), offset.tolist(), strict=True):
            got = os.preadv(self._fd(k), [row], at)
            if got != want:
                raise OSError(f"{self.files[k]}: short read at byte {at} ({got} of {want}); is the shard truncated?")
        w = torch.from_numpy(buf.astype(np.int64))
        return w[:, :-1], w[:, 1:]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.gather([i])
        return x[0], y[0]

    def __getitems__(self, ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        x, y = self.gather(ids)
        return list(zip(x, y, strict=True))


def split_windows(path: str | Path, index: dict[str, Any], split: str, seq_len: int,
                  limit: int | None = None) -> TokenWindows:
    root = Path(path).expanduser()
    shards = index[split]["shards"]
    return TokenWindows([str(root / s["file"]) for s in shards], [s["tokens"] for s in shards], index["dtype"],
                        seq_len, limit)


def build_tokens(job: JobConfig | Any) -> DataBundle:
    """The shards at ``data.path``; validation is the first ``data.val_tokens`` tokens' windows of the val split."""
    path, t, v = job.data.path, job.model.seq_len, job.model.vocab_size
    if not path:
        raise ConfigError("data.path", path, "data.name=tokens needs a folder made by python -m jobs.prepare_tokens")
    index = read_index(path)
    if index["vocab_size"] > v:
        raise ConfigError("model.vocab_size", v, f"smaller than the tokenizer of data.path={path} "
                                                 f"({index['vocab_size']} tokens); set model.vocab_size>="
                                                 f"{index['vocab_size']}")
    val_tokens = getattr(job.data, "val_tokens", None)
    limit = None if val_tokens is None else max(1, -(-val_tokens // t))
    train = split_windows(path, index, "train", t)
    val = split_windows(path, index, "val", t, limit)
    for split, part in (("train", train), ("val", val)):
        if len(part) == 0:
            raise ConfigError("model.seq_len", t, f"longer than every {split} shard in {path} "
                                                  f"({index[split]['tokens']} tokens; a window needs seq_len + 1)")
    spec = DataSpec("language_model", (t,), v, tokens_per_sample=t)
    info = {"source": str(path), "train_tokens": index["train"]["tokens"], "val_tokens": len(val) * t,
            "documents": index["documents"], "tokenizer_sha256": index["tokenizer"]["sha256"],
            "tokenizer_file": str(tokenizer_path(path))}
    source = SourceInfo(
        name="tokens", uri=str(path), digest=_index_digest(path), schema={"x": f"int64[{t}]", "y": f"int64[{t}]"},
        num_rows=len(train),
        profile={"train_tokens": index["train"]["tokens"], "val_tokens": index["val"]["tokens"],
                 "documents": index["documents"], "vocab_size": index["vocab_size"], "dtype": index["dtype"],
                 "tokenizer_sha256": index["tokenizer"]["sha256"]},
    )
    return DataBundle(train, val, spec, info, source)


def _index_digest(path: str | Path) -> str:
    return hashlib.sha256((Path(path).expanduser() / INDEX).read_bytes()).hexdigest()[:16]


def tokenizer_path(path: str | Path) -> Path:
    return Path(path).expanduser() / TOKENIZER
