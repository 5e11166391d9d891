"""docs/tune-yaml.md from the typed config: every tune.yaml key, its default and its effect.

``python -m tools.tune_yaml_doc`` writes the page; ``--check`` exits 1 when the committed page
differs from what the code says (tests/test_docs_tune_yaml.py runs the same comparison). The
keys are the fields of the section dataclasses of :mod:`autotune.config.sections` (a field's name
is its key; a field whose type has a ``read`` is a nested section), in the order the bundled
tune.yaml lists them, then any it leaves out. A key's default is what ``autotune.config.parse``
gives when the key is absent, read from a config that sets only the required keys; a default
that follows another key is named in :data:`DERIVED`, and a probe with those other keys changed
checks that list. Its effect is the bundled tune.yaml's comment on the key, else the comment on
the dataclass field; a key with neither stops the generator, as does a tune.yaml key that no
dataclass declares.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import io
import re
import sys
import tokenize
import typing
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "tune-yaml.md"
TUNE_YAML = ROOT / "tune.yaml"
SECTIONS = ROOT / "autotune" / "config" / "sections.py"
BASE = Path("/tune-yaml-folder")  # a stand-in for the config's folder, cut from resolved paths

MINIMAL: dict[str, Any] = {"models": {"target": "demo", "draft": "demo"}, "workload": {"prompts": "demo"}}
"""The smallest config parse accepts (the default drafter needs a draft model)."""

PROBE: dict[str, Any] = {
    "models": {"target": "demo", "draft": "demo"},
    "workload": {"prompts": "demo", "concurrency": [2, 32]},
    "search": {"gamma": {"low": 0, "high": 3}},
    "budget": {"repeats": 9},
}
"""MINIMAL with the keys that other defaults follow changed: a default that moves is derived."""

DERIVED = {
    "search.max_batch_size": "the largest `workload.concurrency`",
    "profile.gamma_max": "`search.gamma`'s high end (at least 1)",
    "budget.max_repeats": "the larger of 6 and `budget.repeats`; 1 when `budget.repeats` is 1",
}
"""Defaults that follow another key, in words."""


@dataclasses.dataclass
class Key:
    """One tune.yaml key as the page lists it."""

    path: str
    default: str
    bundled: str | None  # its value in the bundled tune.yaml, None where the file leaves it out
    effect: str


# ---- the bundled tune.yaml: key paths, their comments and the section comments ----------------


def _split_comment(text: str) -> tuple[str, str]:
    """``value  # comment`` -> (value, comment), a ``#`` inside quotes kept in the value."""
    quote = ""
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i].strip(), text[i + 1 :].strip()
    return text.strip(), ""


def yaml_comments(text: str) -> tuple[list[str], dict[str, str]]:
    """The file's opening comment lines, and key path -> its comment (continuation lines joined)."""
    intro: list[str] = []
    comments: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    last: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            if last is None:
                intro.append(stripped.lstrip("#").strip())
            else:
                more = stripped.lstrip("#").strip()
                joint = "; " if re.match(r"[a-z_]+: ", more) and comments[last] else " "
                comments[last] = f"{comments[last]}{joint}{more}".strip()
            continue
        m = re.match(r"(\s*)([A-Za-z_]\w*):(.*)$", line)
        if m is None:
            raise ValueError(f"tune.yaml: cannot read the line {line!r}")
        indent, name, rest = len(m.group(1)), m.group(2), m.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, name))
        last = ".".join(n for _, n in stack)
        comments[last] = _split_comment(rest)[1]
    return intro, comments


# ---- sections.py: the field comments and the section docstrings --------------------------------


def field_comments(source: str) -> dict[tuple[str, str], str]:
    """(class, field) -> the comment on the field's lines, else the comment lines just above it."""
    by_line: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            by_line[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    out: dict[tuple[str, str], str] = {}
    for cls in ast.walk(ast.parse(source)):
        if not isinstance(cls, ast.ClassDef):
            continue
        for node in cls.body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            end = node.end_lineno or node.lineno
            trailing = [by_line[n] for n in range(node.lineno, end + 1) if n in by_line]
            above: list[str] = []
            n = node.lineno - 1
            while n in by_line and lines[n - 1].strip().startswith("#"):
                above.insert(0, by_line[n])
                n -= 1
            text = " ".join(trailing or above)
            if text:
                out[(cls.name, node.target.id)] = text
    return out


def choices_of(source: str, namespace: Mapping[str, Any]) -> dict[tuple[str, str], tuple[str, ...]]:
    """(class, key) -> the values its ``read`` accepts, where it reads the key with ``s.choice`` or
    ``s.choices`` (the third argument, evaluated in the sections module)."""
    out: dict[tuple[str, str], tuple[str, ...]] = {}
    for cls in ast.walk(ast.parse(source)):
        if not isinstance(cls, ast.ClassDef):
            continue
        for call in ast.walk(cls):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr in ("choice", "choices")
                and len(call.args) == 3
                and isinstance(call.args[0], ast.Constant)
            ):
                values = eval(ast.unparse(call.args[2]), dict(namespace))  # the module's own constants
                out[(cls.name, str(call.args[0].value))] = tuple(values)
    return out


