"""What a configuration costs and gains: the engine's cost model (step time and accepted tokens
from the profiler's curves), a serving stack's step cost fitted from its own trials, and the one
acceptance model both read.

Modules: :mod:`~autotune.cost.acceptance` (per-position acceptance from profiled samples or a
stack's counters, and the one rule that extends it past the measured positions),
:mod:`~autotune.cost.costmodel` (tokens per step, throughput and TPOT for any gamma, threshold, tree
and batch size), :mod:`~autotune.cost.stackcost` (a stack's row-step cost per load level and K, and
the planner that picks the next K to serve).
"""

__all__ = ["acceptance", "costmodel", "stackcost"]
