"""Autoregressive sampling from a next-token model: temperature, top-k, a seeded generator. Torch only.

Works with any module mapping ids ``(B, T)`` to logits ``(B, T, V)`` (the GPT, a user's model); the context is
cropped to the model's last ``context`` tokens, as the position table allows no more.
"""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def sample(model: nn.Module, prompt: list[int], max_new_tokens: int, context: int, temperature: float = 1.0,
           top_k: int | None = None, seed: int = 0, stop_id: int | None = None,
           device: torch.device | str = "cpu") -> list[int]:
    """The prompt's continuation (new ids only). ``temperature=0`` is greedy; ``stop_id`` ends it early."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    model.eval()
    g = torch.Generator(device=device).manual_seed(seed)
    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    out: list[int] = []
    for _ in range(max_new_tokens):
        logits = model(ids[:, -context:])[0, -1].float()
        nxt = next_token(logits, temperature, top_k, g)
        if stop_id is not None and nxt == stop_id:
            break
        out.append(nxt)
        ids = torch.cat([ids, torch.tensor([[nxt]], device=device)], dim=1)
    return out


def next_token(logits: torch.Tensor, temperature: float, top_k: int | None, g: torch.Generator) -> int:
    """One id from a ``(V,)`` logit vector: argmax at temperature 0, else a draw among the ``top_k`` best."""
    if temperature == 0:
        return int(logits.argmax())
    logits = logits / temperature
    if top_k is not None and top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=g))
