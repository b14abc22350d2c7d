"""Turn a text corpus into token shards: flat ``uint16``/``uint32`` arrays on disk plus ``index.json``.

    documents  ->  tokenizer (byte-level BPE trained here, a given tokenizer.json, or raw bytes)
               ->  [doc tokens, EOS, doc tokens, EOS, ...]  ->  train_000000.bin ... val_000000.bin

Inputs are read as a stream of documents (a text file is cut at blank lines, a JSONL line or a Parquet row is
one document), tokenized by a process pool in chunks, and written in corpus order: memory holds a few chunks,
never the corpus. A document goes to the validation split by its index alone (evenly spaced, ``val_fraction``
of them), so the split never cuts a document. ``index.json`` records what a rerun with the same inputs and
settings may reuse (``inputs_sha256``). Torch-free: numpy, ``tokenizers`` and, for Parquet, ``pyarrow``.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from elastic_train.errors import ConfigError
from elastic_train.files import write_json_atomically

INDEX = "index.json"
TOKENIZER = "tokenizer.json"
EOS_TOKEN = "<|endoftext|>"
FORMAT_VERSION = 1
TEXT_SUFFIXES = (".txt", ".md", ".text", ".rst", ".py")
UINT16_MAX_VOCAB = 1 << 16


@dataclass(frozen=True)
class PrepareSettings:
    """What decides the shards' content (hashed with the inputs: same settings + inputs = reuse)."""

    tokenizer: str = "bpe"  # bpe (trained here) | bytes | a path to a tokenizer.json
    vocab_size: int = 4096  # bpe: target vocabulary, EOS included
    text_field: str = "text"  # JSONL
    text_column: str = "text"  # Parquet
    val_fraction: float = 0.01  # share of documents held out
    shard_tokens: int = 50_000_000  # tokens per .bin file
    chunk_docs: int = 512  # documents per pool task
    dtype: str = "auto"  # auto (uint16 when the vocabulary fits, else uint32) | uint16 | uint32


# ------------------------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class InputFile:
    """One input file, local or in an object store (``s3://``, ``gs://``... through ``pyarrow.fs``)."""

    name: str  # a local path or a URI
    size: int
    mtime_ns: int
    fs: Any = None  # a pyarrow FileSystem for URIs; None for local files
    fs_path: str = ""

    def open(self) -> Any:
        """A seekable binary file."""
        if self.fs is None:
            return open(self.name, "rb")  # the caller closes it
        return self.fs.open_input_file(self.fs_path)


