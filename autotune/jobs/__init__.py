"""The jobs the commands start: ``autotune tune`` (the main job), ``autotune init`` (a tune.yaml for
the user's models, the sweep sized on this host) and the watch service's re-tune.

Modules: :mod:`~autotune.jobs.tune`, :mod:`~autotune.jobs.init`, :mod:`~autotune.jobs.retune`.
"""

__all__ = ["init", "retune", "tune"]
