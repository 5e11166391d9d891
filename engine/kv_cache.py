"""Preallocated KV cache with per-row lengths.

One buffer per layer, shaped (slots, n_kv_heads, max_seq_len, head_dim). Rows are cache
*slots*; the engine keeps its running rows packed in slots ``0..B-1`` so every forward reads
a plain view. The cache itself stores no lengths: the caller owns ``seqlens`` and passes the
positions to write. Rollback after a rejected draft is therefore a length reset by the
caller, never a copy; stale entries beyond a row's length are masked out by causality and
overwritten by the next write.
"""

from __future__ import annotations

import torch


class KVCache:
    """Static per-layer K/V buffers (after nanochat / gpt-fast)."""

    def __init__(
        self,
        n_layers: int,
        slots: int,
        n_kv_heads: int,
        max_seq_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        shape = (slots, n_kv_heads, max_seq_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.slots = slots
        self.max_seq_len = max_seq_len

    def write(
        self, layer: int, slot0: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Store k/v (B, n_kv, T, hd) of slots slot0..slot0+B-1 at their positions (B, T)."""
        b = positions.shape[0]
        rows = torch.arange(slot0, slot0 + b, device=positions.device)[:, None]  # (B, 1)
        self.k[layer][rows, :, positions] = k.transpose(1, 2)  # (B, T, n_kv, hd)
        self.v[layer][rows, :, positions] = v.transpose(1, 2)

    def view(self, layer: int, slot0: int, batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of slots slot0..slot0+batch-1 up to ``length`` positions: (batch, n_kv, length, hd) views."""
        rows = slice(slot0, slot0 + batch)
        return self.k[layer][rows, :, :length], self.v[layer][rows, :, :length]

    def compact(self, slot0: int, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Row b of slots slot0.. copies positions ``src[b]`` to ``dst[b]`` (both (B, G)), all layers.

        Token trees commit the accepted path this way (engine.tree): each node's entry moves from
        its tree slot to its depth. The sources are gathered before any write, so overlap is safe.
        """
        rows = torch.arange(slot0, slot0 + src.shape[0], device=src.device)[:, None]  # (B, 1)
        for buf in (*self.k, *self.v):
            buf[rows, :, dst] = buf[rows, :, src]  # (B, G, n_kv, hd)

    def move(self, src: torch.Tensor, dst: torch.Tensor, length: int) -> None:
        """Copy slots ``src``'s first ``length`` positions into slots ``dst`` (row compaction)."""
        for buf in (*self.k, *self.v):
            buf[dst, :, :length] = buf[src, :, :length]
