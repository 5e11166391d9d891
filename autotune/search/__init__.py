"""The Optuna study: the search space, the objective, warm starts, the in-stack planner's loop, and
the guard every trial runs under (host readings, disturbed re-runs, time-outs).

Modules: :mod:`~autotune.search.study` (space, objective, warm starts, stack planner),
:mod:`~autotune.search.guard` (``TrialGuard``: a trial disturbed by another process is run again).
"""

__all__ = ["guard", "study"]