def list_inputs(paths: list[str]) -> list[InputFile]:
    """Every input file, in a fixed order: files as given, folders' non-hidden files sorted by path."""
    files: list[InputFile] = []
    for raw in paths:
        if "://" in raw:
            files += _list_uri(raw)
            continue
        p = Path(raw).expanduser()
        if p.is_file():
            found = [p]
        elif p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file()
                           and not any(part.startswith(".") for part in f.relative_to(p).parts))
        else:
            raise ConfigError("input", raw, "no such file or folder")
        files += [InputFile(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in found]
    if not files:
        raise ConfigError("input", " ".join(paths), "holds no files")
    return files


def _list_uri(uri: str) -> list[InputFile]:
    """A file or a folder (prefix) in an object store, through ``pyarrow.fs``: credentials and endpoint from the
    standard AWS environment, every wait bounded (:mod:`elastic_train.data.filesystems`)."""
    import pyarrow.fs as pafs

    from elastic_train.data.filesystems import explain, resolve

    try:
        fs, root = resolve(uri)
        info = fs.get_file_info(root)
        if info.type == pafs.FileType.File:
            infos = [info]
        elif info.type == pafs.FileType.Directory:
            infos = sorted((i for i in fs.get_file_info(pafs.FileSelector(root, recursive=True))
                            if i.type == pafs.FileType.File and not i.base_name.startswith(".")),
                           key=lambda i: i.path)
        else:
            raise ConfigError("input", uri, "no such file or folder")
    except (OSError, ValueError) as e:  # unreachable endpoint, bad credentials, unknown scheme
        raise ConfigError("input", uri, f"cannot list it ({explain(e)})") from None
    scheme = uri.split("://", 1)[0]
    return [InputFile(f"{scheme}://{i.path}", i.size or 0, i.mtime_ns or 0, fs, i.path) for i in infos]


def _kind(path: InputFile) -> str:
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    return "text"


def iter_documents(files: list[InputFile], s: PrepareSettings) -> Iterator[str]:
    """The corpus as a stream of non-empty documents, in file order."""
    for path in files:
        kind = _kind(path)
        if kind == "jsonl":
            yield from _jsonl_docs(path, s.text_field)
        elif kind == "parquet":
            yield from _parquet_docs(path, s.text_column)
        else:
            yield from _text_docs(path)


def _text_docs(path: InputFile) -> Iterator[str]:
    """Paragraphs: runs of lines separated by blank lines (memory: one paragraph)."""
    lines: list[str] = []
    try:
        with io.TextIOWrapper(path.open(), encoding="utf-8", errors="replace", newline="") as f:
            for line in f:
                if line.strip():
                    lines.append(line)
                elif lines:
                    yield "".join(lines).rstrip("\n")
                    lines = []
    except OSError as e:
        raise ConfigError("input", path.name, f"cannot read ({e.strerror or e})") from None
    if lines:
        yield "".join(lines).rstrip("\n")


def _jsonl_docs(path: InputFile, field: str) -> Iterator[str]:
    import gzip

    raw = path.open()
    binary = gzip.open(raw) if path.name.endswith(".gz") else raw
    with io.TextIOWrapper(binary, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError("input", f"{path.name}:{n}", f"not a JSON line ({e.msg})") from None
            if not isinstance(row, dict) or field not in row:
                keys = ", ".join(sorted(row)) if isinstance(row, dict) else type(row).__name__
                raise ConfigError("--text-field", field, f"missing in {path.name} line {n} (it has: {keys})")
            if row[field]:
                yield str(row[field])


def _parquet_docs(path: InputFile, column: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path.open())
    names = pf.schema_arrow.names
    if column not in names:
        raise ConfigError("--text-column", column, f"missing in {path.name} (columns: {', '.join(names)})")
    for batch in pf.iter_batches(columns=[column], batch_size=4096):
        for text in batch.column(0).to_pylist():
            if text:
                yield text


def inputs_digest(files: list[InputFile], s: PrepareSettings, tokenizer_sha: str) -> str:
    """sha256 of the input listing (path, size, mtime), the settings and the tokenizer: the reuse key."""
    h = hashlib.sha256(json.dumps(asdict(s), sort_keys=True).encode())
    h.update(tokenizer_sha.encode())
    for f in files:
        h.update(f"{f.name}\0{f.size}\0{f.mtime_ns}\n".encode())
    return h.hexdigest()


# ------------------------------------------------------------------------------------------- tokenizers


class ByteTokenizer:
    """Raw UTF-8 bytes, 256 ids; EOS is byte 0 (NUL), which text does not use."""

    vocab_size = 256
    eos_id = 0

    def encode_batch(self, docs: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(d.encode("utf-8"), dtype=np.uint8) for d in docs]

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 < i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A Hugging Face ``tokenizers`` tokenizer with an EOS token."""

    def __init__(self, tok: Any, eos_id: int):
        self.tok, self.eos_id = tok, eos_id
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)

    def encode_batch(self, docs: list[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.int64) for e in self.tok.encode_batch(docs, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)


def train_bpe(docs: Iterator[str], vocab_size: int) -> Any:
    """A byte-level BPE (GPT-2 style: every byte is a token, so any text round-trips) trained on ``docs``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


def load_tokenizer(json_text: str) -> ByteTokenizer | HFTokenizer:
    """The tokenizer stored beside shards (or in a checkpoint): ``{"kind": "bytes"}`` or a tokenizers JSON."""
    data = json.loads(json_text)
    if data.get("kind") == "bytes":
        return ByteTokenizer()
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(json_text)
    eos = tok.token_to_id(EOS_TOKEN)
    if eos is None:  # a user's tokenizer: its own end-of-text token, if it has one we know
        for name in ("</s>", "<eos>", "[SEP]", "<|end_of_text|>"):
            eos = tok.token_to_id(name)
            if eos is not None:
                break
    if eos is None:
        raise ConfigError("--tokenizer", "tokenizer.json", f"has no end-of-text token (looked for {EOS_TOKEN!r})")
    return HFTokenizer(tok, eos)


def tokenizer_json(files: list[InputFile], s: PrepareSettings) -> str:
    """The tokenizer as JSON text: trained on the corpus (bpe), read from a file, or the byte tokenizer."""
    if s.tokenizer == "bytes":
        return json.dumps({"kind": "bytes", "vocab_size": 256, "eos_id": 0})
    if s.tokenizer == "bpe":
        if s.vocab_size < 257 + 1:
            raise ConfigError("--vocab-size", s.vocab_size, "a byte-level BPE needs more than 257 (256 bytes + EOS)")
        docs = iter_documents(files, s)
        first = next(docs, None)
        if first is None:
            raise ConfigError("input", files[0].name if len(files) == 1 else f"{len(files)} files",
                              "the corpus is empty")
        return train_bpe(_chain(first, docs), s.vocab_size).to_str()
    path = Path(s.tokenizer).expanduser()
    if not path.is_file():
        raise ConfigError("--tokenizer", s.tokenizer, "no such tokenizer.json (or use bpe | bytes)")
    text = path.read_text()
    load_tokenizer(text)  # checks it parses and has an EOS
    return text


def _chain(first: str, rest: Iterator[str]) -> Iterator[str]:
    yield first
    yield from rest


# ------------------------------------------------------------------------------------------- the pool

_WORKER_TOKENIZER: ByteTokenizer | HFTokenizer | None = None


def _init_worker(json_text: str) -> None:
    global _WORKER_TOKENIZER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core already
    _WORKER_TOKENIZER = load_tokenizer(json_text)


def is_val_doc(i: int, val_fraction: float) -> bool:
    """Document ``i`` is held out: evenly spaced, ``val_fraction`` of all documents, a pure function of i."""
    return math.floor((i + 1) * val_fraction) > math.floor(i * val_fraction)


def _encode_chunk(args: tuple[int, list[str], float]) -> tuple[np.ndarray, np.ndarray, int, int, int]:
    """(train tokens, val tokens, train docs, val docs, bytes) of one chunk, each document followed by EOS."""
    first, docs, val_fraction = args
    tok = _WORKER_TOKENIZER
    assert tok is not None
    eos = np.array([tok.eos_id], dtype=np.int64)
    parts: dict[bool, list[np.ndarray]] = {False: [], True: []}
    for i, ids in enumerate(tok.encode_batch(docs)):
        parts[is_val_doc(first + i, val_fraction)] += [ids.astype(np.int64, copy=False), eos]
    cat = [np.concatenate(parts[v]) if parts[v] else np.zeros(0, np.int64) for v in (False, True)]
    return cat[0], cat[1], len(parts[False]) // 2, len(parts[True]) // 2, sum(len(d.encode()) for d in docs)


def _chunks(docs: Iterator[str], size: int, val_fraction: float) -> Iterator[tuple[int, list[str], float]]:
    chunk: list[str] = []
    first = 0
    for doc in docs:
        chunk.append(doc)
        if len(chunk) == size:
            yield first, chunk, val_fraction
            first, chunk = first + size, []
    if chunk:
        yield first, chunk, val_fraction


def _bounded_map(pool: ProcessPoolExecutor, fn: Callable, items: Iterator, depth: int) -> Iterator:
    """``pool.map`` in order, at most ``depth`` tasks in flight (so the reader never runs ahead of the writer)."""
    pending: list = []
    for item in items:
        pending.append(pool.submit(fn, item))
        if len(pending) >= depth:
            yield pending.pop(0).result()
    for fut in pending:
        yield fut.result()


class ShardWriter:
    """Appends tokens to ``<split>_NNNNNN.bin`` files of at most ``shard_tokens`` tokens each."""

    def __init__(self, out: Path, split: str, dtype: np.dtype, shard_tokens: int):
        self.out, self.split, self.dtype, self.limit = out, split, dtype, shard_tokens
        self.shards: list[dict[str, Any]] = []
        self._f = None
        self.documents = 0

    def write(self, tokens: np.ndarray, documents: int) -> None:
        self.documents += documents
        pos = 0
        while pos < len(tokens):
            if self._f is None or self.shards[-1]["tokens"] >= self.limit:
                self._open()
            room = self.limit - self.shards[-1]["tokens"]
            part = tokens[pos : pos + room].astype(self.dtype)
            self._f.write(part.tobytes())
            self.shards[-1]["tokens"] += len(part)
            pos += len(part)

    def _open(self) -> None:
        if self._f is not None:
            self._f.close()
        name = f"{self.split}_{len(self.shards):06d}.bin"
        self._f = open(self.out / name, "wb")  # closed in _open/close
        self.shards.append({"file": name, "tokens": 0})

    def close(self) -> dict[str, Any]:
        if self._f is not None:
            self._f.close()
        return {"shards": self.shards, "tokens": sum(s["tokens"] for s in self.shards), "documents": self.documents}


# ------------------------------------------------------------------------------------------- prepare


def prepare(inputs: list[str], out_dir: str, s: PrepareSettings, workers: int | None = None,
            progress: Callable[[str], None] | None = None, force: bool = False) -> dict[str, Any]:
    """Tokenize ``inputs`` into ``out_dir`` (or reuse what a previous identical run wrote); the index."""
    say = progress or (lambda line: None)
    files = list_inputs(inputs)
    if not 0.0 < s.val_fraction < 1.0:
        raise ConfigError("--val-fraction", s.val_fraction, "must be between 0 and 1 (exclusive)")
    out = Path(out_dir).expanduser()
    tok_json = _reuse_tokenizer(out, files, s) or tokenizer_json(files, s)
    tok = load_tokenizer(tok_json)
    tok_sha = hashlib.sha256(tok_json.encode()).hexdigest()
    digest = inputs_digest(files, s, tok_sha)
    old = read_index(out) if (out / INDEX).is_file() else None
    if old and old.get("inputs_sha256") == digest and not force:
        say(f"reusing {out} (same inputs and settings: {old['train']['tokens']:,} train tokens)")
        return old
    dtype = token_dtype(tok.vocab_size, s.dtype)
    out.mkdir(parents=True, exist_ok=True)
    (out / INDEX).unlink(missing_ok=True)  # a half-written folder has no index: never reused
    for old_bin in out.glob("*.bin"):
        old_bin.unlink()
    train_w, val_w = (ShardWriter(out, split, dtype, s.shard_tokens) for split in ("train", "val"))
    t0, last, nbytes = time.monotonic(), 0.0, 0
    workers = workers or max(1, (os.cpu_count() or 1))
    with ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(tok_json,)) as pool:
        chunks = _chunks(iter_documents(files, s), s.chunk_docs, s.val_fraction)
        for tr, va, n_tr, n_va, b in _bounded_map(pool, _encode_chunk, chunks, depth=2 * workers):
            train_w.write(tr, n_tr)
            val_w.write(va, n_va)
            nbytes += b
            now = time.monotonic()
            if now - last >= 2.0:
                last = now
                n_tok = sum(x["tokens"] for x in train_w.shards + val_w.shards)
                say(f"tokenized {train_w.documents + val_w.documents:,} documents, {n_tok:,} tokens, "
                    f"{nbytes / 1e6:.1f} MB ({n_tok / (now - t0):,.0f} tokens/s)")
    train, val = train_w.close(), val_w.close()
    if train["documents"] + val["documents"] == 0:
        raise ConfigError("input", " ".join(inputs), "the corpus is empty (no non-blank documents)")
    if val["documents"] == 0:
        raise ConfigError("--val-fraction", s.val_fraction,
                          f"holds out no document of {train['documents']} (raise it, or give more documents)")
    if train["documents"] == 0:
        raise ConfigError("--val-fraction", s.val_fraction, "leaves no training document")
    (out / TOKENIZER).write_text(tok_json)
    wall = time.monotonic() - t0
    index = {
        "format_version": FORMAT_VERSION, "dtype": dtype.name, "vocab_size": tok.vocab_size, "eos_id": tok.eos_id,
        "tokenizer": {"kind": s.tokenizer if s.tokenizer in ("bpe", "bytes") else "file",
                      "source": s.tokenizer, "file": TOKENIZER, "sha256": tok_sha},
        "documents": train["documents"] + val["documents"], "train": train, "val": val,
        "inputs": [f.name for f in files[:100]], "input_files": len(files), "input_bytes": nbytes,
        "settings": asdict(s), "inputs_sha256": digest,
        "prepare": {"wall_s": round(wall, 3), "workers": workers,
                    "tokens_per_s": round((train["tokens"] + val["tokens"]) / max(wall, 1e-9))},
    }
    write_json_atomically(out / INDEX, index)  # written last, atomically: a folder with an index is complete
    say(f"wrote {out}: {train['tokens']:,} train + {val['tokens']:,} val tokens in "
        f"{len(train['shards']) + len(val['shards'])} shard(s), {index['documents']:,} documents, "
        f"vocab {tok.vocab_size} ({dtype.name}), {wall:.1f} s")
    return index


def token_dtype(vocab_size: int, wanted: str = "auto") -> np.dtype:
    """uint16 when every id fits (vocabulary <= 65536), else uint32; ConfigError when ``wanted`` is too small."""
    if wanted not in ("auto", "uint16", "uint32"):
        raise ConfigError("--dtype", wanted, "use auto, uint16 or uint32")
    if vocab_size > np.iinfo(np.uint32).max + 1:
        raise ConfigError("--vocab-size", vocab_size, "too large for uint32 token ids")
    if wanted == "uint16" and vocab_size > UINT16_MAX_VOCAB:
        raise ConfigError("--dtype", wanted, f"cannot hold a vocabulary of {vocab_size} (ids up to 65535); use uint32")
    if wanted == "auto":
        wanted = "uint16" if vocab_size <= UINT16_MAX_VOCAB else "uint32"
    return np.dtype(wanted)


def _reuse_tokenizer(out: Path, files: list[InputFile], s: PrepareSettings) -> str | None:
    """A previous run's trained BPE, when the inputs and settings match (training it is the slow part)."""
    if s.tokenizer != "bpe" or not (out / INDEX).is_file() or not (out / TOKENIZER).is_file():
        return None
    old = json.loads((out / INDEX).read_text())
    text = (out / TOKENIZER).read_text()
    sha = hashlib.sha256(text.encode()).hexdigest()
    return text if old.get("inputs_sha256") == inputs_digest(files, s, sha) else None


def read_index(directory: str | Path, field: str = "data.path") -> dict[str, Any]:
    """``index.json`` of a shard folder; ConfigError naming ``field`` when it is not one."""
    p = Path(directory).expanduser() / INDEX
    if not p.is_file():
        raise ConfigError(field, str(directory), f"no {INDEX} there; make shards with python -m jobs.prepare_tokens")
    index = json.loads(p.read_text())
    if index.get("format_version") != FORMAT_VERSION:
        raise ConfigError(field, str(directory), f"{INDEX} format {index.get('format_version')} is not supported")
    return index


def stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
