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


def _prose(page: Path) -> list[tuple[int, str]]:
    """(line number, line) of a Markdown page outside its fenced code blocks."""
    out, fenced = [], False
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced:
            out.append((n, line))
    return out


def anchors(page: Path) -> set[str]:
    """The #fragments a Markdown page answers to on GitHub: its explicit ``<a id|name="...">`` and
    every heading's slug (lower case, punctuation but ``-`` and ``_`` dropped, spaces as ``-``, a
    repeated slug numbered ``-1``, ``-2``, ...).

    Example:
        >>> p = Path(__import__("tempfile").mkdtemp()) / "p.md"
        >>> _ = p.write_text('<a id="x"></a>\\n## The `knee` n*, [see](y.md)\\n## The knee n*, see\\n')
        >>> sorted(anchors(p))
        ['the-knee-n-see', 'the-knee-n-see-1', 'x']
    """
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in _prose(page):
        found.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", line))
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m is None:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))  # a link in a heading: its text
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_links_in_readme_and_docs_resolve() -> None:
    """Every relative link in README.md and docs/**/*.md reaches a file in the repository, and its
    #anchor (on a Markdown page, the same page's included) reaches a heading or an explicit anchor."""
    broken = []
    for page in _pages():
        for n, line in _prose(page):
            for target in LINK.findall(line):
                if re.match(r"[a-z][a-z0-9+.-]*:", target):
                    continue  # a URL (http:, mailto:)
                where = f"{page.relative_to(ROOT)}:{n}: {target}"
                path, _, fragment = unquote(target).partition("#")
                resolved = (page.parent / path).resolve() if path else page
                if not resolved.exists() or ROOT not in (resolved, *resolved.parents):
                    broken.append(f"{where} (no such file)")
                elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
                    broken.append(f"{where} (no such anchor in {resolved.relative_to(ROOT)})")
    assert not broken, "README/docs links that lead nowhere:\n" + "\n".join(broken)


def test_every_docs_page_is_linked_from_the_docs_index() -> None:
    """docs/README.md is the index: a page under docs/ it does not link is a page nobody finds."""
    index = DOCS / "README.md"
    linked = {
        (index.parent / unquote(t).partition("#")[0]).resolve()
        for _, line in _prose(index)
        for t in LINK.findall(line)
        if not re.match(r"[a-z][a-z0-9+.-]*:", t)
    }
    missing = [str(p.relative_to(ROOT)) for p in sorted(DOCS.rglob("*.md")) if p != index and p not in linked]
    assert not missing, "docs pages docs/README.md does not link:\n" + "\n".join(missing)


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
