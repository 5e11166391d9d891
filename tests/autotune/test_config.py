"""tune.yaml validation: the bundled file parses; every bad key is named first in its ConfigError."""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path

import pytest
import yaml

from autotune.config import EXPORT_FORMATS, Range, load_config, parse
from autotune.errors import ConfigError
from engine.demo import DEMO_DRAFT, DEMO_PROMPTS, DEMO_TARGET

REPO = Path(__file__).resolve().parents[2]
BUNDLED = REPO / "tune.yaml"


def _base_raw(root: Path) -> dict:
    """A minimal valid tune.yaml mapping whose paths exist under ``root`` (relative to it)."""
    for d in ("target", "draft"):
        (root / d).mkdir(exist_ok=True)
    (root / "prompts.jsonl").write_text('{"prompt": "x"}\n')
    return {
        "models": {"target": "target", "draft": "draft"},
        "workload": {"prompts": "prompts.jsonl"},
    }


def _set(raw: dict, dotted: str, value: object) -> dict:
    out = copy.deepcopy(raw)
    *parents, last = dotted.split(".")
    node = out
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return out


def _del(raw: dict, dotted: str) -> dict:
    out = copy.deepcopy(raw)
    *parents, last = dotted.split(".")
    node = out
    for key in parents:
        node = node[key]
    del node[last]
    return out


# ------------------------------------------------------------------------------------------
# the bundled tune.yaml


def test_a_copy_of_the_bundled_tune_yaml_works_from_any_folder(tmp_path, monkeypatch) -> None:
    """The bundled file names the demo pair and prompts with `demo`, not paths relative to the repo."""
    copied = tmp_path / "elsewhere" / "tune.yaml"
    copied.parent.mkdir()
    shutil.copy(BUNDLED, copied)
    monkeypatch.chdir(tmp_path)

    cfg = load_config(copied)

    assert (cfg.models.target, cfg.models.draft, cfg.workload.prompts) == (
        DEMO_TARGET,
        DEMO_DRAFT,
        DEMO_PROMPTS,
    )
    assert cfg.storage.url == f"sqlite:///{copied.parent.resolve() / 'autotune.db'}"


def test_bundled_tune_yaml_parses_with_documented_values(tmp_path, tiny_pair_dirs, tiny_prompts) -> None:
    target, draft = tiny_pair_dirs
    text = BUNDLED.read_text()
    for key, new in (("target", target), ("draft", draft), ("prompts", tiny_prompts)):
        text, n = re.subn(rf"^(  {key}:) demo( +#)", rf"\1 {new}\2", text, flags=re.M)
        assert n == 1, f"bundled tune.yaml no longer names the demo {key} with `demo`"
    path = tmp_path / "tune.yaml"
    path.write_text(text)

    cfg = load_config(path)

    assert (cfg.models.target, cfg.models.draft, cfg.workload.prompts) == (target, draft, tiny_prompts)
    assert (cfg.models.device, cfg.models.dtype) == ("auto", "auto")
    assert (
        cfg.workload.max_new_tokens,
        cfg.workload.temperature,
        cfg.workload.top_k,
        cfg.workload.top_p,
    ) == (64, 0.0, 0, 1.0)
    assert cfg.workload.concurrency == (1, 2, 4, 8, 16) and cfg.workload.rate is None
    assert cfg.batch_sizes == (1, 2, 4, 8, 16)
    assert cfg.workload.num_requests == 16 and cfg.workload.truncate_prompts is False
    assert cfg.workload.min_batches == 3  # each level's slots refill: 24 requests at 8, 48 at 16
    assert [cfg.workload.requests_at(c) for c in cfg.workload.concurrency] == [16, 16, 16, 24, 48]
    assert cfg.search.drafter == ("model",)
    assert cfg.search.gamma == Range(0, 8) and not cfg.search.gamma.fixed
    assert cfg.search.confidence_threshold == Range(0.0, 0.5)
    assert cfg.search.gamma_schedule == ("constant", "heuristic")
    assert cfg.search.max_batch_size == (16,)
    assert cfg.search.gamma_cap == "auto" and (cfg.search.ngram_min, cfg.search.ngram_max) == (2, 4)
    assert cfg.objectives.latency == "tpot_ms_p95" and cfg.objectives.slo == {}
    assert cfg.objectives.choose == "throughput" and not cfg.objectives.knee
    assert (
        cfg.budget.n_trials,
        cfg.budget.timeout_s,
        cfg.budget.seed,
        cfg.budget.remeasure_top,
        cfg.budget.repeats,
        cfg.budget.max_repeats,
    ) == (14, None, 0, 2, 3, 6)
    assert cfg.budget.minutes == 20 and cfg.budget.trial_timeout_s == 300
    assert cfg.backend.vllm.tensor_parallel_size == 1 and cfg.backend.vllm.max_model_len is None
    assert cfg.backend.vllm.args == () and cfg.backend.vllm.env == ()
    assert cfg.storage.url == f"sqlite:///{tmp_path.resolve() / 'autotune.db'}"
    assert cfg.storage.study_name is None
    assert cfg.export.formats == EXPORT_FORMATS
    assert cfg.export.dir == tmp_path.resolve() / "exports"
    assert cfg.profile.gamma_max == 8
    assert cfg.source == path


