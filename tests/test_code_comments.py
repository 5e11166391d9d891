"""Comments and docstrings state rules; the measurements behind them live in docs/decisions.md.

A comment or docstring in autotune/, engine/ or profiles/ says what the code does and one
sentence of why, and links ``docs/decisions.md#anchor`` for the evidence. It holds no date, no
run diary ("last session", "half an hour later", "profiles from before it"), no result file
name and no measured figure (a ratio such as ``1.3x``, a time, a rate or a percentage, an
interval such as ``0.80-1.91``): those go stale the moment the code or the host changes, and a
reader cannot tell a rule from an anecdote. The few numbers with units that are rules (a clock
tick, a target run time) are listed in ``ALLOWED`` with their reason.

What is read: every comment (``tokenize``) and every string statement (``ast``: docstrings of
modules, classes and functions, and the attribute docstrings under constants). Not read: doctest
examples (``>>>`` lines and the output under them) and ``inline literals`` in double backticks,
which show what the program prints rather than what a run measured. Nothing is imported. Every
``docs/decisions.md#anchor`` the code links names a section that page holds exactly once.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("autotune", "engine", "profiles")
RESULTS = ROOT / "benchmarks" / "results"

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
_YEAR = r"(?:19|20)\d\d"
_NUM = r"(?<![\w.])~?\d+(?:\.\d+)?(?:\s?[-–]\s?\d+(?:\.\d+)?)?"  # 12, 0.5, ~3, 29-31
_CONFIDENCE = r"\s(?:CI|interval|confidence|quantile|Student|bootstrap)"  # "95% CI": a level, a rule

PATTERNS: dict[str, tuple[re.Pattern[str], ...]] = {
    "date": (
        re.compile(rf"\b{_YEAR}-[01]\d-[0-3]\d\b"),
        re.compile(rf"\b{_MONTH}\s+(?:[0-3]?\d(?:st|nd|rd|th)?,?\s+)?{_YEAR}\b"),
        re.compile(rf"\b[0-3]?\d\s+{_MONTH}\s+{_YEAR}\b"),
    ),
    "run diary": (
        re.compile(r"\b(?:this|last|previous|earlier|latest|next|that) session\b", re.I),
        # "an earlier run in this process" is the program's own history (a cache), not a measurement's
        re.compile(r"\b(?:the|our|my|an) (?:earlier|previous|last|latest) run\b(?! in this process)", re.I),
        re.compile(r"\b(?:yesterday|today|tonight)\b", re.I),
        re.compile(
            r"\bas of (?:today|now|this (?:run|session|week|month)|the (?:last|latest) (?:run|session|commit|release))\b",
            re.I,
        ),
        re.compile(r"\bfrom before\b|\bold(?:er)? profiles?\b", re.I),
        re.compile(
            r"\b(?:seconds|minutes|hours|days|weeks|an hour|a day|a week) (?:later|ago|earlier)\b", re.I
        ),
        re.compile(r"\bMeasured(?: on\b| here\b|:)|\bmeasured (?:on|in) (?:vLLM|llama|SGLang|TGI|TensorRT)"),
        re.compile(r"\b(?:we|I) (?:measured|saw|found|ran|tried|observed)\b"),
    ),
    "result file": (re.compile(r"\bbenchmarks/results\b"),),
    "measured figure": (
        re.compile(rf"{_NUM}x\b"),  # a ratio: 1.3x, 10-20x
        re.compile(rf"{_NUM}\s?(?:tok/s|tokens/s|req/s|requests/s|[GMT]i?B/s|[GT]?FLOP/s)"),  # a rate
        re.compile(r"(?<![\w.])\d+\.\d+\s?[KMGT]i?B\b"),  # a memory size read off a run: 4.05 GiB
        re.compile(rf"{_NUM}\s?(?:ms|s|us|µs|min|minutes|seconds|hours)\b"),  # a time
        re.compile(rf"{_NUM}\s?%(?!{_CONFIDENCE})"),  # a share or a change
        re.compile(r"(?<![\w.])\d+\.\d+\s?[-–]\s?\d+\.\d+(?![\w.])"),  # an interval: 0.80-1.91
        re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:vs\.?|versus|->|→)\s?\d"),  # before/after: 383 vs 354
    ),
}


@dataclass(frozen=True)
class Allowance:
    """A number with a unit in ``path``'s comments that is a rule or a unit, not a measurement."""

    path: str
    text: str
    reason: str


