"""Token datasets for ``model.name=gpt``: ``synthetic_tokens`` and byte-level ``text``.

Both are in-memory :class:`~elastic_train.data.TensorSet` of int64 ``x`` (N, seq_len) with ``y`` the same
tokens shifted by one, so they take the engine's fast path (a device gather per micro-batch) and its data
order. Only torch and numpy here (``bench/gpu.py`` builds them on a machine without pydantic or Ray).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from elastic_train.data.spec import DataBundle, DataSpec, TensorSet, split_indices
from elastic_train.errors import ConfigError

if TYPE_CHECKING:
    from elastic_train.config import JobConfig

BYTE_VOCAB = 256
MAX_STEP = 8  # synthetic_tokens: the largest stride of a sequence's progression


def _spec(job: JobConfig | Any) -> DataSpec:
    t = job.model.seq_len
    return DataSpec("language_model", (t,), job.model.vocab_size, tokens_per_sample=t)


def build_synthetic_tokens(job: JobConfig | Any) -> DataBundle:
    """``data.num_samples`` seeded sequences ``x_i = (start + stride * i) mod vocab_size``.

    Start and stride (1..8) are drawn per sequence: the first tokens are unpredictable, the rest follow from
    the two before them, so the loss falls from ln(vocab_size) towards 0 as a model learns the pattern.
    """
    n, t, v = job.data.num_samples, job.model.seq_len, job.model.vocab_size
    if v < 2:
        raise ConfigError("model.vocab_size", v, "synthetic_tokens needs at least 2 tokens")
    g = torch.Generator().manual_seed(20_011 + job.seed)
    start = torch.randint(0, v, (n, 1), generator=g)
    stride = torch.randint(1, min(MAX_STEP, v - 1) + 1, (n, 1), generator=g)
    seq = (start + stride * torch.arange(t + 1)) % v
    x, y = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
    tr, va = split_indices(n, job.data.val_fraction, job.seed)
    info = {"source": "synthetic arithmetic token sequences", "tokens": n * t}
    return DataBundle(TensorSet(x[tr], y[tr]), TensorSet(x[va], y[va]), _spec(job), info)


def read_text_bytes(path: str | None) -> tuple[np.ndarray, list[Path]]:
    """The bytes of a file, or of every non-hidden file under a folder (sorted by path, concatenated)."""
    if not path:
        raise ConfigError("data.path", path, "data.name=text needs a UTF-8 text file or a folder of them")
    root = Path(path).expanduser()
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = sorted(
            p
            for p in root.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
        )
    else:
        raise ConfigError("data.path", path, "no such file or folder")
    try:
        data = b"".join(f.read_bytes() for f in files)
    except OSError as e:
        raise ConfigError("data.path", path, f"cannot read ({e.strerror or e})") from None
    if not data:
        raise ConfigError("data.path", path, "is empty" if root.is_file() else "holds no (non-empty) files")
    return np.frombuffer(data, dtype=np.uint8), files


def _windows(tokens: torch.Tensor, t: int) -> TensorSet:
    """Non-overlapping windows of ``t`` inputs; each target window is the inputs shifted by one."""
    n = (len(tokens) - 1) // t
    return TensorSet(tokens[: n * t].view(n, t).clone(), tokens[1 : n * t + 1].view(n, t).clone())


def build_text(job: JobConfig | Any) -> DataBundle:
    """Byte-level tokens of ``data.path``; the last ``data.val_fraction`` of the bytes is the validation set.

    The split is contiguous (windows of one passage never land on both sides) and each side is cut into
    non-overlapping windows of ``model.seq_len`` tokens.
    """
    t, v = job.model.seq_len, job.model.vocab_size
    if v < BYTE_VOCAB:
        raise ConfigError("model.vocab_size", v, f"byte-level text needs at least {BYTE_VOCAB} tokens")
    raw, files = read_text_bytes(job.data.path)
    tokens = torch.from_numpy(raw.astype(np.int64))
    n_val = int(round(len(tokens) * job.data.val_fraction))
    train_tokens, val_tokens = tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val :]
    for name, part in (("training", train_tokens), ("validation", val_tokens)):
        if len(part) < t + 1:
            raise ConfigError(
                "model.seq_len", t,
                f"longer than the {name} text ({len(part)} of {len(tokens)} bytes in {job.data.path}; "
                f"a window needs seq_len + 1)",
            )
    info = {"source": str(job.data.path), "files": len(files), "tokens": len(tokens)}
    return DataBundle(_windows(train_tokens, t), _windows(val_tokens, t), _spec(job), info)
