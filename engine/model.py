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

import itertools
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig, rope_inv_freq
from engine.kv_cache import KVCache

ACT: dict[
    str, Callable[[torch.Tensor], torch.Tensor]
] = {  # config.json hidden_act (engine.config.ACTIVATIONS)
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_new": partial(F.gelu, approximate="tanh"),
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
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
        self.qkv_proj: nn.Linear | None = None  # set by fuse(): q/k/v in one matmul

    def fuse(self) -> None:
        """Replace q/k/v_proj by one ``qkv_proj`` whose output rows are q's, then k's, then v's."""
        self.qkv_proj = _concat_linears(self.q_proj, self.k_proj, self.v_proj)
        del self.q_proj, self.k_proj, self.v_proj

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.qkv_proj is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        nq, nkv = self.n_heads * self.hd, self.n_kv * self.hd
        q, k, v = self.qkv_proj(x).split((nq, nkv, nkv), dim=-1)  # (B, T, nq), (B, T, nkv) twice
        return q, k, v

    def forward(
        self,
        x: torch.Tensor,  # (B, T, C)
        cos: torch.Tensor,  # (B, 1, T, hd)
        sin: torch.Tensor,
        cache: KVCache | None,
        positions: torch.Tensor,  # (B, T)
        kv_len: int,
        slot0: int,
        mask: torch.Tensor | None,  # (B, 1, T, L) built once per forward; None: plain causal, no cache
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self._qkv(x)
        q = q.view(b, t, self.n_heads, self.hd)
        k = k.view(b, t, self.n_kv, self.hd)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.transpose(1, 2)  # (B, nh, T, hd)
        k = k.transpose(1, 2)  # (B, nkv, T, hd)
        v = v.view(b, t, self.n_kv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        gqa = self.n_kv != self.n_heads
        if cache is None:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=gqa
            )
        else:
            cache.write(self.layer, slot0, positions, k, v)
            keys, values = cache.view(self.layer, slot0, b, kv_len)  # (B, nkv, L, hd)
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=gqa)
        out: torch.Tensor = self.o_proj(y.transpose(1, 2).reshape(b, t, self.n_heads * self.hd))
        return out


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.act = ACT[cfg.hidden_act]
        self.gate_up_proj: nn.Linear | None = None  # set by fuse()

    def fuse(self) -> None:
        """Replace gate_proj and up_proj by one ``gate_up_proj`` (gate's rows first)."""
        self.gate_up_proj = _concat_linears(self.gate_proj, self.up_proj)
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor
        if self.gate_up_proj is None:
            out = self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
            return out
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        out = self.down_proj(self.act(gate) * up)
        return out


def _concat_linears(*parts: nn.Linear) -> nn.Linear:
    """One Linear computing ``cat([p(x) for p in parts], -1)``: the weights stacked row-wise."""
    w = torch.cat([p.weight for p in parts])
    fused = nn.Linear(w.shape[1], w.shape[0], bias=parts[0].bias is not None, device="meta")
    fused.weight = nn.Parameter(w, requires_grad=False)
    if parts[0].bias is not None:
        fused.bias = nn.Parameter(torch.cat([p.bias for p in parts]), requires_grad=False)
    return fused


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,  # (B, T, C)
        cos: torch.Tensor,  # (B, 1, T, hd)
        sin: torch.Tensor,
        cache: KVCache | None,
        positions: torch.Tensor,  # (B, T)
        kv_len: int,
        slot0: int,
        masks: tuple[torch.Tensor | None, torch.Tensor | None],  # (full, sliding): Transformer._masks
    ) -> torch.Tensor:
        mask = masks[1] if self.self_attn.sliding else masks[0]
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, positions, kv_len, slot0, mask)
        out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


_COMPILED_FORWARD: dict[
    str | None, Callable[..., torch.Tensor]
] = {}  # mode -> torch.compile(Transformer.forward)
_COMPILED_HIDDEN: dict[
    tuple[str | None, tuple[bool, ...]], Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
] = {}  # (mode, layer mask) -> the compiled cached forward that also returns those layers' hidden states


