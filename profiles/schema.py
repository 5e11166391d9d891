"""Typed profile data: the stored profile as dataclasses with ``to_json`` / ``from_json``.

The JSON keys are the stored ones (docs/architecture.md, "Data flow of ``autotune tune``"), under
:data:`profiles.reading.SCHEMA_VERSION`. ``X.from_json(d).to_json() == d`` for every profile of this
schema, key order included (the ``yaml`` export dumps the profile in its order); a profile of an
older schema reads as its migration to this one (:func:`profiles.reading.migrate`). A key the
JSON lacks stays absent (:data:`MISSING`), keys this module does not name are kept in ``extra``,
and an object read from JSON remembers its key order. Sections that only the report shows
(device, pair, workload, study, metrics, classification, ...) stay mappings; the parts the tuner
decides and the exporters and the watch read are typed: :class:`Chosen` (the chosen knobs),
:class:`ScheduleEntry` / :class:`BatchSchedule` (gamma by batch size), :class:`TableDecision`
(the per-level choices and the table's verdict) and :class:`Profile`. :meth:`Profile.from_json`
is the one reader of a stored profile: it refuses a newer schema, migrates an older one and
validates ``chosen``, ``schedule`` and ``table_decision`` once, so what reads a :class:`Profile`
(the exporters, the report, the watch) takes those as checked.

``profiles`` never imports torch, ``engine`` or ``autotune`` (tests/profiles/test_profiles_imports.py).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from profiles.deployment import Deployment
from profiles.errors import ProfileError
from profiles.reading import (
    DRAFTERS,
    GAMMA_POLICIES,
    SCHEMA_VERSION,
    check_kind,
    check_schema_version,
    get,
    migrate,
)

__all__ = [
    "MISSING",
    "BatchSchedule",
    "Chosen",
    "LevelDecision",
    "PluginNeed",
    "Profile",
    "Ratio",
    "ScheduleEntry",
    "SCHEMA_VERSION",
    "TableDecision",
]


class _Missing:
    """A key the JSON does not have (distinct from a key holding null)."""

    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


def _split(
    data: Mapping[str, Any], names: Sequence[str], where: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    if not isinstance(data, Mapping):
        raise ProfileError(f"profile: {where!r} must be a mapping, got {data!r}")
    known = {n: data[n] for n in names if n in data}
    extra = {k: v for k, v in data.items() if k not in names}
    return known, extra


def _ordered(values: dict[str, Any], order: Sequence[str]) -> dict[str, Any]:
    """``values`` in ``order`` (a JSON object's original key order), then any others in their own order."""
    out = {k: values[k] for k in order if k in values}
    out.update((k, v) for k, v in values.items() if k not in out)
    return out


@dataclass(frozen=True)
class Chosen:
    """The chosen configuration (profile key ``chosen``).

    ``gamma_schedule`` is the per-row gamma policy (``constant`` or ``heuristic``), not the
    batch schedule; the key keeps its stored name. ``prompt_lookup_min``/``max`` are the n-gram
    window the study ran with. ``tree_topk`` is present only when the study searched token trees:
    ``"chain"``, the chosen static tree's per-depth top-k (``"2,1,1"``) or a dynamic tree's
    ``"KxD/N"`` (EAGLE-2: top-K expansion to depth D, the draft's best N nodes verified); gamma is
    then the tree's depth, the threshold 0 and the policy constant. ``best_chain`` (``gamma``,
    ``confidence_threshold``, ``gamma_schedule``, ``tokens_per_second``), present only when a tree
    was chosen, is the fastest measured chain of the tree's drafter (the draft model or the EAGLE-3
    head): what a stack that takes no tree exports.
    """

    drafter: str
    gamma: int
    confidence_threshold: float = MISSING
    gamma_schedule: str = MISSING
    max_batch_size: int | None = MISSING
    prompt_lookup_min: int | None = MISSING
    prompt_lookup_max: int | None = MISSING
    tree_topk: str = MISSING
    best_chain: Mapping[str, Any] | None = MISSING
    extra: Mapping[str, Any] = field(default_factory=dict)
    key_order: tuple[str, ...] = field(default=(), compare=False, repr=False)

    KEYS = (
        "drafter",
        "gamma",
        "confidence_threshold",
        "gamma_schedule",
        "max_batch_size",
        "prompt_lookup_min",
        "prompt_lookup_max",
        "tree_topk",
        "best_chain",
    )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Chosen:
        """Validate ``chosen`` as exporters need it; ProfileError names the key (``chosen.<key>``)."""
        known, extra = _split(data, cls.KEYS, "chosen")
        wrapped = {"chosen": data}
        drafter = get(wrapped, "chosen.drafter", str)
        if drafter not in DRAFTERS:
            raise ProfileError(
                f"profile: 'chosen.drafter' must be one of {', '.join(DRAFTERS)}, got {drafter!r}"
            )
        gamma = get(wrapped, "chosen.gamma", int)
        if gamma < 0:
            raise ProfileError(f"profile: 'chosen.gamma' must be >= 0, got {gamma}")
        threshold = get(wrapped, "chosen.confidence_threshold", float, default=MISSING)
        if threshold is not MISSING and not 0.0 <= threshold <= 1.0:
            raise ProfileError(f"profile: 'chosen.confidence_threshold' must be in [0, 1], got {threshold}")
        policy = get(wrapped, "chosen.gamma_schedule", str, default=MISSING)
        if policy is not MISSING and policy not in GAMMA_POLICIES:
            raise ProfileError(
                f"profile: 'chosen.gamma_schedule' must be one of {', '.join(GAMMA_POLICIES)}, got {policy!r}"
            )
        if drafter == "ngram":
            lookup_min = get(wrapped, "chosen.prompt_lookup_min", int)
            lookup_max = get(wrapped, "chosen.prompt_lookup_max", int)
            if not 1 <= lookup_min <= lookup_max:
                raise ProfileError(
                    "profile: need 1 <= 'chosen.prompt_lookup_min' <= 'chosen.prompt_lookup_max', "
                    f"got {lookup_min} and {lookup_max}"
                )
        max_batch = get(wrapped, "chosen.max_batch_size", int, default=MISSING, nullable=True)
        if max_batch not in (MISSING, None) and max_batch < 1:
            raise ProfileError(f"profile: 'chosen.max_batch_size' must be >= 1, got {max_batch}")
        tree = get(wrapped, "chosen.tree_topk", str, default=MISSING)
        if tree is not MISSING:
            shape = parse_tree_topk(tree)
            if shape and drafter not in ("model", "eagle3"):
                raise ProfileError(
                    f"profile: 'chosen.tree_topk' {tree!r} needs the 'model' or 'eagle3' drafter, "
                    f"got {drafter!r}"
                )
            if shape and len(shape) != gamma:
                raise ProfileError(
                    f"profile: 'chosen.tree_topk' {tree!r} has depth {len(shape)} but "
                    f"'chosen.gamma' is {gamma}"
                )
        best_chain = get(wrapped, "chosen.best_chain", dict, default=MISSING, nullable=True)
        if best_chain not in (MISSING, None):
            chain_gamma = get(wrapped, "chosen.best_chain.gamma", int)
            if chain_gamma < 1:
                raise ProfileError(f"profile: 'chosen.best_chain.gamma' must be >= 1, got {chain_gamma}")
        # stored as written (a float threshold stays as it was, e.g. 0 or 0.0)
        return cls(**{k: known.get(k, MISSING) for k in cls.KEYS}, extra=extra, key_order=tuple(data))

    def to_json(self) -> dict[str, Any]:
        values = {k: getattr(self, k) for k in self.KEYS if getattr(self, k) is not MISSING}
        return _ordered({**values, **self.extra}, self.key_order)

    # effective values, with the defaults exporters apply to a profile that lacks a key
    @property
    def threshold(self) -> float:
        return 0.0 if self.confidence_threshold is MISSING else float(self.confidence_threshold)

    @property
    def gamma_policy(self) -> str:
        return "constant" if self.gamma_schedule is MISSING else self.gamma_schedule

    @property
    def tree_shape(self) -> tuple[int, ...]:
        """The chosen tree's per-depth top-k (a dynamic tree's top-k at each depth); ``()`` for a
        chain (or a profile without trees)."""
        return () if self.tree_topk is MISSING else parse_tree_name(self.tree_topk)[0]

    @property
    def tree_nodes(self) -> int:
        """A dynamic tree's verified nodes; 0 for a static tree or a chain."""
        return 0 if self.tree_topk is MISSING else parse_tree_name(self.tree_topk)[1]


def parse_tree_topk(value: str) -> tuple[int, ...]:
    """The per-depth top-k of a tree name (:func:`parse_tree_name`).

    Example:
        >>> parse_tree_topk("2,1,1"), parse_tree_topk("chain")
        ((2, 1, 1), ())
        >>> parse_tree_topk("1,1"), parse_tree_topk("2x3/5")
        ((), (2, 2, 2))
    """
    return parse_tree_name(value)[0]


def parse_tree_name(value: str) -> tuple[tuple[int, ...], int]:
    """A tree as the profile names it -> ``(per-depth top-k, dynamic tree's nodes or 0)``:
    ``"chain"`` -> ``((), 0)``; ``"2,1,1"`` -> ``((2, 1, 1), 0)`` (all ones is the chain); ``"KxD/N"``
    -> ``((K,) * D, N)``; ProfileError otherwise.

    Example:
        >>> parse_tree_name("2,1"), parse_tree_name("2x6/10")
        (((2, 1), 0), ((2, 2, 2, 2, 2, 2), 10))
    """
    if value == "chain":
        return (), 0
    m = re.fullmatch(r"(\d+)x(\d+)/(\d+)", value.replace(" ", ""))
    if m is not None:
        k, depth, nodes = map(int, m.groups())
        if k < 2 or depth < 1 or not 1 <= nodes <= k + (depth - 1) * k * k:
            raise ProfileError(
                f"profile: 'chosen.tree_topk' {value!r}: a dynamic tree 'KxD/N' needs K >= 2, D >= 1 "
                f"and 1 <= N <= K + (D - 1) * K^2"
            )
        return (k,) * depth, nodes
    parts = value.split(",")
    if not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise ProfileError(
            f"profile: 'chosen.tree_topk' must be 'chain', a per-depth top-k like '2,1,1' or a "
            f"dynamic tree like '2x6/10', got {value!r}"
        )
    shape = tuple(int(p) for p in parts)
    return ((), 0) if all(k == 1 for k in shape) else (shape, 0)


@dataclass(frozen=True)
class ScheduleEntry:
    """One batch size of the batch schedule (profile ``schedule[i]``): ``batch_size`` >= 1, ``gamma`` >= 0.

    ``ratio`` (``{"value", "ci95", "n"}``) and ``significant`` are present where the entry was
    decided on paired repeats (the interval rule), absent otherwise.
    """

    batch_size: int
    gamma: int
    tokens_per_second: float | None = MISSING
    baseline_tokens_per_second: float | None = MISSING
    ratio: Mapping[str, Any] = MISSING
    significant: bool = MISSING
    extra: Mapping[str, Any] = field(default_factory=dict)
    key_order: tuple[str, ...] = field(default=(), compare=False, repr=False)

    KEYS = ("batch_size", "gamma", "tokens_per_second", "baseline_tokens_per_second", "ratio", "significant")

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = "schedule[0]") -> ScheduleEntry:
        """Validate one entry; ProfileError names the key (``<where>.<key>``)."""
        known, extra = _split(data, cls.KEYS, where)
        for key in ("batch_size", "gamma"):
            if key not in known:
                raise ProfileError(f"profile: missing key '{where}.{key}'")
        batch = check_kind(known["batch_size"], int, f"{where}.batch_size")
        gamma = check_kind(known["gamma"], int, f"{where}.gamma")
        if batch < 1:
            raise ProfileError(f"profile: '{where}.batch_size' must be >= 1, got {batch}")
        if gamma < 0:
            raise ProfileError(f"profile: '{where}.gamma' must be >= 0, got {gamma}")
        return cls(**{k: known.get(k, MISSING) for k in cls.KEYS}, extra=extra, key_order=tuple(data))

    def to_json(self) -> dict[str, Any]:
        values = {k: getattr(self, k) for k in self.KEYS if getattr(self, k) is not MISSING}
        return _ordered({**values, **self.extra}, self.key_order)


