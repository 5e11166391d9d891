"""Every ``Example:`` in the packages' docstrings runs and prints what it shows (doctest).

Examples are documentation a newcomer copies; one whose output drifted from the code (a key list
that grew, a quoting rule that changed) teaches the wrong thing, and one broke unnoticed before
this test ran them. Examples marked ``# doctest: +SKIP`` need the demo pair or a server.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

PACKAGES = ("engine", "autotune", "profiles")


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        pkg = importlib.import_module(package)
        names.append(package)
        names += [m.name for m in pkgutil.walk_packages(pkg.__path__, prefix=f"{package}.")]
    return sorted(names)


def test_the_walk_finds_modules_with_examples() -> None:
    finder = doctest.DocTestFinder()
    with_examples = [
        n for n in _modules() if any(t.examples for t in finder.find(importlib.import_module(n)))
    ]
    assert len(with_examples) >= 10 and {
        "autotune.device.hostnoise",
        "engine.sampling",
        "autotune.jobs.init",
    } <= set(with_examples)


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples_hold(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, (
        f"{name}: {result.failed} of {result.attempted} doctest examples failed (see output)"
    )
