"""Sample text from a trained language model: a checkpoint or an MLflow model, through its tokenizer.

    python -m jobs.generate --checkpoint results/RUN --prompt "Once upon a time" --max-new-tokens 200
    python -m jobs.generate --checkpoint results/RUN/checkpoint_000000500 --prompt "def " --temperature 0
    python -m jobs.generate --model models:/tiny-gpt/1 --prompt "The " --top-k 40 --seed 1 --num-samples 3

The tokenizer is the one the model was trained with: tokenizer.json inside the checkpoint (copied there from the
shards) or inside the MLflow model (logged with it), else beside the shards at the run's data.path, else
--tokenizer; byte-level for data.name=text. Runs
on the GPU when there is one (--device to choose). Exit codes: 0 done, 2 bad input (the message names it).
"""

from __future__ import annotations

import sys

from jobs._cli import EXIT_OK, ArgumentParser, add_model_source, guarded, write_json


def build_parser(prog: str = "python -m jobs.generate") -> ArgumentParser:
    import argparse

    p = ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_source(p)
    p.add_argument("--prompt", default="", help="text to continue (default: start from end-of-text)")
    p.add_argument("--max-new-tokens", type=int, default=100, help="tokens to generate (default 100)")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest tokens (default: all)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--num-samples", type=int, default=1, help="independent samples (seeds seed, seed+1, ...)")
    p.add_argument("--tokenizer", metavar="PATH", help="a tokenizer.json, when the run's is not found")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--json", metavar="PATH", help="write the samples here as JSON")
    return p


def main(argv: list[str] | None = None, prog: str = "python -m jobs.generate") -> int:
    args = build_parser(prog).parse_args(argv)
    return guarded(lambda: _generate(args))


def _generate(args) -> int:
    from elastic_train.launch.generation import generate_texts, load_for_generation

    loaded = load_for_generation(args.checkpoint, args.model, args.tokenizer, args.device)
    texts = generate_texts(loaded, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed,
                           args.num_samples)
    for i, text in enumerate(texts):
        if len(texts) > 1:
            print(f"--- sample {i + 1} (seed {args.seed + i})")
        print(args.prompt + text)
    write_json(args.json, {"source": loaded.source, "prompt": args.prompt, "samples": texts,
                           "temperature": args.temperature, "top_k": args.top_k, "seed": args.seed})
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