def test_minimal_config_gets_defaults(tmp_path) -> None:
    cfg = parse(_base_raw(tmp_path), tmp_path)
    assert cfg.models.target == tmp_path / "target" and cfg.models.draft == tmp_path / "draft"
    assert cfg.workload.concurrency == (1, 4) and cfg.search.max_batch_size == (
        4,
    )  # default: the largest load level
    assert cfg.search.gamma == Range(0, 8) and cfg.profile.gamma_max == 8
    assert cfg.export.formats == ()
    assert cfg.models.dtype == "auto" and cfg.budget.minutes is None and cfg.budget.trial_timeout_s is None
    assert cfg.backend.llamacpp.threads is None and cfg.backend.vllm.startup_timeout_s is None


def test_deployment_keys_are_typed_and_checked(tmp_path) -> None:
    raw = _set(
        _base_raw(tmp_path),
        "backend.vllm",
        {
            "tensor_parallel_size": 4,
            "gpu_memory_utilization": 0.85,
            "max_model_len": 4096,
            "args": ["!--no-enable-prefix-caching", "--enforce-eager"],
        },
    )
    v = parse(raw, tmp_path).backend.vllm
    assert (v.tensor_parallel_size, v.gpu_memory_utilization, v.max_model_len) == (4, 0.85, 4096)
    assert v.args == ("!--no-enable-prefix-caching", "--enforce-eager")
    for key, bad, message in (
        ("tensor_parallel_size", 0, "backend.vllm.tensor_parallel_size: must be >= 1 (got 0)"),
        ("gpu_memory_utilization", 1.5, "backend.vllm.gpu_memory_utilization: must be <= 1.0 (got 1.5)"),
        ("max_model_len", "long", "backend.vllm.max_model_len: must be an integer"),
    ):
        with pytest.raises(ConfigError, match=re.escape(message)):
            parse(_set(_base_raw(tmp_path), f"backend.vllm.{key}", bad), tmp_path)
    with pytest.raises(ConfigError, match=re.escape("budget.minutes: must be > 0.0 (got 0)")):
        parse(_set(_base_raw(tmp_path), "budget.minutes", 0), tmp_path)
    with pytest.raises(ConfigError, match=re.escape("backend.llamacpp.gpu_layers: must be >= 0 (got -1)")):
        parse(_set(_base_raw(tmp_path), "backend.llamacpp.gpu_layers", -1), tmp_path)


def test_relative_sqlite_url_resolves_against_the_config_folder(tmp_path, monkeypatch) -> None:
    folder = tmp_path / "configs"
    folder.mkdir()
    raw = _set(_base_raw(folder), "storage.url", "sqlite:///db/tune.db")
    path = folder / "tune.yaml"
    path.write_text(yaml.safe_dump(raw))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)

    cfg = load_config(path)

    assert cfg.storage.url == f"sqlite:///{folder.resolve() / 'db' / 'tune.db'}"
    assert cfg.models.target == folder.resolve() / "target"


@pytest.mark.parametrize("url", ["sqlite:////abs/tune.db", "sqlite:///:memory:", "postgresql://u@h/db"])
def test_absolute_and_non_file_urls_are_kept(tmp_path, url) -> None:
    assert parse(_set(_base_raw(tmp_path), "storage.url", url), tmp_path).storage.url == url


def test_scalar_knob_fixes_the_range(tmp_path) -> None:
    raw = _set(_set(_base_raw(tmp_path), "search.gamma", 3), "search.confidence_threshold", 0.25)
    cfg = parse(raw, tmp_path)
    assert cfg.search.gamma == Range(3, 3) and cfg.search.gamma.fixed
    assert cfg.search.confidence_threshold == Range(0.25, 0.25)