def _forward_with(take: tuple[bool, ...]) -> Callable[..., tuple[torch.Tensor, torch.Tensor | None]]:
    """A cached forward (a chain, or a tree's explicit attention) returning the hidden states ``take``
    marks, a constant to torch.compile (a tuple of ints would not be: with dynamic shapes dynamo
    turns its entries into symbols)."""

    def run(
        model: Transformer,
        tokens: torch.Tensor,
        cache: KVCache,
        start: torch.Tensor,
        kv_len: int,
        attn: ExplicitAttention | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return model._forward(tokens, cache, start, kv_len, 0, attn, take)

    return run


class Transformer(nn.Module):
    """A causal LM with HF-compatible parameter names (``model.*``, ``lm_head``)."""

    inv_freq: torch.Tensor  # (head_dim/2,) buffer, registered in __init__

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
        self.compiled = False  # decode() through torch.compile (compile_decode())
        self._compile_mode: str | None = None

    def fuse(self) -> Transformer:
        """Fuse each layer's q/k/v and gate/up projections into one matmul each (in place).

        An inference-time layout: fewer, bigger matmuls (7 -> 4 per layer). The state dict's
        names change with it (``qkv_proj``, ``gate_up_proj``), so fuse after loading and never
        save a fused model as a checkpoint; the files on disk keep Hugging Face's names.
        """
        for layer in self.model.layers:
            assert isinstance(layer, DecoderLayer)
            layer.self_attn.fuse()
            layer.mlp.fuse()
        return self

    def compile_decode(
        self,
        mode: str | None = None,
        trees: Sequence[Sequence[int]] = (),
        hidden_layers: tuple[int, ...] = (),
    ) -> float:
        """Compile :meth:`decode` with ``torch.compile`` (inductor) and warm it up; returns seconds.

        Shapes are dynamic (batch, width, kv length and cache size are symbols), so one study
        never recompiles per trial; torch still specialises sizes 0 and 1, hence the warm-up runs
        the six classes a run meets (batch 1 or more, width 1 or more, a cache of 1 slot or more)
        on scratch caches, and the time reported is compile time, kept out of every measurement
        after it (a warm inductor cache compiles in a fraction of a cold one's time; ``autotune``
        keeps that cache under ~/.cache/spec-autotune/inductor: docs/decisions.md#inductor-cache).
        Prefill stays eager: long prompts amortise the launch overhead that compiling removes.
        ``mode`` is torch.compile's (``"reduce-overhead"``: CUDA graphs where inductor can capture them).
        ``trees`` (per-depth top-k shapes, engine.tree) also warms the token-tree forward (an
        explicit attention pattern: another graph) for the widths those trees feed: always more
        than one token (the verify pass), one token only when a tree starts with top-k 1 (its first
        draft level is a single node). A run that drafts trees thus keeps compile time out of its
        timings too; a tree not warmed compiles on its first forward. ``hidden_layers`` (an EAGLE-3
        head's aux layer ids, engine.eagle3) also compiles and warms :meth:`decode_hidden` for them,
        for the chain and, with ``trees``, for the tree's verify pass (always more than one token).
        """
        import torch._dynamo
        import torch.fx.experimental._config as fx_config

        # Target and draft share Transformer.forward's code object: 6 graphs each (12 with trees), plus tests'
        # models. The default limit (8) would silently fall back to eager. Duck sizing would tie
        # symbols that happen to be equal once (slots == kv heads) and recompile when they differ.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 128)
        fx_config.use_duck_shape = False
        if mode not in _COMPILED_FORWARD:  # one compiled function per mode: models of one shape share graphs
            _COMPILED_FORWARD[mode] = torch.compile(Transformer.forward, dynamic=True, mode=mode)
        self.compiled, self._compile_mode = True, mode
        device = self.lm_head.weight.device
        t0 = time.perf_counter()
        shapes = [tuple(s) for s in trees if any(k > 1 for k in s)]
        tree_widths = {2} | ({1} if any(s[0] == 1 for s in shapes) else set())
        for tree, slots, b, t in itertools.product(
            (False, True) if shapes else (False,), (1, 3), (1, 2), (1, 2)
        ):
            if b <= slots and (not tree or t in tree_widths):
                tokens = torch.zeros(b, t, dtype=torch.long, device=device)
                start = torch.full((b,), 4, dtype=torch.long, device=device)
                attn = None
                if tree:  # a causal pattern spelled out: the tree graph's shapes, the chain's function
                    pos = start[:, None] + torch.arange(t, device=device)[None, :]
                    keys = torch.arange(4 + t, device=device)[None, :].expand(b, -1)
                    attn = ExplicitAttention(pos, keys, keys[:, None, :] <= pos[:, :, None])
                self.decode(tokens, self.new_cache(slots, 16), start, 4 + t, attn)
                if hidden_layers and (attn is None or t > 1):
                    self.decode_hidden(tokens, self.new_cache(slots, 16), start, 4 + t, hidden_layers, attn)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    def decode(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        start: torch.Tensor,
        kv_len: int,
        attn: ExplicitAttention | None = None,
    ) -> torch.Tensor:
        """The cached forward of the running rows (slots 0..B-1): decode, draft and verify steps,
        chains and token trees (``attn``: the tree's explicit attention, engine.tree).

        Same function as ``self(tokens, cache=cache, start=start, kv_len=kv_len, attn=attn)``;
        compiled once :meth:`compile_decode` has run (``self.compiled``). The compiled call always
        runs in inference mode on inference-tensor copies of its tensor inputs (and
        :meth:`new_cache` always makes normal tensors), because torch.compile's guards include
        each input's dispatch keys: a caller's grad mode or where it built its inputs must not
        trigger a recompile.
        """
        if not self.compiled:
            return self.forward(tokens, cache=cache, start=start, kv_len=kv_len, attn=attn)
        with torch.inference_mode():
            if attn is not None:  # contiguous too: a tree builds its mask from permuted views
                attn = ExplicitAttention(*(t.clone(memory_format=torch.contiguous_format) for t in attn))
            return _COMPILED_FORWARD[self._compile_mode](
                self, tokens.clone(), cache=cache, start=start.clone(), kv_len=kv_len, attn=attn
            )

    def decode_hidden(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        start: torch.Tensor,
        kv_len: int,
        layers: tuple[int, ...],
        attn: ExplicitAttention | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`decode` (a chain, or a token tree's ``attn``) that also returns the hidden states of
        ``layers`` (ascending, distinct; :meth:`forward_hidden`): (B, T, V) logits, (B, T,
        len(layers) * C). The verify pass of a drafter fed the target's hidden states
        (engine.eagle3); compiled like :meth:`decode`, one function per ``layers``."""
        if not self.compiled:
            logits, hidden = self.forward_hidden(tokens, cache, start, kv_len, 0, attn, layers)
        else:
            key = (self._compile_mode, self._layer_mask(layers))
            if key not in _COMPILED_HIDDEN:
                _COMPILED_HIDDEN[key] = torch.compile(_forward_with(key[1]), dynamic=True, mode=key[0])
            with torch.inference_mode():
                if attn is not None:  # contiguous copies, as in decode
                    attn = ExplicitAttention(*(t.clone(memory_format=torch.contiguous_format) for t in attn))
                logits, hidden = _COMPILED_HIDDEN[key](
                    self, tokens.clone(), cache, start.clone(), kv_len, attn
                )
        assert hidden is not None, "decode_hidden needs at least one layer"
        return logits, hidden

    def new_cache(self, slots: int, max_seq_len: int) -> KVCache:
        cfg = self.config
        w = self.lm_head.weight
        with torch.inference_mode(False):  # normal tensors wherever it is called (see decode)
            return KVCache(
                cfg.num_hidden_layers,
                slots,
                cfg.num_key_value_heads,
                max_seq_len,
                cfg.head_dim,
                w.dtype,
                w.device,
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
        logits, _ = self._forward(tokens, cache, start, kv_len, slot0, attn, ())
        return logits

    def forward_hidden(
        self,
        tokens: torch.Tensor,  # (B, T) int64
        cache: KVCache | None = None,
        start: torch.Tensor | None = None,
        kv_len: int = 0,
        slot0: int = 0,
        attn: ExplicitAttention | None = None,
        layers: tuple[int, ...] = (),  # hidden-state layer ids to return, ascending
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # (B, T, V) logits, (B, T, len(layers) * C) or None
        """:meth:`forward`, plus the hidden states of ``layers`` concatenated in that order.

        Layer id i is the residual stream entering decoder layer i: 0 the embeddings, L (the layer
        count) the last layer's output before the final norm; vLLM's aux hidden states (EAGLE-3,
        engine.eagle3). Without ``layers`` the second value is None and nothing extra is computed.
        """
        return self._forward(tokens, cache, start, kv_len, slot0, attn, self._layer_mask(layers))

    def _layer_mask(self, layers: tuple[int, ...]) -> tuple[bool, ...]:
        """Per layer id 0..L, whether ``layers`` holds it; () for no layers."""
        return tuple(i in layers for i in range(self.config.num_hidden_layers + 1)) if layers else ()

    def _forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache | None,
        start: torch.Tensor | None,
        kv_len: int,
        slot0: int,
        attn: ExplicitAttention | None,
        take: tuple[bool, ...],  # _layer_mask
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        b, t = tokens.shape
        offs = torch.arange(t, device=tokens.device)
        if cache is None:
            positions = offs[None, :].expand(b, t)  # (B, T) slots
        else:
            assert start is not None, "a cached forward needs each row's start"
            positions = start[:, None] + offs[None, :]
        rope_pos = positions if attn is None else attn.positions
        freqs = rope_pos[..., None].float() * self.inv_freq  # (B, T, hd/2)
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # (B, 1, T, hd)
        x = self.model.embed_tokens(tokens)  # (B, T, C)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        if attn is None:
            masks = self._masks(positions, t if cache is None else kv_len, cache is not None)
        else:
            masks = self._explicit_masks(attn)
        aux = [x] if take and take[0] else []
        for i, layer in enumerate(self.model.layers, 1):
            x = layer(x, cos, sin, cache, positions, kv_len, slot0, masks)
            if take and take[i]:
                aux.append(x)
        logits: torch.Tensor = self.lm_head(self.model.norm(x))
        return logits, (torch.cat(aux, -1) if take else None)

    def _masks(
        self, positions: torch.Tensor, kv_len: int, cached: bool
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
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
        window = self.config.sliding_window if self.config.sliding_layers else None
        if window is None:
            return visible[:, None], None
        near = attn.key_positions[:, None, :] > attn.positions[:, :, None] - window
        return visible[:, None], (visible & near)[:, None]