def _python_words(text: str, namespace: Mapping[str, Any]) -> str:
    """A field comment in tune.yaml's words: None -> null, a module constant's name -> its values."""

    def values(m: re.Match[str]) -> str:
        value = namespace.get(m.group(0))
        if isinstance(value, tuple) and value and all(isinstance(v, str) for v in value):
            return ", ".join(value)
        return m.group(0)

    return re.sub(
        r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b|\b[A-Z]{4,}\b", values, re.sub(r"\bNone\b", "null", text)
    )


def _doc(cls: type) -> str:
    """A section's docstring, its first paragraph on one line, the leading ````key````: dropped,
    double backticks as Markdown's single ones, the first letter capital."""
    first = (cls.__doc__ or "").strip().split("\n\n")[0]
    text = re.sub(r"^``[\w.]+``:\s*", "", " ".join(first.split())).replace("``", "`")
    return text[:1].upper() + text[1:]


# ---- the typed config: sections, keys, defaults ------------------------------------------------


def _section_type(hint: Any) -> type | None:
    """The section dataclass a field holds (``X`` or ``X | None`` where X has a ``read``), else None."""
    for t in (hint, *typing.get_args(hint)):
        if isinstance(t, type) and dataclasses.is_dataclass(t) and hasattr(t, "read"):
            return t
    return None


def walk(cls: type, prefix: str = "") -> Iterator[tuple[str, type, dataclasses.Field[Any] | None]]:
    """Every section and key under ``cls``: (path, owning class, field); a section's own row has
    field None and comes before its keys."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in ("source", "raw") and prefix == "":
            continue  # TuneConfig's record of where it was read from, not keys
        path = f"{prefix}{f.name}"
        sub = _section_type(hints[f.name])
        if sub is not None:
            yield path, sub, None
            yield from walk(sub, f"{path}.")
        else:
            yield path, cls, f


def _get(obj: Any, path: str) -> Any:
    for name in path.split("."):
        obj = getattr(obj, name) if obj is not None else None
    return obj


def render_value(value: Any, hint: Any = None) -> str:
    """A config value as tune.yaml would write it, paths relative to the config's folder (``hint``:
    the field's type, which tells a mapping stored as pairs from a list)."""
    from autotune.config.reader import Range
    from autotune.knobs import tree_name

    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Range):
        return f"{{low: {value.low!r}, high: {value.high!r}}}"
    if isinstance(value, Path):
        return _path(str(value))
    if isinstance(value, Mapping) or hint == tuple[tuple[str, str], ...]:
        return "{" + ", ".join(f"{k}: {render_value(v)}" for k, v in dict(value).items()) + "}"
    if isinstance(value, (tuple, list)):
        if value and all(isinstance(v, tuple) and all(isinstance(k, int) for k in v) for v in value):
            return "[" + ", ".join(tree_name(v) for v in value) + "]"  # tree shapes
        return "[" + ", ".join(render_value(v) for v in value) + "]"
    if isinstance(value, str):
        return _path(value)
    return repr(value)


def _path(text: str) -> str:
    """A resolved path (or SQLite URL) as the config would write it: relative to its folder, ~ for home."""
    if text.startswith("sqlite:///"):
        return "sqlite:///" + _path(text[len("sqlite:///") :])
    if text.startswith(f"{BASE}/"):
        return text[len(f"{BASE}/") :]
    home = str(Path.home())
    return "~" + text[len(home) :] if text.startswith(f"{home}/") else text


def defaults() -> dict[str, str]:
    """Key path -> its default as the page writes it (``required`` for keys without one)."""
    from autotune.config import parse

    cfg, probe = parse(MINIMAL, BASE), parse(PROBE, BASE)
    out: dict[str, str] = {}
    moved = []
    for path, cls, f in walk(type(cfg)):
        if f is None:
            continue
        hint = typing.get_type_hints(cls)[f.name]
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            out[path] = "required"
        elif _get_raw(MINIMAL, path) is not None or _get(cfg, path.rsplit(".", 1)[0]) is None:
            # set by MINIMAL, or inside a section the default leaves out: the field's own default
            factory = typing.cast("Callable[[], Any]", f.default_factory)
            value = f.default if f.default is not dataclasses.MISSING else factory()
            out[path] = render_value(value, hint)
        else:
            out[path] = render_value(_get(cfg, path), hint)
            if _get(cfg, path) != _get(probe, path) and _get_raw(PROBE, path) is None:
                moved.append(path)
    if sorted(moved) != sorted(DERIVED):
        raise SystemExit(
            f"tools/tune_yaml_doc.py: the defaults that follow other keys are {sorted(moved)}, "
            f"DERIVED names {sorted(DERIVED)}: update DERIVED"
        )
    for path, words in DERIVED.items():
        out[path] = f"{out[path]} ({words})"
    return out


