"""The architecture of autotune/ as a rule: its packages, their modules, and the floor order.

``python -m tools.structure`` prints every unit of ``autotune/`` (a subpackage, or a module at the
top level), bottom floor first, with its modules and what it imports from the floors below; it
exits 1 when a unit imports a unit on a floor above its own (tests/test_import_graph.py runs the
same check). The floors are the layering of docs/architecture.md: a unit may import its own
modules and any unit on a lower floor, never one on its own floor or above.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FLOORS: tuple[tuple[str, ...], ...] = (
    ("errors", "stats"),  # what every layer uses: one-line errors, paired ratios and intervals
    ("knobs",),  # one configuration, typed from the study to the profile
    ("records",),  # typed measurements: curves, samples, trial results, points
    ("config",),  # tune.yaml as typed sections
    ("cost",),  # the engine's cost model, a stack's fitted step cost, the acceptance model
    ("workload",),  # requests, load runs on the engine, arrival traces
    ("device",),  # fingerprint, ceilings, host noise, the profiler, classification
    ("context",),  # one run's inputs: config, pair, requests, store, identities
    ("backends",),  # where a trial runs: the engine or a real server
    ("search",),  # the Optuna study and the guard every trial runs under
    ("decide",),  # significance rules, re-measurement, the table contest, the profile record
    ("jobs",),  # tune, init, retune
    ("watch",),  # the live server held against its profile
    ("cli",),  # commands, text tables and report rendering
    ("__main__",),  # python -m autotune
    ("vllm_plugin",),  # runs inside vLLM's interpreter; top floor: no unit of the tool imports it
)
"""autotune/'s units, bottom floor first."""


def floor_of() -> dict[str, int]:
    """Unit name -> its floor index."""
    return {unit: i for i, units in enumerate(FLOORS) for unit in units}


def unit_of(module: str) -> str | None:
    """``autotune.cost.costmodel`` -> ``cost``; ``autotune.records`` -> ``records``; the package
    itself (``autotune``) and names outside it -> None."""
    parts = module.split(".")
    return parts[1] if parts[0] == "autotune" and len(parts) > 1 else None


@dataclass(frozen=True)
class Import:
    source: str  # dotted module
    target: str  # dotted module (or package) it imports
    line: int


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file for every .py under autotune/ (a package is its __init__)."""
    out: dict[str, Path] = {}
    for path in sorted((root / "autotune").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(files: dict[str, Path]) -> list[Import]:
    """Every ``import autotune...`` / ``from autotune... import`` edge, lazy and typing-only included."""
    known = set(files)
    out: list[Import] = []
    for module, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                named = [a.name for a in node.names if a.name.startswith("autotune")]
                out += [Import(module, name, node.lineno) for name in named]
            elif (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and (node.module or "").startswith("autotune")
            ):
                base = node.module or ""
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    out.append(Import(module, sub if sub in known else base, node.lineno))
    return out


def violations(files: dict[str, Path] | None = None) -> list[str]:
    """One line per import that reaches a unit on the same floor or above, or a unit not in FLOORS."""
    files = modules() if files is None else files
    floors = floor_of()
    bad = []
    for unit in sorted({u for m in files if (u := unit_of(m)) is not None} - set(floors)):
        bad.append(f"autotune.{unit}: not in tools/structure.py FLOORS")
    for edge in imports(files):
        src, dst = unit_of(edge.source), unit_of(edge.target)
        if src is None or dst is None or src == dst or src not in floors or dst not in floors:
            continue
        if floors[dst] >= floors[src]:
            bad.append(
                f"{edge.source} (floor {floors[src]}, {src}) imports {edge.target} "
                f"(floor {floors[dst]}, {dst}) at line {edge.line}"
            )
    return bad


def report(files: dict[str, Path] | None = None) -> str:
    """The floors, bottom first: each unit, its modules, and the units it imports."""
    files = modules() if files is None else files
    members: dict[str, list[str]] = defaultdict(list)
    for m in files:
        unit = unit_of(m)
        if unit is not None:
            members[unit].append(m.split(".", 2)[-1] if m.count(".") > 1 else "(module)")
    uses: dict[str, set[str]] = defaultdict(set)
    for edge in imports(files):
        src, dst = unit_of(edge.source), unit_of(edge.target)
        if src and dst and src != dst:
            uses[src].add(dst)
    lines = []
    for i, units in enumerate(FLOORS):
        for unit in units:
            mods = sorted(x for x in members.get(unit, []) if x != unit)
            kind = "package" if mods and mods != ["(module)"] else "module"
            names = ", ".join(m for m in mods if m != "(module)")
            lines.append(f"floor {i:2d}  {unit:<10} {kind:<8} {names}")
            if uses.get(unit):
                below = sorted(uses[unit], key=lambda u: floor_of()[u])
                lines.append(f"{'':22}uses: {', '.join(below)}")
    top = sorted(
        m for m in files if m.count(".") == 1 and (ROOT / m.replace(".", "/")).with_suffix(".py").exists()
    )
    lines.append(f"top-level modules ({len(top)}): {', '.join(top)}")
    return "\n".join(lines)


def main() -> int:
    print(report())
    bad = violations()
    for line in bad:
        print(f"floor violation: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