ALLOWED: tuple[Allowance, ...] = (
    Allowance("autotune/device/hostnoise.py", "10 ms", "the kernel's clock tick, the unit /proc counts in"),
    Allowance("autotune/search/guard.py", "10 ms", "the kernel's clock tick, the unit /proc counts in"),
    Allowance("autotune/device/ceilings.py", "~12 ms", "the matmul size's target run time, a rule"),
    Allowance("autotune/device/ceilings.py", "~100 ms", "the matmul size's upper run time, a rule"),
    Allowance("autotune/device/hostnoise.py", "1%", "the resolution of 100 ticks per CPU-second, arithmetic"),
    Allowance("autotune/backends/vllm.py", "3x", "a later start's limit over the first start, a rule"),
    Allowance("autotune/cost/stackcost.py", "3%", "SERVE_MARGIN's meaning: the in-stack goal's margin"),
    Allowance("autotune/cost/stackcost.py", "84%", "the one-sided confidence of SERVE_Z = 1, a rule"),
    Allowance("autotune/decide/selection.py", "10%", "the knee rule's one-for-one trade, an illustration"),
    Allowance("engine/model.py", "7 -> 4", "the matmuls per layer fusing leaves, a count in the code"),
)


@dataclass(frozen=True)
class Hit:
    """A comment or docstring line at ``where:line`` holding ``match``, a ``kind`` of anecdote."""

    where: str
    line: int
    kind: str
    match: str

    def __str__(self) -> str:
        return f"{self.where}:{self.line}: {self.kind}: {self.match!r}"


def _comments(source: str) -> list[tuple[int, str]]:
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [(t.start[0], t.string) for t in tokens if t.type == tokenize.COMMENT]


def _prose(lines: list[str]) -> list[tuple[int, str]]:
    """The lines of a docstring that are prose: a doctest and the output under it are dropped."""
    out, in_example = [], False
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith(">>>"):
            in_example = True
        elif not stripped:
            in_example = False
        if not in_example:
            out.append((i, line))
    return out


def _blank_literals(text: str) -> str:
    """``text`` with each ``inline literal`` (one line or several) blanked, its line breaks kept."""
    return re.sub(r"``.*?``", lambda m: "``" + "\n" * m.group(0).count("\n") + "``", text, flags=re.S)


def _docstrings(source: str) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            if isinstance(node.value.value, str):
                lines = _blank_literals(node.value.value).splitlines()
                out += [(node.value.lineno + i, line) for i, line in _prose(lines)]
    return out


def texts(source: str) -> list[tuple[int, str]]:
    """Every comment and docstring line of ``source`` with its line number, inline literals blanked."""
    comments = [(n, _blank_literals(text)) for n, text in _comments(source)]
    return sorted(comments + _docstrings(source))


def _result_names(results: Path = RESULTS) -> re.Pattern[str] | None:
    # one folder per claim (benchmarks/results/<claim>/): the JSON and console files in any of them
    names = sorted({p.name for p in results.rglob("*") if p.is_file() and p.suffix in (".json", ".txt")})
    return re.compile(r"\b(?:" + "|".join(map(re.escape, names)) + r")\b") if names else None


RESULT_NAMES = _result_names()


def hits(source: str, where: str, allowed: tuple[Allowance, ...] = ALLOWED) -> list[Hit]:
    """The dates, run diaries, result files and measured figures in ``source``'s comments and docstrings."""
    patterns = dict(PATTERNS)
    if RESULT_NAMES is not None:
        patterns["result file"] = (*PATTERNS["result file"], RESULT_NAMES)
    ok = {a.text for a in allowed if a.path == where}
    out = []
    for n, text in texts(source):
        for kind, regexes in patterns.items():
            out += [Hit(where, n, kind, m.group(0)) for r in regexes for m in r.finditer(text)]
    return [h for h in out if h.match.strip() not in ok]


