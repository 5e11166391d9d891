"""Plain-text columns for people (``--json`` is for machines)."""

from __future__ import annotations

from collections.abc import Sequence


def fmt(value: object, digits: int = 3) -> str:
    """Numbers to short strings: 3 significant digits, None as '-'."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.{digits}g}"
        return (
            f"{value:.{max(0, digits - len(str(int(abs(value)))))}f}" if abs(value) < 1e3 else f"{value:.0f}"
        )
    if isinstance(value, list):
        return "[" + ", ".join(fmt(v, 2) for v in value) + "]"
    return str(value)


def columns(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces, with a rule under the header."""
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in cells)])