def test_rate_makes_one_batch_size_level(tmp_path) -> None:
    raw = _set(_set(_base_raw(tmp_path), "workload.rate", 2.5), "search.max_batch_size", [2, 8])
    cfg = parse(raw, tmp_path)
    assert cfg.workload.rate == 2.5 and cfg.batch_sizes == (8,)


# ------------------------------------------------------------------------------------------
# error paths: every message starts with the exact key path

ERRORS = [
    ("unknown top-level key", lambda r: _set(r, "modles", {}), "modles"),
    ("unknown nested key", lambda r: _set(r, "workload.max_tokens", 5), "workload.max_tokens"),
    (
        "unknown key in a range",
        lambda r: _set(r, "search.gamma", {"low": 0, "high": 2, "step": 1}),
        "search.gamma.step",
    ),
    ("models.target missing", lambda r: _del(r, "models.target"), "models.target"),
    ("models.target not on disk", lambda r: _set(r, "models.target", "nope"), "models.target"),
    ("models.device bad", lambda r: _set(r, "models.device", "tpu"), "models.device"),
    ("models.dtype bad", lambda r: _set(r, "models.dtype", "int8"), "models.dtype"),
    ("workload.prompts missing", lambda r: _del(r, "workload.prompts"), "workload.prompts"),
    ("max_new_tokens 0", lambda r: _set(r, "workload.max_new_tokens", 0), "workload.max_new_tokens"),
    ("max_new_tokens str", lambda r: _set(r, "workload.max_new_tokens", "x"), "workload.max_new_tokens"),
    ("max_new_tokens bool", lambda r: _set(r, "workload.max_new_tokens", True), "workload.max_new_tokens"),
    ("temperature negative", lambda r: _set(r, "workload.temperature", -0.1), "workload.temperature"),
    ("top_p 0", lambda r: _set(r, "workload.top_p", 0), "workload.top_p"),
    ("top_p 1.5", lambda r: _set(r, "workload.top_p", 1.5), "workload.top_p"),
    ("concurrency []", lambda r: _set(r, "workload.concurrency", []), "workload.concurrency"),
    ("concurrency [0]", lambda r: _set(r, "workload.concurrency", [0]), "workload.concurrency"),
    ("rate -1", lambda r: _set(r, "workload.rate", -1), "workload.rate"),
    ("rate 0", lambda r: _set(r, "workload.rate", 0), "workload.rate"),
    (
        "truncate_prompts str",
        lambda r: _set(r, "workload.truncate_prompts", "yes"),
        "workload.truncate_prompts",
    ),
    ("drafter gpt", lambda r: _set(r, "search.drafter", "gpt"), "search.drafter"),
    ("drafter []", lambda r: _set(r, "search.drafter", []), "search.drafter"),
    ("gamma high > 32", lambda r: _set(r, "search.gamma", {"low": 0, "high": 40}), "search.gamma.high"),
    ("gamma without high", lambda r: _set(r, "search.gamma", {"low": 0}), "search.gamma"),
    ("gamma negative", lambda r: _set(r, "search.gamma", {"low": -1, "high": 2}), "search.gamma.low"),
    (
        "threshold high 1.5",
        lambda r: _set(r, "search.confidence_threshold", {"low": 0, "high": 1.5}),
        "search.confidence_threshold.high",
    ),
    (
        "gamma_schedule bad",
        lambda r: _set(r, "search.gamma_schedule", ["constant", "fancy"]),
        "search.gamma_schedule",
    ),
    ("max_batch_size [0]", lambda r: _set(r, "search.max_batch_size", [0]), "search.max_batch_size"),
    ("gamma_cap -1", lambda r: _set(r, "search.gamma_cap", -1), "search.gamma_cap"),
    ("gamma_cap str", lambda r: _set(r, "search.gamma_cap", "sometimes"), "search.gamma_cap"),
    (
        "ngram_max < ngram_min",
        lambda r: _set(_set(r, "search.ngram_min", 4), "search.ngram_max", 2),
        "search.ngram_max",
    ),
    ("drafter model without draft", lambda r: _del(r, "models.draft"), "models.draft"),
    ("objectives.latency bad", lambda r: _set(r, "objectives.latency", "tpot_ms_p99"), "objectives.latency"),
    ("objectives.choose bad", lambda r: _set(r, "objectives.choose", "pareto"), "objectives.choose"),
    (
        "slo unknown key",
        lambda r: _set(r, "objectives.slo", {"tpot_ms_p99": 40}),
        "objectives.slo.tpot_ms_p99",
    ),
    ("slo negative", lambda r: _set(r, "objectives.slo", {"tpot_ms_p95": -5}), "objectives.slo.tpot_ms_p95"),
    ("slo not a mapping", lambda r: _set(r, "objectives.slo", [40]), "objectives.slo"),
    ("min_batches 0", lambda r: _set(r, "workload.min_batches", 0), "workload.min_batches"),
    ("min_batches not an integer", lambda r: _set(r, "workload.min_batches", 1.5), "workload.min_batches"),
    ("n_trials 0", lambda r: _set(r, "budget.n_trials", 0), "budget.n_trials"),
    ("timeout_s 0", lambda r: _set(r, "budget.timeout_s", 0), "budget.timeout_s"),
    ("repeats 0", lambda r: _set(r, "budget.repeats", 0), "budget.repeats"),
    ("repeats not an integer", lambda r: _set(r, "budget.repeats", 2.5), "budget.repeats"),
    ("max_repeats below repeats", lambda r: _set(r, "budget.max_repeats", 2), "budget.max_repeats"),
    ("storage.url without ://", lambda r: _set(r, "storage.url", "autotune.db"), "storage.url"),
    ("study_name empty", lambda r: _set(r, "storage.study_name", ""), "storage.study_name"),
    ("export.formats bad", lambda r: _set(r, "export.formats", ["vllm", "pdf"]), "export.formats"),
    ("profile.gamma_max < gamma.high", lambda r: _set(r, "profile.gamma_max", 4), "profile.gamma_max"),
    ("section not a mapping", lambda r: _set(r, "budget", [1, 2]), "budget"),
]


