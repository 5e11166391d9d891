"""``autotune init``: a commented tune.yaml for the user's models, made from the bundled one.

The bundled ``tune.yaml`` is the one place the keys are documented: ``init`` copies its text,
comments included, and replaces only the values of models.target, models.draft and
workload.prompts (absolute paths, or ``demo`` for the bundled demo pair and prompts), so the
written file works from any folder, and (unless ``--sweep bundled``) the load sweep:
workload.concurrency, workload.num_requests and search.max_batch_size, sized on this host by
:func:`autotune.device.sizing.size_sweep` (one request up to where the target's decode throughput stops growing). In a
source checkout (or an editable install) the bundled file is the repository's ``tune.yaml``; a
wheel installs the same file as ``<prefix>/share/spec-autotune/tune.yaml``.
"""

from __future__ import annotations

import json
import re
import sysconfig
from collections.abc import Callable
from pathlib import Path

import yaml

from autotune.config import DEMO, parse
from autotune.device.sizing import Sweep
from autotune.errors import ConfigError
from engine.demo import DEMO_TARGET

REPO_TUNE_YAML = Path(__file__).resolve().parents[2] / "tune.yaml"  # the checkout root
SHARE = Path("share") / "spec-autotune" / "tune.yaml"
FIELDS = (
    ("models", "target"),
    ("models", "draft"),
    ("workload", "prompts"),
    ("workload", "concurrency"),
    ("workload", "num_requests"),
    ("search", "max_batch_size"),
    ("models", "device"),
    ("models", "dtype"),
    ("models", "eagle3"),
    ("search", "drafter"),
    ("backend", "name"),
)
INIT_REQUESTS = 8
"""workload.num_requests ``autotune init`` writes: the floor of every level's requests (a level of
concurrency c runs max(8, min_batches x c))."""
PATH_KEYS = frozenset(
    {"target", "draft", "prompts", "eagle3"}
)  # written as YAML scalars; the others as YAML text


def bundled_tune_yaml() -> str:
    """The text of the bundled tune.yaml (the checkout's, else the one the wheel installed)."""
    for path in (REPO_TUNE_YAML, Path(sysconfig.get_path("data")) / SHARE):
        if path.is_file():
            return path.read_text()
    raise ConfigError(
        f"the bundled tune.yaml is not installed (looked for {REPO_TUNE_YAML} and "
        f"{Path(sysconfig.get_path('data')) / SHARE}); reinstall spec-autotune"
    )


def yaml_scalar(value: str) -> str:
    """``value`` as a YAML scalar: bare when YAML reads it back unchanged, else double-quoted.

    Example:
        >>> yaml_scalar("/models/qwen3"), yaml_scalar("/my models #1"), yaml_scalar("on")
        ('/models/qwen3', '"/my models #1"', '"on"')
    """
    try:
        if yaml.safe_load(f"k: {value}") == {"k": value}:
            return value
    except yaml.YAMLError:
        pass
    return json.dumps(value)  # a JSON string is a YAML double-quoted scalar


def render(template: str, values: dict[str, str]) -> str:
    """``template`` with the values of ``target``, ``draft``, ``prompts`` (strings, written as YAML
    scalars) and ``concurrency``, ``num_requests``, ``max_batch_size`` (YAML text as given) replaced,
    comments kept.

    Each key must appear exactly once in its section as ``  key: value  # comment``; the comment
    stays in its column when the new value fits.

    Example:
        >>> text = "models:\\n  target: a/b   # folder\\n  draft: c\\nworkload:\\n  prompts: p.jsonl\\n"
        >>> print(render(text, {"target": "demo", "draft": "/d", "prompts": "demo"}), end="")
        models:
          target: demo  # folder
          draft: /d
        workload:
          prompts: demo
    """
    lines = template.splitlines(keepends=True)
    for section, key in FIELDS:
        if key not in values:
            continue
        hits = [
            i
            for i, line in enumerate(lines)
            if re.match(rf"  {key}:\s", line) and _section_of(lines, i) == section
        ]
        if len(hits) != 1:
            raise ConfigError(f"bundled tune.yaml: expected one {section}.{key} line (found {len(hits)})")
        i = hits[0]
        m = re.match(  # \s would eat the newline
            rf"(  {key}:[ \t]+)(\[[^\]#]*\]|\S+)([ \t]*)(#.*)?(\r?\n)?$", lines[i]
        )
        if m is None:
            raise ConfigError(f"bundled tune.yaml: cannot read the {section}.{key} line")
        value = yaml_scalar(values[key]) if key in PATH_KEYS else values[key]
        head = m.group(1)[: len(key) + 4] + value
        comment = m.group(4)
        if comment:
            column = len(m.group(1)) + len(m.group(2)) + len(m.group(3))
            head = head.ljust(column) if len(head) + 2 <= column else head + "  "
            head += comment
        lines[i] = head + (m.group(5) or "")
    return "".join(lines)


def _section_of(lines: list[str], index: int) -> str | None:
    """The top-level key whose block holds ``lines[index]``."""
    for line in reversed(lines[:index]):
        m = re.match(r"([A-Za-z_]\w*):", line)
        if m:
            return m.group(1)
    return None