@dataclass(frozen=True)
class BatchSchedule:
    """Gamma by batch size (profile keys ``schedule`` and ``crossover_batch_size``).

    The crossover is the smallest batch size from which every larger one has gamma 0 (None when
    speculation pays at every measured batch size).
    """

    entries: tuple[ScheduleEntry, ...]
    crossover_batch_size: int | None = MISSING

    @classmethod
    def from_json(
        cls, entries: Sequence[Mapping[str, Any]], crossover: int | None = MISSING
    ) -> BatchSchedule:
        """Validate the stored ``schedule``: at least one entry, each batch size once.

        Example:
            >>> entries = [{"batch_size": 4, "gamma": 2}, {"batch_size": 1, "gamma": 5}]
            >>> BatchSchedule.from_json(entries).pairs()
            ((1, 5), (4, 2))
            >>> BatchSchedule.from_json([{"batch_size": 1, "gamma": 2}, {"batch_size": 1, "gamma": 3}])
            Traceback (most recent call last):
            ...
            profiles.errors.ProfileError: profile: 'schedule' lists batch size 1 twice
        """
        if not isinstance(entries, list):
            raise ProfileError(f"profile: 'schedule' must be a list, got {entries!r}")
        if not entries:
            raise ProfileError("profile: 'schedule' is empty (need at least one batch size)")
        parsed: list[ScheduleEntry] = []
        for i, data in enumerate(entries):
            entry = ScheduleEntry.from_json(data, f"schedule[{i}]")
            if any(seen.batch_size == entry.batch_size for seen in parsed):
                raise ProfileError(f"profile: 'schedule' lists batch size {entry.batch_size} twice")
            parsed.append(entry)
        return cls(tuple(parsed), crossover)

    def to_json(self) -> list[dict[str, Any]]:
        return [e.to_json() for e in self.entries]

    def pairs(self) -> tuple[tuple[int, int], ...]:
        """``((batch_size, gamma), ...)`` sorted by batch size."""
        return tuple(sorted((e.batch_size, e.gamma) for e in self.entries))


