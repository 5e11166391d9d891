"""Llama-family decoder in plain torch (RMSNorm, RoPE, SwiGLU, grouped-query attention).

Parameter names mirror Hugging Face's ``LlamaForCausalLM`` / ``MistralForCausalLM`` /
``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` so a ``model.safetensors`` state dict loads without
renaming, and the demo pair trained here loads in transformers unchanged. Qwen3's per-head q/k
RMSNorm and Mistral/Qwen sliding-window attention (a query at position p sees keys
p - window < j <= p) follow transformers exactly.

Two entry points share one code path:

- ``model(tokens)``: full causal forward without a cache (training, reference checks).
- ``model(tokens, cache=cache, start=start, kv_len=L, slot0=s)``: cache slots s..s+B-1; row b's
  T new tokens sit at positions ``start[b] .. start[b]+T-1`` (ragged rows are right-padded;
  the padding writes cache entries past the row's length, which causality hides and the
  next step overwrites). ``kv_len`` is any upper bound on ``start + T`` over the batch.
- the same with ``attn=ExplicitAttention(...)`` (token trees, engine.tree): the T tokens are
  still written at cache slots ``start .. start+T-1``, but RoPE uses ``attn.positions`` and
  attention uses ``attn.visible`` instead of causality (sliding windows apply to the
  RoPE positions of queries and keys).

References: Touvron et al. 2023 (Llama); Su et al. 2021 (RoPE); Ainslie et al. 2023 (GQA).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig, rope_inv_freq
from engine.kv_cache import KVCache

ACT: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {  # config.json hidden_act (engine.config.ACTIVATIONS)
    "silu": F.silu, "swish": F.silu, "gelu": F.gelu, "gelu_new": partial(F.gelu, approximate="tanh"),
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"), "relu": F.relu,
}


class ExplicitAttention(NamedTuple):
    """An explicit attention pattern for a cached forward (token trees: engine.tree)."""

    positions: torch.Tensor  # (B, T) RoPE position of each query
    key_positions: torch.Tensor  # (B, L) RoPE position of each cache slot
    visible: torch.Tensor  # (B, T, L) bool: query t sees cache slot j


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.n_heads, self.n_kv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.n_heads * self.hd, cfg.hidden_size, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm
        self.sliding = layer in cfg.sliding_layers

    def forward(
        self,
        x: torch.Tensor,  # (B, T, C)
        cos: torch.Tensor,  # (B, 1, T, hd)
        sin: torch.Tensor,
        cache: KVCache | None,
        positions: torch.Tensor | None,  # (B, T)
        kv_len: int,
        slot0: int,
        mask: torch.Tensor | None,  # (B, 1, T, L) built once per forward; None: plain causal, no cache
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.hd)
        k = self.k_proj(x).view(b, t, self.n_kv, self.hd)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.transpose(1, 2)  # (B, nh, T, hd)
        k = k.transpose(1, 2)  # (B, nkv, T, hd)
        v = self.v_proj(x).view(b, t, self.n_kv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        gqa = self.n_kv != self.n_heads
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=gqa)
        else:
            cache.write(self.layer, slot0, positions, k, v)
            keys, values = cache.view(self.layer, slot0, b, kv_len)  # (B, nkv, L, hd)
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=gqa)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.n_heads * self.hd))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.act = ACT[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, cache, positions, kv_len, slot0, masks):
        mask = masks[1] if self.self_attn.sliding else masks[0]
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, positions, kv_len, slot0, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Transformer(nn.Module):
    """A causal LM with HF-compatible parameter names (``model.*``, ``lm_head``)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)

    def new_cache(self, slots: int, max_seq_len: int) -> KVCache:
        cfg = self.config
        w = self.lm_head.weight
        return KVCache(
            cfg.num_hidden_layers, slots, cfg.num_key_value_heads, max_seq_len, cfg.head_dim, w.dtype, w.device
        )

    def forward(
        self,
        tokens: torch.Tensor,  # (B, T) int64
        cache: KVCache | None = None,
        start: torch.Tensor | None = None,  # (B,) int64: each row's first new position
        kv_len: int = 0,
        slot0: int = 0,
        attn: ExplicitAttention | None = None,
    ) -> torch.Tensor:  # (B, T, V) logits
        b, t = tokens.shape
        offs = torch.arange(t, device=tokens.device)
        positions = offs[None, :].expand(b, t) if cache is None else start[:, None] + offs[None, :]  # (B, T) slots
        rope_pos = positions if attn is None else attn.positions
        freqs = rope_pos[..., None].float() * self.inv_freq  # (B, T, hd/2)
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # (B, 1, T, hd)
        x = self.model.embed_tokens(tokens)  # (B, T, C)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        if attn is None:
            masks = self._masks(positions, t if cache is None else kv_len, cache is not None)
        else:
            masks = self._explicit_masks(attn)
        for layer in self.model.layers:
            x = layer(x, cos, sin, cache, positions, kv_len, slot0, masks)
        return self.lm_head(self.model.norm(x))

    def _masks(self, positions: torch.Tensor, kv_len: int, cached: bool) -> tuple[torch.Tensor | None, ...]:
        """(full, sliding) boolean masks (B, 1, T, L): key j is visible to the query at position p iff
        j <= p (and p - j < sliding_window); full is None without a cache (SDPA's is_causal)."""
        window = self.config.sliding_window if self.config.sliding_layers else None
        if not cached and window is None:
            return None, None
        key_pos = torch.arange(kv_len, device=positions.device)[None, None, :]
        causal = key_pos <= positions[:, :, None]  # (B, T, L)
        sliding = causal & (key_pos > positions[:, :, None] - window) if window is not None else None
        return (causal[:, None] if cached else None), (sliding[:, None] if sliding is not None else None)

    def _explicit_masks(self, attn: ExplicitAttention) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(full, sliding) masks (B, 1, T, L) of an explicit pattern; the window uses RoPE positions."""
        visible = attn.visible
        if not self.config.sliding_layers:
            return visible[:, None], None
        near = attn.key_positions[:, None, :] > attn.positions[:, :, None] - self.config.sliding_window
        return visible[:, None], (visible & near)[:, None]
