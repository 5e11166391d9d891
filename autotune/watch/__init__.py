"""``autotune watch``: a live server's counters held against its stored profile, windows, prediction,
staleness and the service's own metrics endpoint (docs/watch.md).

Modules: :mod:`~autotune.watch.monitor`.
"""

__all__ = ["monitor"]