@dataclass(frozen=True)
class Ratio:
    """A paired ratio over ``n`` rounds and its 95% interval, stored as ``{"value", "ci95": [low, high],
    "n"}``: the shape of every paired ratio in a profile (``schedule[].ratio`` too)."""

    value: float
    low: float
    high: float
    n: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str) -> Ratio:
        """Validate one ratio; ProfileError names the key (``<where>.<key>``). Numbers are kept as written."""
        known, _ = _split(data, ("value", "ci95", "n"), where)
        for key in ("value", "ci95", "n"):
            if key not in known:
                raise ProfileError(f"profile: missing key '{where}.{key}'")
        ci95 = check_kind(known["ci95"], list, f"{where}.ci95")
        if len(ci95) != 2:
            raise ProfileError(f"profile: '{where}.ci95' must be [low, high], got {ci95!r}")
        for bound in ci95:
            check_kind(bound, float, f"{where}.ci95")
        if not check_kind(known["value"], float, f"{where}.value") > 0:
            raise ProfileError(f"profile: '{where}.value' must be > 0, got {known['value']!r}")
        if check_kind(known["n"], int, f"{where}.n") < 1:
            raise ProfileError(f"profile: '{where}.n' must be >= 1, got {known['n']!r}")
        return cls(known["value"], ci95[0], ci95[1], known["n"])

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "ci95": [self.low, self.high], "n": self.n}


