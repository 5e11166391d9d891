"""One home per enumeration: the engine owns drafters, gamma policies and dtypes, profiles owns export
formats; autotune and the CLI take them from there, and profiles' copies (it may not import the
engine) match the engine's."""

from __future__ import annotations

import click
import torch

import profiles.profile
from autotune import config
from autotune.backends import BACKENDS
from autotune.cli import main
from engine.generate import DRAFTERS
from engine.loader import DTYPES
from engine.speculative import GAMMA_POLICIES
from profiles.exporters import FORMATS


def _choices(command: click.Command, name: str) -> tuple:
    (param,) = [p for p in command.params if p.name == name]
    return tuple(param.type.choices)


def test_profiles_copies_match_the_engine() -> None:
    assert profiles.profile.DRAFTERS == DRAFTERS
    assert profiles.profile.GAMMA_POLICIES == GAMMA_POLICIES


def test_tune_yaml_takes_the_homes() -> None:
    assert config.DRAFTERS is DRAFTERS and config.GAMMA_POLICIES is GAMMA_POLICIES
    assert config.EXPORT_FORMATS is FORMATS and config.BACKENDS is BACKENDS
    assert config.DTYPES == ("float32", "bfloat16", "float16")
    assert (
        {DTYPES[name] for name in config.DTYPES}
        == set(DTYPES.values())
        == {torch.float32, torch.bfloat16, torch.float16}
    )


def test_cli_choice_lists_are_the_homes() -> None:
    assert _choices(main.commands["bench"], "drafter") == DRAFTERS
    assert _choices(main.commands["bench"], "gamma_schedule") == GAMMA_POLICIES
    assert _choices(main.commands["export"], "fmt") == FORMATS
    assert _choices(main.commands["tune"], "backend") == BACKENDS
