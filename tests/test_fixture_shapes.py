"""The shared test fixtures have the shapes the real code produces."""

from __future__ import annotations

from typing import Any

from autotune.device import hardware


def _shape(value: Any) -> Any:
    """Nested keys of a JSON-like value (the values themselves differ from host to host)."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    return None


def test_the_cpu_fingerprint_fixture_is_the_real_fingerprint_shape(cpu_fingerprint) -> None:
    real = hardware.fingerprint("cpu", "bfloat16")
    fixed = cpu_fingerprint("bfloat16")
    assert real["kind"] == "cpu" and _shape(fixed) == _shape(real) and list(fixed) == list(real)
    # the stand-ins replace exactly what the host readers return, field for field
    assert list(fixed["device"]) == list(hardware._cpu_device_fields())
    assert list(fixed["software"]) == list(hardware._software_fields("bfloat16"))
    assert fixed["key"] == hardware.fingerprint_key(hardware.identity_fields(fixed))
    assert fixed["label"] == "Test CPU (2 cores)" and fixed["software"]["dtype"] == "bfloat16"
    other = cpu_fingerprint(model_name="Other CPU")
    assert other["label"] == "Other CPU (2 cores)" and other["key"] != fixed["key"]
    assert cpu_fingerprint(torch_threads=2)["key"] == fixed["key"]  # thread counts are not identity
