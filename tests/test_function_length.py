"""No function in autotune/, engine/ or profiles/ runs over LIMIT lines without saying why.

A function's length is its span in the source, from the ``def`` line to its last line
(decorators excluded, docstring and comments included): what a reader has to hold. A long
function is allowed when its docstring has a line starting with ``Long because:`` that gives
the reason (a linear script of steps, a table of cases); anything else is split into
verb-named steps. Nothing is imported: the source is parsed, so the test runs without torch.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("autotune", "engine", "profiles")
LIMIT = 60
REASON = "Long because:"


@dataclass(frozen=True)
class LongFunction:
    """A function over ``LIMIT`` lines whose docstring gives no reason."""

    where: str
    name: str
    line: int
    length: int

    def __str__(self) -> str:
        return f"{self.where}:{self.line} {self.name} ({self.length} lines)"


def _has_reason(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    doc = ast.get_docstring(node) or ""
    return any(line.strip().startswith(REASON) for line in doc.splitlines())


def long_functions(source: str, where: str, limit: int = LIMIT) -> list[LongFunction]:
    """Every function or method in ``source`` longer than ``limit`` lines with no stated reason.

    Nested functions are checked on their own; the enclosing function's span includes them.
    """
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        if length > limit and not _has_reason(node):
            out.append(LongFunction(where, node.name, node.lineno, length))
    return sorted(out, key=lambda f: f.line)


def scan(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[LongFunction]:
    """The long functions without a reason in every .py file under ``packages``."""
    out: list[LongFunction] = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            out += long_functions(path.read_text(), str(path.relative_to(root)))
    return out


def _function(name: str, body_lines: int, doc: str = "") -> str:
    docstring = f'    """{doc}"""\n' if doc else ""
    return f"def {name}():\n{docstring}" + "    x = 1\n" * body_lines


def test_detector_flags_a_long_function_and_its_length() -> None:
    src = _function("short", 30) + _function("at_limit", LIMIT - 1) + _function("long", LIMIT)
    found = long_functions(src, "synthetic.py")
    assert [(f.name, f.length) for f in found] == [("long", LIMIT + 1)]
    assert str(found[0]) == f"synthetic.py:{31 + LIMIT + 1} long ({LIMIT + 1} lines)"


def test_detector_accepts_a_stated_reason_only_at_the_start_of_a_docstring_line() -> None:
    reasoned = _function("reasoned", 70, doc="Run the steps.\n\n    Long because: a linear script.\n    ")
    mentioned = _function("mentioned", 70, doc="Not Long because: it is not at the start.")
    commented = "def commented():\n    # Long because: a comment is not the docstring\n" + "    x = 1\n" * 70
    found = long_functions(reasoned + mentioned + commented, "synthetic.py")
    assert [f.name for f in found] == ["mentioned", "commented"]


def test_detector_sees_methods_and_nested_functions() -> None:
    method = "class C:\n    def m(self):\n" + "        x = 1\n" * 61
    nested = "def outer():\n    def inner():\n" + "        x = 1\n" * 61
    found = long_functions(method + nested, "synthetic.py")
    assert [f.name for f in found] == ["m", "outer", "inner"]


def test_no_long_function_without_a_reason() -> None:
    found = scan()
    assert not found, (
        f"functions over {LIMIT} lines without a '{REASON}' docstring line "
        "(split them into verb-named steps, or state why they stay long):\n" + "\n".join(map(str, found))
    )
