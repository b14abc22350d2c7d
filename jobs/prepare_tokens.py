"""Tokenize a text corpus into memory-mappable token shards for data.name=tokens (data.path=OUT).

    python -m jobs.prepare_tokens corpus/ --out data/shards --vocab-size 8192          # BPE trained on the corpus
    python -m jobs.prepare_tokens docs.jsonl --text-field body --out data/shards --tokenizer my/tokenizer.json
    python -m jobs.prepare_tokens part-0.parquet --text-column text --out data/shards --tokenizer bytes

Inputs: text files (cut into documents at blank lines), folders of them, JSONL (one document per line, the
--text-field), Parquet (one per row, the --text-column). Output: train_*.bin / val_*.bin (uint16, or uint32 when
the vocabulary needs it), tokenizer.json and index.json. Re-running with the same inputs and settings reuses the
result. Exit codes: 0 done, 2 bad input (the message names it), 130 interrupted.
"""

from __future__ import annotations

import sys

from jobs._cli import EXIT_OK, ArgumentParser, guarded, write_json


def build_parser(prog: str = "python -m jobs.prepare_tokens") -> ArgumentParser:
    import argparse

    from elastic_train.data.prepare import PrepareSettings

    d = PrepareSettings()
    p = ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="text/JSONL/Parquet files or folders of them")
    p.add_argument("--out", required=True, metavar="DIR", help="where the shards, tokenizer.json and index.json go")
    p.add_argument("--tokenizer", default=d.tokenizer, metavar="bpe|bytes|PATH",
                   help="bpe: train a byte-level BPE here; bytes: 256 byte ids; PATH: a tokenizer.json (default bpe)")
    p.add_argument("--vocab-size", type=int, default=d.vocab_size, help=f"bpe vocabulary (default {d.vocab_size})")
    p.add_argument("--text-field", default=d.text_field, help="JSONL: the field holding the text (default text)")
    p.add_argument("--text-column", default=d.text_column, help="Parquet: the text column (default text)")
    p.add_argument("--val-fraction", type=float, default=d.val_fraction,
                   help=f"share of documents held out for validation (default {d.val_fraction})")
    p.add_argument("--shard-tokens", type=int, default=d.shard_tokens, help="tokens per shard file")
    p.add_argument("--dtype", default=d.dtype, choices=["auto", "uint16", "uint32"], help="token id type")
    p.add_argument("--workers", type=int, default=None, help="tokenizer processes (default: every core)")
    p.add_argument("--force", action="store_true", help="tokenize again even if the output matches")
    p.add_argument("--summary-json", metavar="PATH", help="write the index here too")
    return p


def main(argv: list[str] | None = None, prog: str = "python -m jobs.prepare_tokens") -> int:
    args = build_parser(prog).parse_args(argv)
    return guarded(lambda: _prepare(args))


def _prepare(args) -> int:
    from elastic_train.data.prepare import PrepareSettings, prepare, stderr_progress

    settings = PrepareSettings(tokenizer=args.tokenizer, vocab_size=args.vocab_size, text_field=args.text_field,
                               text_column=args.text_column, val_fraction=args.val_fraction,
                               shard_tokens=args.shard_tokens, dtype=args.dtype)
    index = prepare(args.inputs, args.out, settings, workers=args.workers, progress=stderr_progress,
                    force=args.force)
    print(f"train with: data.name=tokens data.path={args.out} model.vocab_size={index['vocab_size']}")
    write_json(args.summary_json, index)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