def write_tune_yaml(
    output: Path,
    target: Path | None = None,
    draft: Path | None = None,
    prompts: Path | None = None,
    force: bool = False,
    sweep: Callable[[Path], Sweep] | None = None,
    eagle3: Path | None = None,
    dtype: str = "auto",
    device: str = "auto",
    backend: str = "engine",
) -> Path:
    """Write a tune.yaml for ``target``/``draft``/``prompts`` (each ``None``: the bundled demo one);
    with ``sweep`` (e.g. :func:`autotune.device.sizing.size_sweep`, called with the checked target
    folder) its load levels replace the bundled ones.

    The models and the prompts are checked first (config.json readable by the engine, one
    vocabulary, a valid workload), then the file is written atomically; an existing one is
    kept unless ``force``.

    Example:
        >>> write_tune_yaml(Path("my/tune.yaml"))  # doctest: +SKIP
        PosixPath('/abs/my/tune.yaml')
    """
    output = _check_output(output, force)
    if (target is None) != (draft is None and eagle3 is None):
        given, other = ("--target", "--draft or --eagle3") if target is not None else ("--draft", "--target")
        raise ConfigError(f"{other}: required with {given} (the demo pair's vocabulary is not your model's)")
    values = {
        "target": DEMO,
        "draft": DEMO,
        "prompts": DEMO,
        "dtype": dtype,
        "device": device,
        "name": backend,
    }
    folder = DEMO_TARGET
    if target is not None and draft is not None:
        folder, checked_draft = _check_pair(target, draft)
        values["target"], values["draft"] = str(folder), str(checked_draft)
    if eagle3 is not None:
        folder = _add_eagle3(values, eagle3, target, draft) or folder
    if prompts is not None:
        values["prompts"] = str(_check_prompts(prompts))
    if sweep is not None:
        levels = sweep(folder).levels
        values.update(
            concurrency=f"[{', '.join(map(str, levels))}]",
            # requests per level scale with it (workload.min_batches x concurrency above this floor), so
            # a level of one request does not run as many as the top level's batches
            num_requests=str(INIT_REQUESTS),
            max_batch_size=f"[{levels[-1]}]",
        )
    text = _render_values(values)
    parse(yaml.safe_load(text), output.parent, output)  # the file we write must load
    tmp = output.with_name(f".{output.name}.tmp")
    tmp.write_text(text)
    tmp.replace(output)
    return output


def _render_values(values: dict[str, str]) -> str:
    """The bundled tune.yaml with ``values`` (:func:`render`); a ``draft`` of ``"null"`` (a head without
    a draft model) is written as the YAML null, not as a folder name."""
    if values.get("draft") != "null":
        return render(bundled_tune_yaml(), values)
    text = render(bundled_tune_yaml(), {k: v for k, v in values.items() if k != "draft"})
    return re.sub(r"^(  draft:[ \t]+)demo", r"\1null", text, count=1, flags=re.M)


def _check_output(output: Path, force: bool) -> Path:
    """The absolute path to write: its folder exists, and an existing file is replaced only with ``force``."""
    output = Path(output).expanduser().absolute()
    if output.exists() and not force:
        raise ConfigError(f"{output}: already exists (pass --force to overwrite it)")
    if not output.parent.is_dir():
        raise ConfigError(f"{output.parent}: folder not found (create it first)")
    return output


def _add_eagle3(values: dict[str, str], eagle3: Path, target: Path | None, draft: Path | None) -> Path | None:
    """Write the EAGLE-3 head into ``values``: with a draft model both are searched, else the head alone.
    Returns the target folder the sweep times (None without ``target``: the demo's)."""
    head = Path(eagle3).expanduser().resolve()
    if not (head / "config.json").is_file():
        raise ConfigError(f"--eagle3: {head} is not an EAGLE-3 head folder (no config.json)")
    values["eagle3"] = str(head)
    if target is None:
        return None
    folder = Path(target).expanduser().resolve()
    if draft is None:
        values.update(target=str(folder), draft="null", drafter="[eagle3]")
    else:
        values["drafter"] = "[model, eagle3]"
    return folder


def _check_pair(target: Path, draft: Path) -> tuple[Path, Path]:
    from engine.config import ModelConfig
    from engine.errors import EngineInputError

    folders = []
    for flag, folder in (("--target", target), ("--draft", draft)):
        folder = Path(folder).expanduser().resolve()
        if not folder.is_dir():
            raise ConfigError(f"{flag}: {folder} is not a model folder")
        folders.append((folder, ModelConfig.from_folder(folder)))
    (tgt, tcfg), (drf, dcfg) = folders
    if not (tgt / "tokenizer.json").is_file():
        raise EngineInputError(
            f"{tgt}: no tokenizer.json (the tuner tokenizes the prompts with the target's)"
        )
    if tcfg.vocab_size != dcfg.vocab_size:
        raise EngineInputError(
            f"{drf}: draft vocab_size {dcfg.vocab_size} != target vocab_size {tcfg.vocab_size}"
        )
    return tgt, drf


def _check_prompts(prompts: Path) -> Path:
    from engine.workload import load_workload

    path = Path(prompts).expanduser().resolve()
    load_workload(path)
    return path
