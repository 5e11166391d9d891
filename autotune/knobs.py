"""One configuration of speculative decoding, typed from the study to the profile: :class:`Knobs`.

A trial's settings travel as a frozen :class:`Knobs` from the moment the study suggests them
until the profile is written. Dictionaries appear only at two boundaries: Optuna's flat params
(:meth:`Knobs.from_params` / :meth:`Knobs.to_params`, the keys stored studies and profiles
already use) and the stored JSON.

Vocabulary: ``gamma`` is the number of draft tokens per step (0 = speculation off);
``gamma_policy`` is the per-row policy (``constant`` or ``heuristic``; its stored key is
``gamma_schedule``, which is *not* the profile's by-batch-size ``schedule``); ``tree`` is the
token-tree shape (``()`` = the chain, a per-depth top-k tuple, or a dynamic
:class:`engine.tree.DynamicTree`), whose depth is then the gamma; ``table`` is a by-batch-size
K table (:data:`Table`: what vLLM serves as ``num_speculative_tokens_per_batch_size``), whose
largest K is then the gamma.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autotune.errors import ConfigError
from engine.errors import EngineInputError
from engine.speculative import SpecConfig
from engine.tree import DynamicTree, TreeShape, tree_depth
from profiles.exporters._common import batch_ranges

Tree = tuple[int, ...] | DynamicTree
"""A token tree as the tuner holds it: ``()`` is the chain."""

Table = tuple[tuple[int, int], ...]
"""A by-batch-size K table: tuned ``(batch_size, K)`` points, sorted; ``()`` is one K everywhere.
With B running requests the K is that of the smallest tuned batch size >= B, above the largest
the last point's (:meth:`engine.speculative.SpecConfig.gamma_at`, the vLLM export's ranges)."""

CHAIN = "chain"
TREE_DRAFTERS = ("model", "eagle3")
"""Drafters that draft token trees (engine.tree_draft.TreeDrafter: the draft model, an EAGLE-3 head)."""
TABLE_PARAM = "table"
PARAM_KEYS = ("drafter", "gamma", "confidence_threshold", "gamma_schedule", "max_batch_size")
"""Optuna's flat params, in the order studies and profiles store them (``tree_topk`` follows when
trees are searched)."""
TREE_PARAM = "tree_topk"


def tree_name(tree: Tree) -> str:
    """A tree as tune.yaml and the profile write it: ``"chain"``, a static tree's per-depth top-k
    (``"2,1,1"``) or a dynamic tree's ``"KxD/N"``.

    Example:
        >>> tree_name(()), tree_name((2, 1, 1)), tree_name(DynamicTree(2, 6, 10))
        ('chain', '2,1,1', '2x6/10')
    """
    if isinstance(tree, DynamicTree):
        return tree.name
    return CHAIN if not tree or all(k == 1 for k in tree) else ",".join(map(str, tree))


def parse_tree(value: Any, key: str = "search.tree_topk") -> Tree:
    """One tree as tune.yaml or a study's params write it -> :data:`Tree`; ConfigError names key and value.

    ``"chain"`` (or top-k 1 at every depth) is the chain; ``"2,1,1"``, ``[2, 1, 1]`` or ``2`` give the
    top-k of each depth (depth = gamma = the number of entries); ``"KxD/N"`` is a dynamic (EAGLE-2)
    tree: top-K expansion to depth D, the N best-scored nodes verified (engine.tree.DynamicTree).

    Example:
        >>> parse_tree("2,1,1"), parse_tree([3, 1]), parse_tree("chain"), parse_tree("1,1"), parse_tree("2x6/10")
        ((2, 1, 1), (3, 1), (), (), DynamicTree(topk=2, depth=6, nodes=10))
    """
    if value == CHAIN:
        return ()
    if isinstance(value, str) and "/" in value:
        try:
            return DynamicTree.parse(value)
        except EngineInputError as exc:
            raise ConfigError(f"{key}: {value!r}: {str(exc).removeprefix('tree_nodes: ')}") from None
    parts: list[Any]
    if isinstance(value, int) and not isinstance(value, bool):
        parts = [value]
    elif isinstance(value, str):
        parts = [int(p) if re.fullmatch(r"\d+", p) else p for p in (s.strip() for s in value.split(","))]
    elif isinstance(value, list):
        parts = list(value)
    else:
        parts = [value]
    if not parts or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in parts):
        raise ConfigError(
            f"{key}: {value!r} is not 'chain' or a per-depth top-k list like '2,1,1' (integers >= 1)"
        )
    try:
        TreeShape(tuple(parts))
    except EngineInputError as exc:
        raise ConfigError(f"{key}: {value!r}: {str(exc).removeprefix('tree_topk: ')}") from None
    return () if all(k == 1 for k in parts) else tuple(parts)


@dataclass(frozen=True)
class Knobs:
    """One configuration: what a trial runs, what is re-measured and what is chosen.

    ``max_batch_size`` is the engine's rows (a stack's ``--max-num-seqs``). A tree (``tree`` not
    ``()``) drafts with the ``model`` or the ``eagle3`` drafter (:data:`TREE_DRAFTERS`); its gamma
    is its depth, its threshold 0 and its policy constant (:meth:`for_tree`). A table (``table`` not ``()``) is a constant-policy chain
    whose K follows the number of running requests; its gamma is its largest K
    (:meth:`for_table`). Tables are not searched by the study: the decision builds one from the
    per-level choices and serves it live (autotune.decide.decision).
    """

    drafter: str
    gamma: int
    confidence_threshold: float = 0.0
    gamma_policy: str = "constant"
    max_batch_size: int = 1
    tree: Tree = ()
    table: Table = ()

    @classmethod
    def for_table(cls, drafter: str, table: Table, max_batch_size: int) -> Knobs:
        """A chain of ``drafter`` whose K follows ``table`` (gamma = its largest K).

        Example:
            >>> k = Knobs.for_table("model", ((1, 5), (4, 3), (16, 0)), 16)
            >>> k.gamma, k.is_table, k.label
            (5, True, 'table 1:5 2-4:3 5-16:0')
        """
        points = tuple(sorted((int(b), int(g)) for b, g in table))
        return cls(drafter, max(g for _, g in points), 0.0, "constant", max_batch_size, (), points)

    @classmethod
    def for_tree(cls, tree: Tree, max_batch_size: int, drafter: str = "model") -> Knobs:
        """``drafter`` (the draft model unless named) drafting ``tree`` (gamma = its depth, threshold 0,
        constant policy).

        Example:
            >>> k = Knobs.for_tree((2, 1), 4, "eagle3")
            >>> k.gamma, k.is_tree, k.label
            (2, True, 'gamma=2 thr=0.00 constant tree=2,1')
        """
        return cls(drafter, tree_depth(tree), 0.0, "constant", max_batch_size, tree)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Knobs:
        """Optuna's flat params (or a stored profile's) -> Knobs.

        Example:
            >>> Knobs.from_params({"drafter": "model", "gamma": 2, "confidence_threshold": 0.0,
            ...                    "gamma_schedule": "constant", "max_batch_size": 4, "tree_topk": "2,1"}).tree
            (2, 1)
        """
        return cls(
            drafter=str(params["drafter"]),
            gamma=int(params.get("gamma", 0)),
            confidence_threshold=float(params.get("confidence_threshold", 0.0)),
            gamma_policy=str(params.get("gamma_schedule", "constant")),
            max_batch_size=int(params.get("max_batch_size", 1)),
            tree=parse_tree(params.get(TREE_PARAM, CHAIN), f"params.{TREE_PARAM}"),
            table=tuple((int(b), int(g)) for b, g in params.get(TABLE_PARAM, ())),
        )

    def to_params(self, with_tree: bool) -> dict[str, Any]:
        """The flat params a study stores (``tree_topk`` only ``with_tree``: when trees are searched).

        Example:
            >>> Knobs("model", 3, 0.1, "constant", 4).to_params(with_tree=False)
            {'drafter': 'model', 'gamma': 3, 'confidence_threshold': 0.1, 'gamma_schedule': 'constant', 'max_batch_size': 4}
        """
        out: dict[str, Any] = {
            "drafter": self.drafter,
            "gamma": self.gamma,
            "confidence_threshold": self.confidence_threshold,
            "gamma_schedule": self.gamma_policy,
            "max_batch_size": self.max_batch_size,
        }
        if with_tree:
            out[TREE_PARAM] = self.tree_name
        if self.table:
            out[TABLE_PARAM] = [list(p) for p in self.table]
        return out

    @property
    def speculates(self) -> bool:
        """Whether any token is drafted (gamma > 0 with a drafter)."""
        return self.gamma > 0 and self.drafter != "none"

    @property
    def is_tree(self) -> bool:
        """A token tree (not the chain) of a drafter that drafts trees (:data:`TREE_DRAFTERS`)."""
        return bool(self.tree) and self.drafter in TREE_DRAFTERS and self.gamma > 0

    @property
    def tree_name(self) -> str:
        """``"chain"`` unless this is a tree (:func:`tree_name`)."""
        return tree_name(self.tree) if self.is_tree else CHAIN

    @property
    def is_table(self) -> bool:
        """A chain whose K follows the number of running requests (:data:`Table`)."""
        return bool(self.table) and self.speculates

    @property
    def is_static_chain(self) -> bool:
        """A speculative chain with one constant gamma and no threshold: what a stack's K is."""
        return (
            self.gamma > 0
            and not self.is_tree
            and not self.table
            and self.gamma_policy == "constant"
            and self.confidence_threshold == 0.0
        )

    def gamma_at(self, batch: int) -> int:
        """The K with ``batch`` running requests: the table's (:meth:`SpecConfig.gamma_at`), else gamma.

        Example:
            >>> [Knobs.for_table("model", ((1, 5), (4, 3), (16, 0)), 16).gamma_at(b) for b in (1, 2, 5, 32)]
            [5, 3, 0, 0]
        """
        return self.spec_config().gamma_at(batch) if self.is_table else self.gamma

    def without_speculation(self) -> Knobs:
        """The same batch shape and drafter with speculation off (the AR baseline)."""
        return dataclasses.replace(
            self, gamma=0, confidence_threshold=0.0, gamma_policy="constant", tree=(), table=()
        )

    def spec_config(self) -> SpecConfig:
        """The engine's settings; a tree becomes :meth:`SpecConfig.for_tree` (gamma = its depth).

        Example:
            >>> Knobs("model", 2, tree=(2, 1)).spec_config().tree_topk
            (2, 1)
        """
        if self.is_tree:
            return SpecConfig.for_tree(self.tree)
        return SpecConfig(
            gamma=self.gamma,
            confidence_threshold=self.confidence_threshold,
            gamma_schedule=self.gamma_policy,
            batch_gammas=self.table,
        )

    @property
    def simplicity(self) -> tuple[int, int, int, float, int]:
        """Sort key, simplest first: no speculation, then one constant gamma (not a per-row policy,
        not a by-batch-size table), a chain (not a token tree), no threshold, small gamma.

        Example:
            >>> ks = [Knobs("model", 4, gamma_policy="heuristic"), Knobs("model", 0), Knobs("model", 6)]
            >>> [k.gamma for k in sorted(ks, key=lambda k: k.simplicity)]
            [0, 6, 4]
        """
        if self.gamma == 0:
            return (0, 0, 0, 0.0, 0)
        return (
            1,
            int(self.gamma_policy != "constant") + int(self.is_table),
            int(self.is_tree),
            self.confidence_threshold,
            self.gamma,
        )

    @property
    def structure(self) -> tuple[int, int, int, float]:
        """:attr:`simplicity` without gamma: what the margin rule counts as simpler.

        Choosing K=5 over K=3 adds nothing to what a stack is given (one number either way), so
        the faster K of one structure wins on its measurement; no speculation, a per-row policy, a
        table, a tree or a threshold is a different structure, which a winner must beat by a
        margin (:func:`autotune.decide.selection.choose_with_margin`).

        Example:
            >>> Knobs("model", 3).structure == Knobs("model", 5).structure, Knobs("model", 0).structure
            (True, (0, 0, 0, 0.0))
        """
        return self.simplicity[:4]

    @property
    def label(self) -> str:
        """The configuration in a few words, for selection reasons.

        Example:
            >>> Knobs("model", 0).label, Knobs("model", 8, 0.1).label
            ('gamma=0 (no speculation)', 'gamma=8 thr=0.10 constant')
        """
        if self.gamma == 0:
            return "gamma=0 (no speculation)"
        if self.is_table:
            return "table " + table_text(self.table)
        label = f"gamma={self.gamma} thr={self.confidence_threshold:.2f} {self.gamma_policy}"
        return label + f" tree={self.tree_name}" if self.is_tree else label


def table_text(table: Table) -> str:
    """A table as inclusive batch-size ranges: ``"1:5 2-4:3 5-16:0"`` (the last K holds above).

    Example:
        >>> table_text(((1, 5), (2, 5), (8, 2)))
        '1-2:5 3-8:2'
    """
    return " ".join(f"{lo}:{g}" if lo == hi else f"{lo}-{hi}:{g}" for lo, hi, g in batch_ranges(table))