@pytest.mark.parametrize(("mutate", "key"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_error_message_starts_with_the_key_path(tmp_path, mutate, key) -> None:
    raw = mutate(_base_raw(tmp_path))
    with pytest.raises(ConfigError) as info:
        parse(raw, tmp_path)
    msg = str(info.value)
    assert msg.startswith(f"{key}: "), msg
    assert "\n" not in msg


def test_error_messages_show_the_bad_value(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"^workload\.max_new_tokens: must be an integer \(got 'x'\)$"):
        parse(_set(_base_raw(tmp_path), "workload.max_new_tokens", "x"), tmp_path)
    with pytest.raises(ConfigError, match=r"^workload\.top_p: must be > 0\.0 \(got 0\)$"):
        parse(_set(_base_raw(tmp_path), "workload.top_p", 0), tmp_path)
    with pytest.raises(
        ConfigError, match=r"^profile\.gamma_max: must be >= search\.gamma\.high \(got 4 < 8\)$"
    ):
        parse(_set(_base_raw(tmp_path), "profile.gamma_max", 4), tmp_path)


def test_gamma_high_below_low_message_is_exact(tmp_path) -> None:
    raw = _set(_base_raw(tmp_path), "search.gamma", {"low": 4, "high": 2})
    with pytest.raises(ConfigError) as info:
        parse(raw, tmp_path)
    assert str(info.value) == "search.gamma.high: must be >= search.gamma.low (got 2 < 4)"


def test_device_must_be_cuda_with_an_index(tmp_path) -> None:
    """The documented form is ``cuda[:N]``: ``cuda:x`` or ``cudafoo`` must not get past validation."""
    for device in ("cuda", "cuda:0", "cuda:1", "cpu", "auto"):
        assert parse(_set(_base_raw(tmp_path), "models.device", device), tmp_path).models.device == device
    for device in ("cuda:x", "cudafoo"):
        with pytest.raises(ConfigError, match=r"^models\.device: "):
            parse(_set(_base_raw(tmp_path), "models.device", device), tmp_path)


def test_top_level_not_a_mapping(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"^tune\.yaml: must be a mapping \(got list\)$"):
        parse(["models"], tmp_path)


def test_yaml_syntax_error_names_file_and_line(tmp_path) -> None:
    path = tmp_path / "tune.yaml"
    path.write_text("models:\n  target: t\nworkload: [unclosed\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: line ") and "not valid YAML" in msg and "\n" not in msg


def test_top_level_list_file(tmp_path) -> None:
    path = tmp_path / "tune.yaml"
    path.write_text("- models\n- workload\n")
    with pytest.raises(ConfigError, match=r"^tune\.yaml: must be a mapping"):
        load_config(path)


def test_missing_file(tmp_path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: config file not found"