@dataclass(frozen=True)
class LevelDecision:
    """One load level of ``table_decision.levels``: the K the per-level rule chose there, its measured
    tokens/s and why. ``over_chosen``, where measured: the paired ratio of this level's choice over
    the configuration the profile serves, at this level (``autotune watch`` takes its interval
    where it has no live acceptance)."""

    batch_size: int
    gamma: int
    tokens_per_second: float | None = MISSING
    reason: str = MISSING
    over_chosen: Ratio = MISSING
    extra: Mapping[str, Any] = field(default_factory=dict)
    key_order: tuple[str, ...] = field(default=(), compare=False, repr=False)

    KEYS = ("batch_size", "gamma", "tokens_per_second", "reason", "over_chosen")

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str) -> LevelDecision:
        known, extra = _split(data, cls.KEYS, where)
        for key in ("batch_size", "gamma"):
            if key not in known:
                raise ProfileError(f"profile: missing key '{where}.{key}'")
        if check_kind(known["batch_size"], int, f"{where}.batch_size") < 1:
            raise ProfileError(f"profile: '{where}.batch_size' must be >= 1, got {known['batch_size']}")
        if check_kind(known["gamma"], int, f"{where}.gamma") < 0:
            raise ProfileError(f"profile: '{where}.gamma' must be >= 0, got {known['gamma']}")
        if known.get("tokens_per_second") is not None:
            check_kind(known["tokens_per_second"], float, f"{where}.tokens_per_second")
        if "over_chosen" in known:
            known["over_chosen"] = Ratio.from_json(known["over_chosen"], f"{where}.over_chosen")
        return cls(**{k: known.get(k, MISSING) for k in cls.KEYS}, extra=extra, key_order=tuple(data))

    def to_json(self) -> dict[str, Any]:
        values = {k: getattr(self, k) for k in self.KEYS if getattr(self, k) is not MISSING}
        if self.over_chosen is not MISSING:
            values["over_chosen"] = self.over_chosen.to_json()
        return _ordered({**values, **self.extra}, self.key_order)


