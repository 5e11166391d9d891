"""tune.yaml as typed, nested sections (field names = yaml keys) and the key-path-aware reader.

Modules: :mod:`~autotune.config.sections` (``TuneConfig`` and one class per section, each with its
own ``read``; the rules that join sections), :mod:`~autotune.config.reader` (the yaml reader that
names the key path of every error).
"""

from autotune.config.sections import (
    BACKENDS,
    DEFAULT_CACHE,
    DEMO,
    DRAFTERS,
    DTYPES,
    GAMMA_POLICIES,
    PHASES,
    LlamacppConfig,
    LoadLevel,
    ModelsConfig,
    Range,
    SearchConfig,
    TuneConfig,
    WorkloadConfig,
    check_device,
    load_config,
    parse,
)
from autotune.errors import ConfigError
from profiles.exporters import FORMATS as EXPORT_FORMATS

__all__ = [
    "BACKENDS",
    "DEFAULT_CACHE",
    "DEMO",
    "DRAFTERS",
    "DTYPES",
    "EXPORT_FORMATS",
    "GAMMA_POLICIES",
    "PHASES",
    "ConfigError",
    "LlamacppConfig",
    "LoadLevel",
    "ModelsConfig",
    "Range",
    "SearchConfig",
    "TuneConfig",
    "WorkloadConfig",
    "check_device",
    "load_config",
    "parse",
]