def _sources(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    paths = sorted(p for package in packages for p in (root / package).rglob("*.py"))
    return {str(p.relative_to(root)): p.read_text(encoding="utf-8") for p in paths}


def scan(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[Hit]:
    """Every hit in every .py file under ``packages``."""
    return [h for where, source in _sources(root, packages).items() for h in hits(source, where)]


SYNTHETIC = '''"""A module.

Picks K=3: it ran 1.3x faster than K=6 (95% CI 0.92-1.24) on 2026-12-03.

Example:
    >>> speedup()
    1.30x in 12 ms
"""

RATE = 2.0  # 125 tok/s at B=1 in the last session, 4.05 GiB held
WAIT_S = 300  # the 300 s default: see docs/decisions.md#wait
"""Profiles from before it lack the field (benchmarks/results/load_sweep/load_sweep.json)."""


def f():
    """Runs before the first trial; prints ``0.79x (1 run)``; keeps a 95% interval: ``a
    1.2x b``."""
    # a 3% margin, measured on vLLM-CPU: K=2 took 15.4 -> 13.7 ms, 29-31% CPU, Dec 2026
'''


def _kinds(found: list[Hit]) -> list[tuple[int, str, str]]:
    return [(h.line, h.kind, h.match) for h in found]


def test_detector_flags_each_kind_on_synthetic_source() -> None:
    found = _kinds(hits(SYNTHETIC, "synthetic.py", allowed=()))
    assert found == [
        (3, "date", "2026-12-03"),
        (3, "measured figure", "1.3x"),
        (3, "measured figure", "0.92-1.24"),
        (10, "run diary", "last session"),
        (10, "measured figure", "125 tok/s"),
        (10, "measured figure", "4.05 GiB"),
        (11, "measured figure", "300 s"),
        (12, "run diary", "from before"),
        (12, "result file", "benchmarks/results"),
        (12, "result file", "load_sweep.json"),
        (18, "date", "Dec 2026"),
        (18, "run diary", "measured on vLLM"),
        (18, "measured figure", "13.7 ms"),
        (18, "measured figure", "3%"),
        (18, "measured figure", "29-31%"),
        (18, "measured figure", "15.4 -> 1"),
    ]


def test_detector_skips_doctests_inline_literals_and_allowed_rules() -> None:
    allowed = (Allowance("synthetic.py", "300 s", "a default, a rule"),)
    lines = {h.line for h in hits(SYNTHETIC, "synthetic.py", allowed)}
    assert not lines & {11, 16, 17}  # the allowed default; the literals and the 95% level
    assert not lines & {6, 7}  # the doctest and its output
    assert len(hits(SYNTHETIC, "other.py", allowed)) == len(hits(SYNTHETIC, "other.py", allowed=()))


def test_detector_leaves_ordinary_prose_alone() -> None:
    prose = (
        '"""Stored before the first trial; the profile no longer holds; an earlier run in this process;\n'
        '`length` as of the last sync; K=2 over K=5; a 2x2 grid at 0x10."""\n'
    )
    assert hits(prose, "prose.py") == []


def test_every_allowance_is_used() -> None:
    sources = _sources()
    stale = [
        a
        for a in ALLOWED
        if a.path not in sources or a.text not in [h.match.strip() for h in hits(sources[a.path], a.path, ())]
    ]
    assert not stale, f"allowances that match nothing (remove them): {stale}"


def test_no_measurement_in_code_comments() -> None:
    found = scan()
    assert not found, (
        "comments and docstrings state the rule and link docs/decisions.md#anchor; move these "
        "dates, run diaries, result files and measured figures there:\n" + "\n".join(map(str, found))
    )


DECISIONS = ROOT / "docs" / "decisions.md"
DECISION_LINK = re.compile(r"docs/decisions\.md#([\w-]+)")
DECISION_ANCHOR = re.compile(r'<a id="([\w-]+)"></a>')


def test_every_decision_link_in_the_code_has_one_anchor() -> None:
    anchors = DECISION_ANCHOR.findall(DECISIONS.read_text(encoding="utf-8"))
    twice = sorted({a for a in anchors if anchors.count(a) > 1})
    assert not twice, f"docs/decisions.md holds these anchors more than once: {twice}"
    missing = [
        f"{where}:{n}: #{anchor}"
        for where, source in _sources().items()
        for n, line in enumerate(source.splitlines(), 1)
        for anchor in DECISION_LINK.findall(line)
        if anchor not in anchors
    ]
    assert not missing, "links to sections docs/decisions.md does not have:\n" + "\n".join(missing)