@dataclass(frozen=True)
class PluginNeed:
    """What a served table with a K=0 range needs (profile key ``table_decision.needs_plugin``).

    The table was measured in a vLLM whose K=0 skips the drafter: the spec-autotune vLLM plugin
    (``plugin``, the distribution's name; docs/stacks/vllm.md#the-k0-skip-plugin), switched on by
    ``env`` = 1 in the server's environment, tested on the vLLM release line ``vllm_version`` (as
    the tuned server reported it; None where it did not). Without the plugin a K=0 range still runs
    the drafter, so a server without it serves ``fallback`` instead: ``(batch_size, K)`` pairs
    measured live beside the table (a table of K >= 1, or the best constant's K at every batch
    size, 0 being no speculation), and ``fallback_reason`` says which and why.

    Example:
        >>> need = PluginNeed.from_json({"plugin": "spec-autotune-vllm-plugin",
        ...     "env": "SPEC_AUTOTUNE_K0_SKIP", "vllm_version": "0.32.0", "fallback": [[1, 3], [16, 3]]})
        >>> need.fallback, PluginNeed.from_json(need.to_json()) == need
        (((1, 3), (16, 3)), True)
    """

    plugin: str
    env: str
    fallback: tuple[tuple[int, int], ...]
    vllm_version: str | None = MISSING
    fallback_reason: str = MISSING
    extra: Mapping[str, Any] = field(default_factory=dict)
    key_order: tuple[str, ...] = field(default=(), compare=False, repr=False)

    KEYS = ("plugin", "env", "vllm_version", "fallback", "fallback_reason")

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = "table_decision.needs_plugin") -> PluginNeed:
        """Validate ``needs_plugin``; ProfileError names the key (``<where>.<key>``)."""
        known, extra = _split(data, cls.KEYS, where)
        for key in ("plugin", "env", "fallback"):
            if key not in known:
                raise ProfileError(f"profile: missing key '{where}.{key}'")
        for key in ("plugin", "env", "fallback_reason"):
            if key in known:
                check_kind(known[key], str, f"{where}.{key}")
        if known.get("vllm_version") is not None:
            check_kind(known["vllm_version"], str, f"{where}.vllm_version")
        fallback = _pairs(known["fallback"], f"{where}.fallback")
        if not fallback or any(b < 1 or k < 0 for b, k in fallback):
            raise ProfileError(
                f"profile: '{where}.fallback' must be [batch_size >= 1, K >= 0] pairs, "
                f"got {known['fallback']!r}"
            )
        known["fallback"] = fallback
        return cls(**{k: known.get(k, MISSING) for k in cls.KEYS}, extra=extra, key_order=tuple(data))

    def to_json(self) -> dict[str, Any]:
        values = {k: getattr(self, k) for k in self.KEYS if getattr(self, k) is not MISSING}
        values["fallback"] = [list(p) for p in self.fallback]
        return _ordered({**values, **self.extra}, self.key_order)


