"""The engine core's side: after a K=0 step, no round trip to the worker for the drafts it did not make.

With a speculative config, vLLM 0.32's engine core asks the worker for the step's draft tokens after
every step (``EngineCore.post_step`` calls ``take_draft_token_ids`` through the executor,
``vllm/v1/engine/core.py``): with a worker process (``vllm serve``), a third synchronous message
round trip per step, beside ``execute_model`` and ``sample_tokens``, on the critical path of every
step. After a step scheduled at K=0 the worker has no draft to give: the draft-model proposer and
the n-gram proposer return no draft token at K=0 (the runner's and the n-gram wrappers of
:mod:`._k0_skip`; upstream's draft-model proposer too, ``vllm/v1/spec_decode/llm_base_proposer.py``),
and the scheduler already emptied every scheduled request's ``spec_token_ids`` when it
scheduled the step (``Scheduler.schedule``, ``vllm/v1/core/sched/scheduler.py``), so the drafts the
round trip would bring (an empty list per request) would leave the scheduler as it is. Two
functions are wrapped:

- ``Scheduler.update_from_output``: remembers whether the step it is given was scheduled at K>0
  (``SchedulerOutput.num_spec_tokens_to_schedule``);
- ``EngineCore.post_step``: after a step scheduled at K=0, with a method whose K=0 drafts are empty
  (:data:`EMPTY_AT_K0`), returns without asking the worker; otherwise upstream's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

_PATCHED = "_spec_autotune_k0_skip"  # set on each wrapped function: a second install is a no-op
_DRAFTED = "_spec_autotune_drafted"  # on the scheduler: whether its last updated step was at K>0
EMPTY_AT_K0 = ("draft_model", "ngram")
"""The methods whose proposer returns no draft token at K=0, so the round trip can be left out."""


def drafts_nothing(engine: Any) -> bool:
    """Whether the step the engine core just ran was scheduled at K=0 with a method of :data:`EMPTY_AT_K0`."""
    spec = engine.vllm_config.speculative_config
    drafted = getattr(engine.scheduler, _DRAFTED, True)
    return spec is not None and spec.method in EMPTY_AT_K0 and not drafted


def _wrap_update_from_output(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def update_from_output(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        setattr(self, _DRAFTED, scheduler_output.num_spec_tokens_to_schedule > 0)
        return original(self, scheduler_output, *args, **kwargs)

    setattr(update_from_output, _PATCHED, True)
    return update_from_output


def _wrap_post_step(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def post_step(self: Any, model_executed: bool) -> None:
        if model_executed and drafts_nothing(self):
            return
        original(self, model_executed)

    setattr(post_step, _PATCHED, True)
    return post_step


def _patch(cls: type, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    current = getattr(cls, name)
    if not getattr(current, _PATCHED, False):
        setattr(cls, name, wrap(current))


def install() -> None:
    """Wrap the two functions the module docstring lists; a second call changes nothing."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore

    _patch(Scheduler, "update_from_output", _wrap_update_from_output)
    _patch(EngineCore, "post_step", _wrap_post_step)
