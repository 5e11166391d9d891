"""A speculative step reads the device once (engine/speculative.py's docstring), and here is the count.

Every way the host can read a tensor's values is counted while ``SpecEngine.step`` runs:
``Tensor.tolist`` (wrapped), and the aten ops that need values on the host: the scalar read
behind ``item()``/``int()``/``bool()``/``float()`` (``item``, ``_local_scalar_dense``, ``is_nonzero``),
and ops whose output shape depends on values (``nonzero``, ``masked_select``, ``unique``).
On CUDA each of these would stall the stream; the sync-free step (CUDA's default) must make
exactly one, and the counter must see the extra reads the CPU default keeps (so it can fail).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.drafters import HybridDrafter, ModelDrafter
from engine.speculative import Request, SpecConfig, SpecEngine

aten = torch.ops.aten
READS = {
    aten.item.default,  # int(), float() and item() reach a dispatch mode as item (torch 2.13 here)
    aten._local_scalar_dense.default,
    aten.is_nonzero.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.equal.default,
}


class HostReads(TorchDispatchMode):
    """Counts host reads of tensor values (see the module docstring) while active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.active = False

    def __enter__(self):
        self.active = True
        return super().__enter__()

    def __exit__(self, *exc):
        self.active = False
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in READS:
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def requests(prompts: list[list[int]]) -> list[Request]:
    """Greedy rows, sampled rows with top-k and top-p: every sampling path in one batch."""
    kinds = [dict(), dict(temperature=1.0, top_k=5), dict(temperature=0.8, top_p=0.9), dict(temperature=1.0)]
    return [Request(p, 12, id=i, **kinds[i % len(kinds)]) for i, p in enumerate(prompts)]


def reads_per_step(
    target, draft, prompts, config: SpecConfig, sync_free: bool, counted: HostReads, drafter=None
) -> list[int]:
    engine = SpecEngine(
        target,
        drafter or ModelDrafter(draft),
        config,
        len(prompts),
        64,
        generator=torch.Generator().manual_seed(0),
        sync_free=sync_free,
    )
    per_step = []
    with torch.inference_mode():
        engine.add(requests(prompts))
        while engine.n:
            counted.ops.clear()
            with counted:
                engine.step()
            per_step.append(len(counted.ops))
            engine.retire()
    return per_step


@pytest.mark.parametrize(
    "config",
    [
        SpecConfig(gamma=4),
        SpecConfig(gamma=4, confidence_threshold=0.3),
        SpecConfig(gamma=2, gamma_schedule="heuristic", max_gamma=6, confidence_threshold=0.2),
        SpecConfig(gamma=3, tree_topk=(3, 2, 1)),
        SpecConfig(gamma=3, tree_topk=(2, 2, 2), tree_nodes=6, tree_sampling="topk"),
    ],
    ids=["constant", "threshold", "heuristic+threshold", "tree-3-2-1", "dynamic-2x3-6"],
)
def test_sync_free_step_reads_the_device_exactly_once(target, draft, prompts, config, counted):
    per_step = reads_per_step(target, draft, prompts, config, sync_free=True, counted=counted)
    assert len(per_step) > 2  # several steps ran, with rows retiring between them
    assert per_step == [1] * len(per_step)


def test_the_counter_sees_the_reads_the_cpu_default_keeps(target, draft, prompts, counted):
    """Without sync_free the draft sizes its width and stops early by reading the device."""
    config = SpecConfig(gamma=4, confidence_threshold=0.3)
    per_step = reads_per_step(target, draft, prompts, config, sync_free=False, counted=counted)
    assert max(per_step) > 1


@pytest.mark.parametrize("sync_free", [True, False], ids=["sync-free", "cpu-default"])
def test_hybrid_drafter_runs_its_draft_model_with_the_engine_setting(
    target, draft, prompts, counted, sync_free
):
    """The hybrid's n-gram lookup reads the rows (its own reads); its draft model must read nothing
    in the sync-free step, and the counter sees the reads it makes in the CPU default."""
    drafter = HybridDrafter(draft)
    inner: list[int] = []
    propose = drafter.model.propose

    def counted_propose(*args, **kwargs):
        before = len(counted.ops)
        out = propose(*args, **kwargs)
        inner.append(len(counted.ops) - before)
        return out

    drafter.model.propose = counted_propose
    config = SpecConfig(gamma=4, confidence_threshold=0.3)
    reads_per_step(target, draft, prompts, config, sync_free, counted, drafter=drafter)
    assert len(inner) > 2  # the draft model ran on several steps
    assert (max(inner) == 0) if sync_free else (max(inner) > 0), inner


def test_retire_reads_nothing_until_a_row_finishes(target, draft, prompts, counted):
    engine = SpecEngine(target, ModelDrafter(draft), SpecConfig(gamma=3), len(prompts), 64, sync_free=True)
    with torch.inference_mode():
        engine.add([Request(p, 30, id=i) for i, p in enumerate(prompts)])
        engine.step()
        with counted:
            assert engine.retire() == []
    assert counted.ops == []


def test_sync_free_and_cpu_default_emit_the_same_greedy_tokens(target, draft, prompts):
    """Same tokens whether the draft loop stops early or runs its fixed positions."""
    outs = []
    for sync_free in (False, True):
        engine = SpecEngine(
            target,
            ModelDrafter(draft),
            SpecConfig(gamma=5, confidence_threshold=0.3),
            len(prompts),
            64,
            sync_free=sync_free,
        )
        done = []
        with torch.inference_mode():
            engine.add([Request(p, 15, id=i) for i, p in enumerate(prompts)])
            while engine.n:
                engine.step()
                done += engine.retire()
        outs.append(sorted((f.id, f.tokens) for f in done))
    assert outs[0] == outs[1]