@dataclass(frozen=True)
class TableDecision:
    """Why the schedule is a by-batch-size table or one K (profile key ``table_decision``).

    Written by ``autotune.decide.decision.TableContest``: the per-level choices (``levels``), the
    table they make (``(batch_size, K)`` pairs), whether it was served live beside the best
    constant and no speculation and won there, the verdict's per-level ratios (``per_level``, as
    ``autotune.decide.selection.TableVerdict`` holds them), the arrival trace's tokens/s of each
    served configuration, and the reason in one sentence; ``needs_plugin`` (:class:`PluginNeed`)
    where the served table holds a K=0 range that only the spec-autotune vLLM plugin serves as
    speculation off. Absent keys stay absent (a profile written without a key reads without it).
    """

    levels: tuple[LevelDecision, ...] = MISSING
    table: tuple[tuple[int, int], ...] = MISSING
    served: bool = MISSING
    won: bool = MISSING
    per_level: Sequence[Mapping[str, Any]] = MISSING
    trace_tokens_per_second: Mapping[str, float | None] = MISSING
    reason: str = MISSING
    needs_plugin: PluginNeed = MISSING
    extra: Mapping[str, Any] = field(default_factory=dict)
    key_order: tuple[str, ...] = field(default=(), compare=False, repr=False)

    KEYS = (
        "levels",
        "table",
        "served",
        "won",
        "per_level",
        "trace_tokens_per_second",
        "reason",
        "needs_plugin",
    )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TableDecision:
        """Validate ``table_decision``; ProfileError names the key (``table_decision.<key>``).

        Example:
            >>> d = TableDecision.from_json({"levels": [{"batch_size": 4, "gamma": 2}], "table": [[4, 2]]})
            >>> d.levels[0].gamma, d.table, d.won
            (2, ((4, 2),), MISSING)
        """
        known, extra = _split(data, cls.KEYS, "table_decision")
        if "levels" in known:
            levels = check_kind(known["levels"], list, "table_decision.levels")
            known["levels"] = tuple(
                LevelDecision.from_json(lv, f"table_decision.levels[{i}]") for i, lv in enumerate(levels)
            )
        if "table" in known:
            known["table"] = _pairs(known["table"], "table_decision.table")
        for key in ("served", "won"):
            if key in known:
                check_kind(known[key], bool, f"table_decision.{key}")
        if "needs_plugin" in known:
            known["needs_plugin"] = PluginNeed.from_json(known["needs_plugin"])
        return cls(**{k: known.get(k, MISSING) for k in cls.KEYS}, extra=extra, key_order=tuple(data))

    def to_json(self) -> dict[str, Any]:
        values = {k: getattr(self, k) for k in self.KEYS if getattr(self, k) is not MISSING}
        if self.levels is not MISSING:
            values["levels"] = [lv.to_json() for lv in self.levels]
        if self.table is not MISSING:
            values["table"] = [list(p) for p in self.table]
        if self.needs_plugin is not MISSING:
            values["needs_plugin"] = self.needs_plugin.to_json()
        return _ordered({**values, **self.extra}, self.key_order)


def _pairs(value: Any, where: str) -> tuple[tuple[int, int], ...]:
    """``[[batch_size, K], ...]`` as a tuple of integer pairs; ProfileError naming ``where`` otherwise."""
    pairs = check_kind(value, list, where)
    if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        raise ProfileError(f"profile: {where!r} must be [batch_size, K] pairs, got {pairs!r}")
    return tuple((check_kind(b, int, where), check_kind(k, int, where)) for b, k in pairs)


_PROFILE_KEYS = (
    "schema_version",
    "tool_version",
    "created_at",
    "device",
    "pair",
    "workload",
    "study",
    "chosen",
    "selection",
    "schedule",
    "crossover_batch_size",
    "table_decision",
    "metrics",
    "baseline",
    "trials",
    "pareto_front",
    "remeasure",
    "remeasured",
    "classification",
    "ceilings",
    "knee_tokens",
    "curves",
    "acceptance",
    "predicted_vs_measured",
    "host_noise",
    "backend",
    "deployment",
    "stack_cost",
    "id",
    "exports",
)


