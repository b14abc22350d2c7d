"""A decoder-only transformer (GPT-2 layout, nanoGPT-sized code) for ``model.name=gpt``.

Pre-norm blocks of causal self-attention and a 4x GELU MLP; attention goes through
``F.scaled_dot_product_attention(is_causal=True)``, which picks the fused flash / memory-efficient kernel the
device has. The output head shares its weight with the token embedding (as GPT-2 does), so a 12-layer,
768-wide model with a 50304-token vocabulary has ~124M parameters.

Only torch here: no Ray, no MLflow, no pydantic (``bench/gpu.py`` runs this on a machine with torch alone).
The config argument only needs the attributes ``n_layer, n_head, d_model, seq_len, vocab_size, dropout``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from elastic_train.errors import ConfigError

if TYPE_CHECKING:
    from elastic_train.config import ModelConfig
    from elastic_train.data import DataSpec


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int, dropout: float):
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))


class FeedForward(nn.Module):
    def __init__(self, d_model: int, dropout: float):
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model, bias=False)
        self.proj = nn.Linear(4 * d_model, d_model, bias=False)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x), approximate="tanh")))


class Block(nn.Module):
    """``x + attn(ln(x))`` then ``x + mlp(ln(x))``: one unit of sharding, compilation and recomputation."""

    def __init__(self, d_model: int, n_head: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = FeedForward(d_model, dropout)
        # Recompute this block's activations in backward (train.activation_checkpointing). Inside forward,
        # so FSDP's hooks stay outside the checkpointed region and torch.compile traces it as one graph.
        self.checkpointing = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token ids ``(B, T)`` -> next-token logits ``(B, T, vocab_size)``."""

    def __init__(self, n_layer: int, n_head: int, d_model: int, seq_len: int, vocab_size: int, dropout: float = 0.0):
        super().__init__()
        self.n_layer, self.n_head, self.d_model, self.seq_len = n_layer, n_head, d_model, seq_len
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(seq_len, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying (GPT-2)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: scale the residual projections by 1/sqrt(2 * n_layer)
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def set_activation_checkpointing(self, enabled: bool) -> None:
        """Trade ~1/3 more compute for activation memory; MFU still counts model FLOPs only."""
        for block in self.blocks:  # a block compiled by fsdp.shard_model is compiled in place: still the block
            block.checkpointing = enabled

    def shard_units(self) -> list[nn.Module]:
        """Modules that FSDP shards (and compiles) one by one; the root takes the embeddings and the head."""
        return list(self.blocks)

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token at context ``seq_len``, forward + backward (PaLM appendix B, nanoGPT).

        ``6 N`` for the matmuls (2 forward, 4 backward per parameter), N = the parameters that multiply
        activations: all but the position embedding (a lookup); the token embedding counts once, as the
        tied output head. Plus attention: ``QK^T`` and ``AV`` are ``2 * 2 * T * d_model`` FLOPs per token and
        layer forward, x3 with backward = ``12 * n_layer * d_model * T``. The causal mask's skipped half is
        counted (the PaLM convention), and activation recomputation is not (that would be HFU, not MFU).
        """
        n = sum(p.numel() for p in self.parameters()) - self.pos_emb.weight.numel()
        return 6.0 * n + 12.0 * self.n_layer * self.d_model * (seq_len or self.seq_len)


def build_gpt(cfg: ModelConfig | Any, spec: DataSpec | Any) -> GPT:
    """The ``gpt`` builder: checks the model against the data, then builds it (seeded by the caller)."""
    if spec.kind != "language_model":
        raise ConfigError(
            "model.name",
            "gpt",
            f"needs a language-model dataset (data.name=synthetic_tokens or text); this one is {spec.kind}",
        )
    if cfg.d_model % cfg.n_head:
        raise ConfigError("model.d_model", cfg.d_model, f"not divisible by model.n_head={cfg.n_head}")
    seq = spec.input_shape[0]
    if seq > cfg.seq_len:
        raise ConfigError("model.seq_len", cfg.seq_len, f"shorter than the dataset's sequences ({seq} tokens)")
    if spec.num_classes > cfg.vocab_size:
        raise ConfigError(
            "model.vocab_size", cfg.vocab_size, f"smaller than the dataset's vocabulary ({spec.num_classes})"
        )
    return GPT(cfg.n_layer, cfg.n_head, cfg.d_model, cfg.seq_len, cfg.vocab_size, cfg.dropout)
