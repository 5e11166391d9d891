"""Model configuration read from a Hugging Face style ``config.json``.

Llama-family decoders are supported: ``llama``, ``mistral`` (llama-shaped, sliding-window
attention), ``qwen2`` (q/k/v biases, optional sliding window) and ``qwen3`` (per-head RMSNorm on
q and k). Every key that changes the math is either implemented exactly as transformers computes
it or refused: a config the engine would compute differently from transformers never loads.
Each refusal is one :class:`~engine.errors.EngineInputError` line naming the file and the key.
"""

from __future__ import annotations

import builtins
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.errors import EngineInputError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
ACTIVATIONS = ("silu", "swish", "gelu", "gelu_new", "gelu_pytorch_tanh", "relu")  # engine.model.ACT
ROPE_FIELDS = {  # rope type -> the fields it needs (besides rope_theta)
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
# keys of other architectures that change the math; refused when set (value -> is it "set"?)
REFUSED_KEYS: dict[str, Callable[[Any], bool]] = {
    "final_logit_softcapping": lambda v: v is not None,
    "attn_logit_softcapping": lambda v: v is not None,
    "partial_rotary_factor": lambda v: v is not None and v != 1,
    "qk_norm": bool,
    "use_qk_norm": bool,
    "attention_chunk_size": lambda v: v is not None,
    "no_rope_layers": bool,
    "use_bidirectional_attention": bool,
}
_REQUIRED = object()


@dataclass(frozen=True)
class ModelConfig:
    """The architecture hyper-parameters the engine needs."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v bias (Qwen2 always, Llama/Qwen3 when attention_bias)
    o_bias: bool = False
    mlp_bias: bool = False
    model_type: str = "llama"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    hidden_act: str = "silu"
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k, before RoPE
    sliding_window: int | None = None  # a query at position p sees keys p - window < j <= p ...
    sliding_layers: tuple[int, ...] = ()  # ... in these layers (the others see every j <= p)

    @classmethod
    def from_dict(cls, raw: Any, source: str = "config.json") -> ModelConfig:
        """Validate a parsed config.json; anything unsupported or malformed is one line naming the key.

        Example:
            >>> cfg = ModelConfig.from_dict({"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32,
            ...     "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4})
            >>> cfg.qk_norm, cfg.head_dim, cfg.num_key_value_heads
            (True, 8, 4)
        """
        r = _Raw(raw, source)
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise EngineInputError(
                f"{source}: unsupported model_type {model_type!r} "
                f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        for key, is_set in REFUSED_KEYS.items():
            if key in raw and is_set(raw[key]):
                raise r.error(key, f"{raw[key]!r} is not supported by the engine (model_type {model_type!r})")
        hidden, heads, layers = r.int("hidden_size"), r.int("num_attention_heads"), r.int("num_hidden_layers")
        kv_heads = r.int("num_key_value_heads", heads)
        if heads % kv_heads:
            raise r.error("num_key_value_heads", f"must divide num_attention_heads {heads} (got {kv_heads})")
        head_dim = r.int("head_dim", hidden // heads)
        if head_dim % 2:
            raise r.error("head_dim", f"must be even for rotary embeddings (got {head_dim})")
        max_pos = r.int("max_position_embeddings", 2048)
        act = r.get("hidden_act", "silu")
        if act not in ACTIVATIONS:
            raise r.error("hidden_act", f"{act!r} is not supported (supported: {', '.join(ACTIVATIONS)})")
        theta, scaling = _rope(r)
        window, sliding = _sliding_window(r, model_type, layers, max_pos)
        attention_bias = r.bool("attention_bias", False) if model_type in ("llama", "qwen3") else False
        return cls(
            vocab_size=r.int("vocab_size"),
            hidden_size=hidden,
            intermediate_size=r.int("intermediate_size"),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            max_position_embeddings=max_pos,
            rms_norm_eps=r.num("rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=r.bool("tie_word_embeddings", False),
            attention_bias=True if model_type == "qwen2" else attention_bias,  # transformers: Qwen2 always
            o_bias=attention_bias,
            mlp_bias=r.bool("mlp_bias", False) if model_type == "llama" else False,
            model_type=model_type,
            bos_token_id=r.token_id("bos_token_id"),
            eos_token_ids=r.token_ids("eos_token_id"),
            hidden_act=act,
            qk_norm=model_type == "qwen3",
            sliding_window=window,
            sliding_layers=sliding,
        )

    @classmethod
    def from_folder(cls, folder: Path) -> ModelConfig:
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise EngineInputError(f"{folder}: no config.json (expected a Hugging Face style model folder)")
        try:
            raw = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise EngineInputError(f"{path}: not valid JSON ({exc})") from None
        return cls.from_dict(raw, source=str(path))

    def to_hf_dict(self) -> dict[str, Any]:
        """The ``config.json`` transformers loads as this architecture (and :meth:`from_dict` reads back)."""
        out: dict[str, Any] = {
            "architectures": [ARCHITECTURES[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "mlp_bias": self.mlp_bias,
            "hidden_act": self.hidden_act,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids)
            if len(self.eos_token_ids) != 1
            else self.eos_token_ids[0],
        }
        if self.model_type == "mistral":
            out["sliding_window"] = self.sliding_window
        elif self.model_type in ("qwen2", "qwen3"):
            out["use_sliding_window"] = self.sliding_window is not None
            out["sliding_window"] = self.sliding_window
            out["layer_types"] = [
                "sliding_attention" if i in self.sliding_layers else "full_attention"
                for i in range(self.num_hidden_layers)
            ]
        return out


class _Raw:
    """Typed reads of one config.json mapping: every failure is one line naming the file and the key."""

    def __init__(self, raw: Any, source: str, prefix: str = "") -> None:
        if not isinstance(raw, dict):
            raise EngineInputError(f"{source}: must be a JSON object (got {_json_type(raw)})")
        self.raw, self.source, self.prefix = raw, source, prefix

    def error(self, key: str, problem: str) -> EngineInputError:
        return EngineInputError(f"{self.source}: {self.prefix}{key} {problem}")

    def get(self, key: str, default: Any = _REQUIRED) -> Any:
        value = self.raw.get(key)
        if value is None:
            if default is _REQUIRED:
                raise EngineInputError(f"{self.source}: missing key {self.prefix + key!r}")
            return default
        return value

    def int(self, key: str, default: Any = _REQUIRED, lo: int = 1) -> int:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise self.error(key, f"must be an integer >= {lo} (got {value!r})")
        return value

    def num(self, key: str, default: Any = _REQUIRED) -> float:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise self.error(key, f"must be a positive number (got {value!r})")
        return float(value)

    def bool(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false (got {value!r})")
        return value

    # builtins.int: in this class body `int` names the method above
    def token_id(self, key: str) -> builtins.int | None:
        return None if self.raw.get(key) is None else self.int(key, lo=0)

    def token_ids(self, key: str) -> tuple[builtins.int, ...]:
        value = self.raw.get(key)
        values = value if isinstance(value, list) else [] if value is None else [value]
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values):
            raise self.error(key, f"must be a token id or a list of token ids (got {value!r})")
        return tuple(values)


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _rope(r: _Raw) -> tuple[float, dict[str, Any] | None]:
    """``(rope_theta, rope_scaling)`` as transformers reads them: ``rope_scaling`` (older files) wins
    over ``rope_parameters`` (transformers >= 5); ``rope_theta`` inside it wins over the top-level one."""
    key = "rope_scaling" if r.raw.get("rope_scaling") else "rope_parameters"
    rope = r.raw.get(key) or {}
    if not isinstance(rope, dict):
        raise r.error(key, f"must be a JSON object or null (got {_json_type(rope)})")
    nested = next((k for k, v in rope.items() if isinstance(v, dict)), None)
    if nested is not None:
        raise r.error(f"{key}.{nested}", "is not supported (RoPE parameters per layer type)")
    sub = _Raw(rope, r.source, prefix=f"{key}.")
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ROPE_FIELDS:
        raise sub.error("rope_type", f"{kind!r} is not supported (supported: {', '.join(ROPE_FIELDS)})")
    if rope.get("partial_rotary_factor") not in (None, 1, 1.0):
        raise sub.error("partial_rotary_factor", f"{rope['partial_rotary_factor']!r} is not supported")
    for name in ROPE_FIELDS[kind]:
        if rope.get(name) is None:
            raise sub.error(name, f"is missing (rope_type {kind!r} needs {', '.join(ROPE_FIELDS[kind])})")
        sub.num(name)
    if kind == "llama3" and rope["high_freq_factor"] <= rope["low_freq_factor"]:
        raise sub.error("high_freq_factor", f"must be > low_freq_factor (got {rope['high_freq_factor']!r})")
    theta = (
        sub.num("rope_theta", None) if rope.get("rope_theta") is not None else r.num("rope_theta", 10000.0)
    )
    return theta, ({**rope, "rope_type": kind} if kind != "default" else None)


def _sliding_window(
    r: _Raw, model_type: str, layers: int, max_pos: int
) -> tuple[int | None, tuple[int, ...]]:
    """``(window, layers using it)`` as transformers computes them for ``model_type``.

    Mistral: every layer when ``sliding_window`` is set (transformers' default 4096 when the key is
    absent). Qwen2/Qwen3: only with ``use_sliding_window: true``, in the layers ``layer_types`` marks
    ``sliding_attention`` (or, without it, from ``max_window_layers`` on). Llama has no sliding
    window: a window smaller than the context there is refused.
    """
    if model_type == "llama":
        window = r.raw.get("sliding_window")
        if r.raw.get("use_sliding_window") or (
            window is not None and (not isinstance(window, int) or window < max_pos)
        ):
            key = "use_sliding_window" if r.raw.get("use_sliding_window") else "sliding_window"
            raise r.error(key, f"{r.raw[key]!r} is not supported for model_type 'llama'")
        return None, ()
    if model_type == "mistral":
        if "layer_types" in r.raw:
            raise r.error(
                "layer_types", "is not supported for model_type 'mistral' (transformers ignores it)"
            )
        if "sliding_window" in r.raw and r.raw["sliding_window"] is None:
            return None, ()
        return r.int("sliding_window", 4096), tuple(range(layers))
    if not r.bool("use_sliding_window", False):
        return None, ()
    types = r.raw.get("layer_types")
    if "sliding_window" in r.raw and r.raw["sliding_window"] is None:  # transformers: no sliding layer then
        if isinstance(types, list) and "sliding_attention" in types:
            raise r.error("sliding_window", "is null but layer_types has sliding_attention layers")
        return None, ()
    window = r.int("sliding_window", 4096)
    if types is None:
        first = r.int("max_window_layers", 28, lo=0)
        return window, tuple(range(first, layers))
    if not isinstance(types, list) or len(types) != layers:
        raise r.error("layer_types", f"must be a list of {layers} layer types (got {types!r})")
    bad = next((t for t in types if t not in ("full_attention", "sliding_attention")), None)
    if bad is not None:
        raise r.error("layer_types", f"entry {bad!r} is not supported (full_attention, sliding_attention)")
    return window, tuple(i for i, t in enumerate(types) if t == "sliding_attention")


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse RoPE frequencies (head_dim/2,), with Llama-3 or linear scaling applied.

    ``cfg.rope_scaling`` was validated by :meth:`ModelConfig.from_dict` (every field it needs is there).

    Example:
        >>> cfg = ModelConfig(64, 32, 64, 1, 4, 4, 8, rope_scaling={"rope_type": "linear", "factor": 2.0})
        >>> rope_inv_freq(cfg).tolist()
        [0.5, 0.05000000074505806, 0.004999999888241291, 0.0005000000237487257]
    """
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type")) if scaling else "default"
    if kind == "default":
        return inv_freq.float()
    if kind == "linear":
        return (inv_freq / float(scaling["factor"])).float()
    if kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling["low_freq_factor"])
        high = float(scaling["high_freq_factor"])
        old_ctx = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
        return torch.where(medium, smoothed, scaled).float()
    raise EngineInputError(
        f"rope_scaling: unsupported rope_type {kind!r} (supported: {', '.join(ROPE_FIELDS)})"
    )