@dataclass(frozen=True)
class Profile:
    """A stored per-device profile: what ``autotune tune`` chose, measured and decided.

    Field order is the stored key order of a profile ``autotune tune`` writes. Untyped sections
    are the mappings the tuner writes (their keys: docs/architecture.md and docs/metrics.md).
    """

    schema_version: int = SCHEMA_VERSION
    tool_version: str = MISSING
    created_at: str = MISSING  # ISO 8601, UTC, seconds
    device: Mapping[str, Any] = MISSING  # autotune.device.hardware.fingerprint
    pair: Mapping[str, Any] = MISSING  # target, draft, drafter, target_hash, draft_hash
    workload: Mapping[str, Any] = MISSING
    study: Mapping[str, Any] = (
        MISSING  # name, storage, n_trials, failed_trials, space, slo, objectives, budget
    )
    chosen: Chosen = MISSING
    selection: Mapping[str, Any] = MISSING  # met_slo, reason, trial
    schedule: BatchSchedule = MISSING  # stored as `schedule` and `crossover_batch_size`
    # the per-level choices, the table they make, whether it was served live and won, and why
    table_decision: TableDecision = MISSING
    metrics: Mapping[str, Any] = MISSING
    baseline: Mapping[str, Any] = MISSING
    trials: Sequence[Mapping[str, Any]] = MISSING
    pareto_front: Sequence[Mapping[str, Any]] = MISSING
    remeasure: Mapping[str, Any] = MISSING
    remeasured: Sequence[Mapping[str, Any]] = MISSING
    classification: Any = MISSING
    ceilings: Mapping[str, Any] = MISSING
    knee_tokens: int | None = MISSING
    curves: Mapping[str, Any] = MISSING
    acceptance: Mapping[str, Any] = MISSING
    predicted_vs_measured: Sequence[Mapping[str, Any]] = MISSING
    host_noise: Mapping[str, Any] = MISSING
    backend: Mapping[str, Any] = MISSING
    deployment: Deployment = MISSING  # the server flags every trial ran with (profiles.deployment)
    # the backend's step costs per (load level, K) fitted apart from acceptance (autotune.cost.stackcost)
    stack_cost: Mapping[str, Any] = MISSING
    id: int = MISSING  # the store's id, once stored
    exports: Sequence[str] = MISSING  # paths written by `autotune tune`
    extra: Mapping[str, Any] = field(default_factory=dict)
    key_order: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Profile:
        """Read a stored profile; a newer schema_version is refused, an older one migrated
        (:func:`profiles.reading.migrate`), ``chosen``/``schedule``/``table_decision`` are validated."""
        check_schema_version(data)
        data = migrate(data)
        known, extra = _split(data, _PROFILE_KEYS, "profile")
        fields = {k: v for k, v in known.items() if k != "crossover_batch_size"}
        fields.setdefault("schema_version", MISSING)
        if "chosen" in known:
            fields["chosen"] = Chosen.from_json(known["chosen"])
        if "schedule" in known:
            fields["schedule"] = BatchSchedule.from_json(
                known["schedule"], known.get("crossover_batch_size", MISSING)
            )
        elif "crossover_batch_size" in known:
            extra = {**extra, "crossover_batch_size": known["crossover_batch_size"]}
        if "table_decision" in known:
            fields["table_decision"] = TableDecision.from_json(known["table_decision"])
        if "deployment" in known:
            fields["deployment"] = Deployment.from_json(known["deployment"])
        return cls(**fields, extra=extra, key_order=tuple(data))

    def to_json(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name in ("extra", "key_order"):
                continue
            value = getattr(self, f.name)
            if value is MISSING:
                continue
            if f.name == "schedule":
                values["schedule"] = value.to_json()
                if value.crossover_batch_size is not MISSING:
                    values["crossover_batch_size"] = value.crossover_batch_size
            elif f.name in ("chosen", "table_decision", "deployment"):
                values[f.name] = value.to_json()
            else:
                values[f.name] = value
        return _ordered({**values, **self.extra}, self.key_order)
