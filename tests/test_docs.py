"""The design facts live in the repository: nothing cites documents outside it, and docs links resolve.

The architecture, metric definitions and serving-stack facts are in ``docs/``; code, tests and
benchmarks cite those pages. Two documents that once held them are not in the repository, so a
citation of either would send a newcomer nowhere.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SUFFIXES = (".py", ".sh", ".yaml", ".md")
SKIP_DIRS = {".venv", ".git", "__pycache__", ".pytest_cache", ".ruff_cache", "node_modules"}
OUTSIDE_DOCUMENTS = ("DESIGN" + ".md", "stack-schemas" + ".json")  # split so this file does not match itself
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _repo_files() -> list[Path]:
    out = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts):
            continue
        if path.is_file() and path.suffix in SUFFIXES:
            out.append(path)
    return out


def test_no_citation_of_documents_outside_the_repository() -> None:
    hits = []
    for path in _repo_files():
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            hits += [f"{path.relative_to(ROOT)}:{n}: {name}" for name in OUTSIDE_DOCUMENTS if name in line]
    assert not hits, "cite the docs/ page that holds the fact instead:\n" + "\n".join(hits)


def test_docs_pages_exist() -> None:
    for page in ("README.md", "architecture.md", "metrics.md", "backends.md"):
        assert (DOCS / page).is_file(), page
    for stack in ("vllm", "sglang", "trtllm", "tgi", "transformers", "llamacpp"):
        assert (DOCS / "stacks" / f"{stack}.md").is_file(), stack


def test_docs_links_to_repo_files_resolve() -> None:
    broken = []
    pages = sorted(DOCS.rglob("*.md"))
    assert pages
    for page in pages:
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for target in LINK.findall(line):
                if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                    continue  # a URL (http:, mailto:) or an anchor on the same page
                path = unquote(target.split("#", 1)[0])
                resolved = (page.parent / path).resolve()
                if not resolved.exists() or ROOT not in (resolved, *resolved.parents):
                    broken.append(f"{page.relative_to(ROOT)}:{n}: {target}")
    assert not broken, "docs links to missing files:\n" + "\n".join(broken)


CODE_NAME = re.compile(
    r"`((?:engine|autotune|profiles)(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)?)`"
)
FILE_NAME = re.compile(r"`((?:engine|autotune|profiles)/[\w/]+\.py): ([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)`")


def _resolve(dotted: str) -> bool:
    """Whether ``pkg.module.Name.attr`` (or ``pkg.module:Name``) names something in the code."""
    import importlib

    module_part, _, attr_part = dotted.partition(":")
    parts = module_part.split(".")
    attrs = attr_part.split(".") if attr_part else []
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in [*parts[cut:], *attrs]:
            if hasattr(obj, name):
                obj = getattr(obj, name)
            elif isinstance(obj, type) and name in getattr(obj, "__dataclass_fields__", {}):
                obj = None  # a dataclass field without a class-level default
            else:
                return False
        return True
    return False


def test_every_code_name_in_the_docs_resolves() -> None:
    """A dotted name in docs/ or README.md (``autotune.jobs.tune.run_tune``, ``engine/tree.py: DynamicTree``)
    names a module, class, function or attribute that exists: renames must update the docs."""
    stale = []
    for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            names = [m for m in CODE_NAME.findall(line) if not m.endswith(".py")]  # a file, not a name
            names += [f"{path[:-3].replace('/', '.')}:{name}" for path, name in FILE_NAME.findall(line)]
            stale += [f"{page.relative_to(ROOT)}:{n}: {name}" for name in names if not _resolve(name)]
    assert not stale, "names in the docs that the code no longer has:\n" + "\n".join(stale)
