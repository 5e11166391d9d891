"""The engine core's side: no round trip for drafts a K=0 step did not make; the hold rule.

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

The hold rule (:data:`HOLD_ENV`, ``backend.vllm.k0_hold_tokens``): a switch from K=0 back to K>0
costs the draft model one catch-up pass over every token its requests committed while it was off,
and pays back only over the tokens still to come. At the end of a burst the table's low-load range
is reached when the last requests are nearly done, so the switch back costs more than the few draft
steps left can win (docs/results/vllm-plugin.md#drain-tail). A third function is wrapped:

- ``Scheduler._update_after_schedule`` (``vllm/v1/core/sched/scheduler.py``; ``schedule()`` calls it
  with the step's output, after the table's lookup set ``num_spec_tokens_to_schedule`` and before
  anything reads it): after a step scheduled at K=0, with a method that catches up
  (:data:`CATCHES_UP`), a K>0 from the lookup is turned to 0 while no request of the step has more
  than N tokens left (``max_tokens`` less the tokens it has; :func:`holds`). The step is then
  exactly a K=0 step of the table, which the plugin already serves exactly, so the rule changes
  when the drafter runs, never which tokens come out. Requests without a ``max_tokens`` near their
  end (vLLM then bounds them by the model's length) never hold the switch.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from typing import Any

_PATCHED = "_spec_autotune_k0_skip"  # set on each wrapped function: a second install is a no-op
_DRAFTED = "_spec_autotune_drafted"  # on the scheduler: whether its last updated step was at K>0
EMPTY_AT_K0 = ("draft_model", "ngram")
"""The methods whose proposer returns no draft token at K=0, so the round trip can be left out."""
CATCHES_UP = ("draft_model",)
"""The methods whose switch back to K>0 runs a catch-up pass (n-gram drafting holds no state)."""
HOLD_ENV = "SPEC_AUTOTUNE_K0_HOLD_TOKENS"
"""The hold rule's N (tokens left per request), set by ``backend.vllm.k0_hold_tokens``; unset or 0: off."""


def hold_tokens(environ: Mapping[str, str]) -> int:
    """The hold rule's N from the environment: 0 where unset; a value that is not a whole number >= 0
    is one line (ValueError), so the server does not start.

    Example:
        >>> hold_tokens({}), hold_tokens({HOLD_ENV: "16"})
        (0, 16)
    """
    text = environ.get(HOLD_ENV, "0")
    if not text.isdigit():
        raise ValueError(f"spec-autotune k0 skip: {HOLD_ENV}={text!r} is not a whole number >= 0")
    return int(text)


def holds(scheduler: Any, scheduler_output: Any, n: int) -> bool:
    """Whether the step the scheduler just scheduled is held at K=0: the rule is on (``n`` > 0), the
    lookup asks for K>0 after a step at K=0 with a method of :data:`CATCHES_UP`, and no request of
    the step has more than ``n`` tokens left."""
    if n <= 0 or scheduler_output.num_spec_tokens_to_schedule <= 0 or getattr(scheduler, _DRAFTED, True):
        return False
    if not scheduler_output.num_scheduled_tokens:  # a step without requests: nothing to hold
        return False
    if scheduler.vllm_config.speculative_config.method not in CATCHES_UP:
        return False
    running = (scheduler.requests[rid] for rid in scheduler_output.num_scheduled_tokens)
    return all(r.max_tokens - r.num_output_tokens <= n for r in running)


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


def _wrap_update_after_schedule(original: Callable[..., Any], n: int) -> Callable[..., Any]:
    @functools.wraps(original)
    def _update_after_schedule(self: Any, scheduler_output: Any) -> None:
        if holds(self, scheduler_output, n):
            scheduler_output.num_spec_tokens_to_schedule = 0
        original(self, scheduler_output)

    setattr(_update_after_schedule, _PATCHED, True)
    return _update_after_schedule


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
    """Wrap the functions the module docstring lists (the scheduler's third only with the hold rule
    on); a second call changes nothing."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore

    n = hold_tokens(os.environ)
    _patch(Scheduler, "update_from_output", _wrap_update_from_output)
    _patch(EngineCore, "post_step", _wrap_post_step)
    if n > 0:
        _patch(Scheduler, "_update_after_schedule", functools.partial(_wrap_update_after_schedule, n=n))
