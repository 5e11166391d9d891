"""From measured points to the choice: the Pareto front, the significance rule, per-level choices,
re-measurement of the finalists, the table contest and the profile record.

Modules: :mod:`~autotune.decide.selection` (pure rules over :class:`autotune.records.Point`),
:mod:`~autotune.decide.decision` (finalists, re-measurement, the ``Decision`` and the profile).
"""

__all__ = ["decision", "selection"]
