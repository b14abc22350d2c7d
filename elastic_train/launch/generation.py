"""What ``jobs.generate`` does on the driver: load a trained model and its tokenizer, sample text.

The tokenizer is found where training left it: ``tokenizer.json`` in the checkpoint (the worker copies it there
from the shards) or inside the logged model (``extra_files/``), else beside the shards at the run's
``data.path``; byte-level text needs none. Sampling itself
is :func:`elastic_train.models.sampling.sample` (pure torch).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from elastic_train.config import ConfigError
from elastic_train.data.prepare import TOKENIZER, ByteTokenizer, HFTokenizer, load_tokenizer
from elastic_train.models.sampling import sample


@dataclass
class Loaded:
    model: torch.nn.Module
    tokenizer: ByteTokenizer | HFTokenizer
    context: int
    device: torch.device
    source: str


def load_for_generation(checkpoint: str | None, model_uri: str | None, tokenizer: str | None,
                        device: str = "auto") -> Loaded:
    """The model (on ``device``), its tokenizer and context length; ConfigError naming what is missing."""
    from elastic_train.launch import context
    from elastic_train.launch.evaluation import load_source

    backend = context.tracking_backend(context.plan(None, [])) if model_uri else None  # the jobs' own store
    model, config, info = load_source(checkpoint, model_uri, backend)
    flag, value = ("--checkpoint", checkpoint) if checkpoint else ("--model", model_uri)
    if config.get("model", {}).get("name") != "gpt" and not hasattr(model, "seq_len"):
        raise ConfigError(flag, value, f"holds a {config.get('model', {}).get('name')!r} model, not a language model")
    tok = _find_tokenizer(tokenizer, info.get("source"), config, flag, value, info.get("extra_files") or {})
    if not hasattr(model, "seq_len"):
        model = _rebuilt(model, config, info.get("data_spec"), flag, value)
    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
    context = int(getattr(model, "seq_len", config["model"]["seq_len"]))
    return Loaded(model.to(dev).eval(), tok, context, dev, str(info.get("source")))


def _rebuilt(model: torch.nn.Module, config: dict[str, Any], data_spec: dict[str, Any] | None, flag: str,
             value: str | None) -> torch.nn.Module:
    """The GPT itself, from a logged model that MLflow stored as a traced graph (``torch.export``, MLflow 3's
    default): a graph cannot switch to eval mode and is traced at one sequence length, so sampling rebuilds the
    module from the model's recorded config and loads the graph's weights (the same names)."""
    from elastic_train.config import JobConfig
    from elastic_train.data import DataSpec
    from elastic_train.models import build_model

    if not data_spec:
        raise ConfigError(flag, value, "holds a traced model without the data spec to rebuild it from")
    spec = DataSpec(**{**data_spec, "input_shape": tuple(data_spec["input_shape"])})
    module = build_model(JobConfig.model_validate(config), spec)
    module.load_state_dict(model.state_dict())
    return module


def _find_tokenizer(given: str | None, source: str | None, config: dict[str, Any], flag: str,
                    value: str | None, extra_files: dict[str, str]) -> ByteTokenizer | HFTokenizer:
    if given:
        if not os.path.isfile(given):
            raise ConfigError("--tokenizer", given, "no such file")
        return load_tokenizer(Path(given).read_text())
    if TOKENIZER in extra_files:  # an MLflow model logged from token shards carries it
        return load_tokenizer(extra_files[TOKENIZER])
    data = config.get("data", {})
    candidates = [Path(source) / TOKENIZER] if source and "://" not in source else []
    if data.get("path"):
        candidates.append(Path(data["path"]).expanduser() / TOKENIZER)
    for path in candidates:
        if path.is_file():
            return load_tokenizer(path.read_text())
    if data.get("name") in ("text", "synthetic_tokens"):
        return ByteTokenizer()
    looked = ", ".join(str(p) for p in candidates) or "nowhere"
    raise ConfigError(flag, value, f"no {TOKENIZER} found (looked in {looked}); pass --tokenizer PATH")


def encode_prompt(tok: ByteTokenizer | HFTokenizer, prompt: str) -> list[int]:
    """The prompt's ids; an empty prompt starts from end-of-text (what precedes every document)."""
    if not prompt:
        return [tok.eos_id]
    return [int(i) for i in tok.encode_batch([prompt])[0]]


def generate_texts(loaded: Loaded, prompt: str, max_new_tokens: int, temperature: float, top_k: int | None,
                   seed: int, num_samples: int = 1) -> list[str]:
    """``num_samples`` continuations of ``prompt`` (seeds ``seed``, ``seed + 1``, ...), decoded."""
    if max_new_tokens < 1:
        raise ConfigError("--max-new-tokens", max_new_tokens, "must be >= 1")
    if temperature < 0:
        raise ConfigError("--temperature", temperature, "must be >= 0 (0 = greedy)")
    if top_k is not None and top_k < 1:
        raise ConfigError("--top-k", top_k, "must be >= 1")
    ids = encode_prompt(loaded.tokenizer, prompt)
    out = []
    for i in range(num_samples):
        new = sample(loaded.model, ids, max_new_tokens, loaded.context, temperature, top_k, seed + i,
                     stop_id=loaded.tokenizer.eos_id, device=loaded.device)
        out.append(loaded.tokenizer.decode(new))
    return out


SAMPLE_PROMPTS = ("", "The ", "In ")


def log_samples(ctx: Any, spec: Any, checkpoint_uri: str, max_new_tokens: int = 64) -> dict[str, Any]:
    """Into the finished run's artifacts under ``tokens/``: the tokenizer and a few greedy and sampled texts
    from the final checkpoint (``samples.txt``), so the run shows what the model writes."""
    import tempfile

    from ray.train import Checkpoint

    from elastic_train.train.state import load_model
    from tracking import backend_for

    with Checkpoint(checkpoint_uri).as_directory() as d:
        model, cfg, _ = load_model(d)
        tok_file = Path(d) / TOKENIZER
        if not tok_file.is_file():
            return {}
        tok_text = tok_file.read_text()
    loaded = Loaded(model, load_tokenizer(tok_text), cfg.model.seq_len, torch.device("cpu"), checkpoint_uri)
    lines = []
    for prompt in SAMPLE_PROMPTS:
        for temperature in (0.0, 0.8):
            text = generate_texts(loaded, prompt, max_new_tokens, temperature, 40, seed=0)[0]
            lines.append(f"--- prompt {prompt!r}, temperature {temperature}, top-k 40, seed 0\n{prompt}{text}\n")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / TOKENIZER).write_text(tok_text)
        (Path(tmp) / "samples.txt").write_text("\n".join(lines))
        backend_for(spec, ctx.home).log_artifacts(spec, tmp, artifact_path="tokens")
    return {"samples_artifact": "tokens/samples.txt"}
