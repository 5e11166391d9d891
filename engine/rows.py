"""The engine's per-row state: everything that belongs to one row, in one structure.

:class:`RowState` holds, per slot, the device tensors a step reads and writes and the host lists
that mirror what the host must know without reading the device (refreshed at each step's one
sync, engine.speculative). Every field is declared once, with how it is allocated; allocation and
moving a row between slots iterate the fields, so a new per-row quantity is one line here plus
the value :meth:`RowState.admit` or :meth:`RowState.start` gives it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import torch

from engine.sampling import BatchSampling


class RowRequest(Protocol):
    """What a row takes from its request (engine.speculative.Request)."""

    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    id: int


@dataclass
class Finished:
    """A retired request: its id, generated tokens and why it stopped ("eos" or "length")."""

    id: int
    tokens: list[int]
    reason: str


def _device(dtype: torch.dtype, fill: float = 0, per_position: bool = False) -> Any:
    """A device field: one entry per slot (per slot and position with ``per_position``)."""
    return field(metadata={"dtype": dtype, "fill": fill, "per_position": per_position})


def _host(fill: object) -> Any:
    """A host field: a list with one entry per slot."""
    return field(metadata={"fill": fill})


@dataclass
class RowState:
    """Per-slot state of the engine's rows (S slots; running rows are packed in ``0..n-1``).

    ``length[b]`` counts row b's tokens, including the *pending* token (emitted, not yet fed to
    the target); the target's cache holds the first ``length[b] - 1``.
    """

    tokens: torch.Tensor = _device(torch.long, per_position=True)  # (S, max_seq_len) prompt + output
    length: torch.Tensor = _device(torch.long)  # (S,) tokens, pending one included
    prompt_len: torch.Tensor = _device(torch.long)  # (S,)
    budget: torch.Tensor = _device(torch.long)  # (S,) prompt_len + max_new_tokens
    finished: torch.Tensor = _device(torch.bool)  # (S,) hit EOS or the budget
    hit_eos: torch.Tensor = _device(torch.bool)  # (S,)
    gamma: torch.Tensor = _device(torch.long)  # (S,) draft tokens the row proposes next step
    temperature: torch.Tensor = _device(torch.float32)  # (S,) 0 = greedy
    top_k: torch.Tensor = _device(torch.long)  # (S,) 0 = off
    top_p: torch.Tensor = _device(torch.float32, fill=1)  # (S,) 1 = off
    ids: list[int] = _host(0)  # request ids
    host_len: list[int] = _host(0)  # `length` as of the last sync
    host_gamma: list[int] = _host(0)  # `gamma` as of the last sync
    host_finished: list[bool] = _host(False)  # `finished` as of the last sync
    host_top_k: list[int] = _host(0)  # `top_k` (fixed at admission)
    filters: list[tuple[bool, bool, bool]] = _host((False, False, True))  # uses top-k, uses top-p, greedy

    @classmethod
    def allocate(cls, slots: int, max_seq_len: int, device: torch.device) -> RowState:
        """Every field for ``slots`` slots, at its fill value."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            meta = f.metadata
            if "dtype" in meta:
                shape = (slots, max_seq_len) if meta["per_position"] else (slots,)
                values[f.name] = torch.full(shape, meta["fill"], dtype=meta["dtype"], device=device)
            else:
                values[f.name] = [meta["fill"]] * slots
        return cls(**values)

    def admit(self, rows: slice, requests: Sequence[RowRequest], gamma: int) -> None:
        """Slots ``rows`` take ``requests``' ids, sampling settings and the starting ``gamma``:
        all a row needs before its first token is sampled (:meth:`sampling`)."""
        dev = self.temperature.device
        self.temperature[rows] = torch.tensor([r.temperature for r in requests], device=dev)
        self.top_k[rows] = torch.tensor([r.top_k for r in requests], device=dev)
        self.top_p[rows] = torch.tensor([r.top_p for r in requests], device=dev)
        self.gamma[rows] = gamma
        for slot, r in enumerate(requests, rows.start):
            self.ids[slot] = r.id
            self.host_gamma[slot] = gamma
            self.host_top_k[slot] = r.top_k
            self.filters[slot] = (r.top_k > 0, r.top_p < 1.0, r.temperature <= 0)

    def start(
        self,
        rows: slice,
        requests: Sequence[RowRequest],
        prompts: torch.Tensor,  # (m, P) padded prompts
        plen: torch.Tensor,  # (m,) prompt lengths
        first: torch.Tensor,  # (m,) first sampled tokens
        eos: torch.Tensor,  # (E,) EOS ids
    ) -> None:
        """Slots ``rows`` hold their prompts and first (pending) tokens; reads the device once
        (the finished flags: a first token may be EOS, or the budget one token)."""
        self.tokens[rows, : prompts.shape[1]] = prompts
        self.tokens[rows].scatter_(1, plen[:, None], first[:, None])
        self.length[rows] = plen + 1
        self.prompt_len[rows] = plen
        self.budget[rows] = plen + torch.tensor([r.max_new_tokens for r in requests], device=plen.device)
        self.hit_eos[rows] = torch.isin(first, eos)
        self.finished[rows] = self.hit_eos[rows] | (self.length[rows] >= self.budget[rows])
        finished = self.finished[rows].tolist()
        for slot, r, fin in zip(range(rows.start, rows.stop), requests, finished, strict=True):
            self.host_len[slot] = len(r.prompt_ids) + 1
            self.host_finished[slot] = fin

    def sampling(self, rows: slice) -> BatchSampling:
        """The sampling settings of slots ``rows``, filters sized from the host mirror (no read)."""
        filt = self.filters[rows]
        top_k = self.top_k[rows] if any(f[0] for f in filt) else None
        top_p = self.top_p[rows] if any(f[1] for f in filt) else None
        ks = self.host_top_k[rows]
        k_max = 0 if 0 in ks else max(ks)  # 0: some row keeps the whole vocabulary
        return BatchSampling(self.temperature[rows], top_k, top_p, all(f[2] for f in filt), k_max)

    def outputs(self, done: list[int]) -> list[Finished]:
        """What slots ``done`` generated, in their order (reads the device)."""
        host = torch.stack([self.prompt_len[done], self.length[done], self.hit_eos[done].long()]).tolist()
        out = []
        for i, slot in enumerate(done):
            plen, end, eos = host[0][i], host[1][i], host[2][i]
            out.append(
                Finished(self.ids[slot], self.tokens[slot, plen:end].tolist(), "eos" if eos else "length")
            )
        return out

    def move(self, src: list[int], dst: list[int], si: torch.Tensor, di: torch.Tensor) -> None:
        """Rows ``src`` now live in slots ``dst`` (equal-length lists of distinct slots; ``si``,
        ``di``: the same slots on the device), every field of them."""
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                value[di] = value[si]
            else:
                for a, b in zip(src, dst, strict=True):
                    value[b] = value[a]
