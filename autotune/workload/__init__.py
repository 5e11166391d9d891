"""The load a trial runs: requests built from the workload's prompts, closed-loop and open-loop runs
on the engine, and arrival traces.

Modules: :mod:`~autotune.workload.runner` (requests and one load run on the engine),
:mod:`~autotune.workload.trace` (``workload.trace``: arrivals read from a file or made by phase).
"""

__all__ = ["runner", "trace"]
