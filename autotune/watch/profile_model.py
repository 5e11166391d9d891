"""The stored profile as the watch holds a live server against it: costs, acceptance, the served K.

:class:`ProfileModel` reads a typed :class:`profiles.schema.Profile` once: the engine's cost
curves, the stack's own fitted step costs (``stack_cost``, :mod:`autotune.cost.stackcost`), the
per-position acceptance, the K the exports serve at each batch size, and the tune's measured
per-level choices (``table_decision``, read through :class:`profiles.schema.TableDecision`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from autotune.cost.stackcost import StackCost
from autotune.records import Curves
from autotune.stats import Estimate
from profiles.errors import ProfileError
from profiles.profile import export_inputs
from profiles.schema import MISSING, BatchSchedule, Profile, TableDecision


@dataclass(frozen=True)
class ProfileModel:
    """What the watch holds a window against: a stored profile's cost curves, acceptance and served K."""

    profile_id: int | None
    curves: Curves
    acceptance: tuple[float, ...]  # the profile's unconditional per-position acceptance (B=1, threshold 0)
    schedule: tuple[tuple[int, int], ...]  # (batch_size, K), sorted: vLLM's by-batch-size table
    gamma: int  # the single K a one-K stack (llama-server) is exported with
    speculates: bool
    levels: tuple[int, ...] = ()  # the workload's tuned load levels (concurrency)
    level_choices: Mapping[int, int] = field(default_factory=dict)  # table_decision: batch size -> K
    backend: str = "engine"  # what measured the profile
    # the stack's own step costs (profile["stack_cost"], autotune.cost.stackcost): used for that stack
    stack_cost: StackCost | None = None
    # table_decision.levels[].over_chosen: batch size -> the tune's paired ratio of that level's
    # choice over the chosen configuration there (absent in profiles that lack it)
    level_ratios: Mapping[int, Estimate] = field(default_factory=dict)
    # schedule[].ratio: batch size -> the tune's measured tokens/s of the schedule's K there over no
    # speculation (re-measured rounds; where that K speculates)
    off_ratios: Mapping[int, float] = field(default_factory=dict)

    @classmethod
    def from_profile(cls, profile: Profile) -> ProfileModel:
        """ProfileError (one line) when the profile lacks the cost curves or the acceptance."""
        pid = None if profile.id is MISSING else profile.id
        where = f"profile #{pid}" if pid is not None else "profile"
        curves, acceptance = _curves(profile, where), _acceptance(profile, where)
        inputs = export_inputs(profile)
        workload = profile.workload if isinstance(profile.workload, Mapping) else {}
        backend = profile.backend if isinstance(profile.backend, Mapping) else {}
        choices, ratios = _level_choices(profile.table_decision)
        return cls(
            profile_id=pid,
            curves=curves,
            acceptance=acceptance,
            schedule=tuple(sorted(inputs.schedule)),
            gamma=inputs.gamma,
            speculates=inputs.drafter != "none",
            levels=tuple(int(c) for c in workload.get("concurrency", []) or []),
            level_choices=choices,
            backend=str(backend.get("name", "engine")),
            stack_cost=_stack_cost(profile, where),
            level_ratios=ratios,
            off_ratios=_off_ratios(profile.schedule),
        )

    @property
    def gamma_max(self) -> int:
        """The largest K the watch predicts: the profile's measured acceptance positions."""
        return len(self.acceptance)

    def costs_for(self, stack: str) -> StackCost | None:
        """The fitted step costs of ``stack`` when that stack measured the profile, else None (the curves)."""
        return self.stack_cost if self.stack_cost is not None and self.backend == stack else None

    def served_k(self, stack: str, batch: float) -> int:
        """The K the exported configuration drafts with ``batch`` requests running.

        llama-server takes one K (``--spec-draft-n-max``); vLLM the schedule as its per-batch-size
        table (the K of the smallest tuned batch size >= the batch, the last one's above).

        Example:
            >>> m = ProfileModel(None, Curves({1: {1: 1.0}}, {}), (0.5,), ((1, 5), (4, 3), (8, 0)), 5, True)
            >>> [m.served_k("vllm", b) for b in (1, 2, 4.4, 6, 64)], m.served_k("llamacpp", 64)
            ([5, 3, 3, 0, 0], 5)
        """
        if not self.speculates:
            return 0
        if stack == "llamacpp" or not self.schedule:
            return self.gamma
        b = max(1, round(batch))
        return next((k for size, k in self.schedule if b <= size), self.schedule[-1][1])

    def chosen_k_at(self, level: int) -> int:
        """The K the profile's chosen configuration runs at tuned level ``level`` (its schedule there):
        what the level's ``over_chosen`` ratio was measured over."""
        if not self.speculates:
            return 0
        return dict(self.schedule).get(level, self.gamma)

    def nearest_level(self, batch: float) -> int | None:
        return min(self.levels, key=lambda lv: (abs(lv - batch), lv)) if self.levels else None


def _curves(profile: Profile, where: str) -> Curves:
    if profile.curves is MISSING or not isinstance(profile.curves, Mapping):
        raise ProfileError(f"{where}: no 'curves' (cost model); re-run `autotune tune`")
    try:
        return Curves.from_json(profile.curves)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileError(f"{where}: unreadable 'curves' ({type(exc).__name__}: {exc})") from None


def _acceptance(profile: Profile, where: str) -> tuple[float, ...]:
    acceptance = profile.acceptance if isinstance(profile.acceptance, Mapping) else {}
    ppa = acceptance.get("per_position_acceptance")
    if not isinstance(ppa, list) or not ppa:
        raise ProfileError(f"{where}: no 'acceptance.per_position_acceptance'; re-run `autotune tune`")
    return tuple(float(a) for a in ppa)


def _stack_cost(profile: Profile, where: str) -> StackCost | None:
    if not isinstance(profile.stack_cost, Mapping):
        return None
    try:
        return StackCost.from_json(profile.stack_cost)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileError(f"{where}: unreadable 'stack_cost' ({type(exc).__name__}: {exc})") from None


def _level_choices(decision: TableDecision) -> tuple[dict[int, int], dict[int, Estimate]]:
    """By batch size: the K the tune's per-level rule chose, and its measured ratio over the
    chosen configuration there (where the profile holds one)."""
    levels = () if decision is MISSING else decision.levels or ()
    choices = {lv.batch_size: lv.gamma for lv in levels}
    ratios = {
        lv.batch_size: Estimate(r.value, r.low, r.high, r.n)
        for lv in levels
        if (r := lv.over_chosen) is not MISSING
    }
    return choices, ratios


def _off_ratios(schedule: BatchSchedule) -> dict[int, float]:
    """By batch size, the schedule's measured ratio of its K over no speculation (where it speculates)."""
    out: dict[int, float] = {}
    for e in schedule.entries if isinstance(schedule, BatchSchedule) else ():
        value = e.ratio.get("value") if isinstance(e.ratio, Mapping) else None
        if e.gamma > 0 and isinstance(value, int | float) and value > 0:
            out[e.batch_size] = float(value)
    return out