def _get_raw(raw: Mapping[str, Any], path: str) -> Any:
    node: Any = raw
    for name in path.split("."):
        node = node.get(name) if isinstance(node, Mapping) else None
    return node


# ---- the page ------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _section_words(doc: str, comment: str) -> str:
    """A section's docstring, then tune.yaml's comment on it where that says something more."""

    def words(text: str) -> set[str]:
        return set(re.findall(r"[a-z0-9]+", text.lower()))

    if not comment or len(words(comment) - words(doc)) <= len(words(comment)) // 4:
        return doc  # the docstring says it already
    comment = comment[:1].upper() + comment[1:]
    return f"{doc} {comment}" + ("" if comment.endswith((".", ")")) else ".")


def _code(value: str) -> str:
    return f"`{value}`" if value not in ("required", "") and not value.startswith("`") else value


def sections() -> list[tuple[str, str, list[Key]]]:
    """(section path, its description, its keys in tune.yaml order) for every section."""
    from autotune.config import TuneConfig

    text = TUNE_YAML.read_text(encoding="utf-8")
    _, comments = yaml_comments(text)
    bundled = yaml.safe_load(text)
    import autotune.config.sections as module

    source = SECTIONS.read_text(encoding="utf-8")
    namespace = vars(module)
    fields = field_comments(source)
    accepted = choices_of(source, namespace)
    default = defaults()
    declared = {path for path, _, _ in walk(TuneConfig)}
    unknown = sorted(set(comments) - declared)
    if unknown:
        raise SystemExit(f"tools/tune_yaml_doc.py: tune.yaml keys no dataclass declares: {unknown}")
    order = {path: i for i, path in enumerate(comments)}
    out: list[tuple[str, str, list[Key]]] = []
    keys_of: dict[str, list[Key]] = {}
    silent: list[str] = []
    for path, cls, f in walk(TuneConfig):
        if f is None:
            keys_of[path] = []
            out.append((path, _section_words(_doc(cls), comments.get(path, "")), keys_of[path]))
            continue
        effect = comments.get(path) or _python_words(fields.get((cls.__name__, f.name), ""), namespace)
        if not effect:
            silent.append(path)
        if (cls.__name__, f.name) in accepted:
            effect += " (one of: " + ", ".join(f"`{v}`" for v in accepted[(cls.__name__, f.name)]) + ")"
        raw = _get_raw(bundled, path)
        shown = None if path not in comments else render_value(raw)
        keys_of[path.rsplit(".", 1)[0]].append(Key(path, default[path], shown, effect))
    if silent:
        raise SystemExit(
            f"tools/tune_yaml_doc.py: no comment in tune.yaml or on the field: {', '.join(silent)}"
        )
    for _, _, keys in out:
        keys.sort(key=lambda k: order.get(k.path, len(order)))
    return out


def render() -> str:
    """The whole page."""
    intro, _ = yaml_comments(TUNE_YAML.read_text(encoding="utf-8"))
    lines = [
        "# tune.yaml: every key",
        "",
        "<!-- generated by `python -m tools.tune_yaml_doc` from autotune/config/sections.py and tune.yaml;"
        " edit those, then rerun it (tests/test_docs_tune_yaml.py compares) -->",
        "",
        "The bundled [tune.yaml](../tune.yaml) opens with:",
        "",
        "> " + " ".join(intro),
        "",
        "*default* is what a key is when tune.yaml leaves it out; *tune.yaml* is the value the bundled",
        "file sets (blank where it leaves the key out). Relative paths resolve against the config's",
        "folder. A wrong value stops `autotune tune` with one line naming the key, before anything runs.",
        "",
    ]
    for path, words, keys in sections():
        lines += [f"## `{path}`", "", words, ""]
        if not keys:
            continue
        lines += ["| key | default | tune.yaml | effect |", "|---|---|---|---|"]
        for k in keys:
            bundled = "" if k.bundled is None else _code(k.bundled)
            default = k.default
            head, sep, words_ = default.partition(" (")
            shown = _code(head) + (f" ({words_}" if sep else "")
            lines.append(f"| `{k.path}` | {_cell(shown)} | {_cell(bundled)} | {_cell(k.effect)} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/tune-yaml.md differs")
    args = parser.parse_args(argv)
    page = render()
    if args.check:
        same = PAGE.is_file() and PAGE.read_text(encoding="utf-8") == page
        if not same:
            print(f"{PAGE.relative_to(ROOT)} is out of date: python -m tools.tune_yaml_doc", file=sys.stderr)
        return 0 if same else 1
    PAGE.write_text(page, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
