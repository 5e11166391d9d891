"""The length rule of tests/test_function_length.py over benchmarks/: no new function runs past its
limit without a ``Long because:`` line. The long functions not split yet are listed in NOT_SPLIT_YET;
a split takes its entry out, and nothing joins the list."""

from __future__ import annotations

from tests.test_function_length import LIMIT, REASON, scan

NOT_SPLIT_YET: set[tuple[str, str]] = set()  # empty: every long benchmark function is split


def test_no_new_long_function_in_the_benchmarks() -> None:
    new = [f for f in scan(packages=("benchmarks",)) if (f.where, f.name) not in NOT_SPLIT_YET]
    assert not new, (
        f"benchmark functions over {LIMIT} lines without a '{REASON}' docstring line "
        "(split them into verb-named steps):\n" + "\n".join(map(str, new))
    )


def test_every_function_not_split_yet_is_still_long() -> None:
    """A split function leaves the list with its split, so it cannot grow back unnoticed."""
    long = {(f.where, f.name) for f in scan(packages=("benchmarks",))}
    assert not NOT_SPLIT_YET - long, (
        f"now under {LIMIT} lines, take them out of NOT_SPLIT_YET: {sorted(NOT_SPLIT_YET - long)}"
    )
