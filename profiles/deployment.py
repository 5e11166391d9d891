"""How the trials served the pair: every server flag beyond the tuned speculative settings.

One :class:`Deployment` is built by the tuner from tune.yaml and the workload before the first
server starts, passed to the stack's flag builder for every trial (``profiles.exporters.vllm.serve_args``,
``profiles.exporters.llamacpp.server_args``) and stored in the profile, so the export's command is
built by the same function from the same values: it launches what was measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from profiles.errors import ProfileError

STACKS = ("engine", "vllm", "llamacpp")


@dataclass(frozen=True)
class Deployment:
    """The serving flags a profile was measured with (``None``: the stack's own default).

    Example:
        >>> d = Deployment("vllm", "bfloat16", tensor_parallel_size=4, max_model_len=2048)
        >>> Deployment.from_json(d.to_json()) == d
        True
    """

    stack: str  # engine | vllm | llamacpp
    dtype: str  # the weights' dtype as served (llama.cpp: the GGUF type, e.g. f32, q4_k_m)
    tensor_parallel_size: int = 1  # vLLM --tensor-parallel-size (SGLang --tp, TGI --num-shard)
    max_model_len: int | None = None  # vLLM --max-model-len
    gpu_memory_utilization: float | None = None  # vLLM --gpu-memory-utilization
    context_size: int | None = None  # llama.cpp context per slot: -c is this x -np (split among slots)
    threads: int | None = None  # llama.cpp -t
    gpu_layers: int | None = None  # llama.cpp -ngl
    draft_gpu_layers: int | None = None  # llama.cpp -ngld
    extra_args: tuple[str, ...] = ()  # the user's flags, as given (backend.<stack>.args)
    env: tuple[tuple[str, str], ...] = field(default=())  # the server's environment beyond the host's

    def __post_init__(self) -> None:
        if self.stack not in STACKS:
            raise ProfileError(
                f"profile: deployment.stack must be one of {', '.join(STACKS)} (got {self.stack!r})"
            )
        if self.tensor_parallel_size < 1:
            raise ProfileError(
                f"profile: deployment.tensor_parallel_size must be >= 1 (got {self.tensor_parallel_size})"
            )

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["extra_args"] = list(self.extra_args)
        out["env"] = dict(self.env)
        return {k: v for k, v in out.items() if v is not None and v != [] and v != {}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Deployment:
        if not isinstance(data, Mapping) or "stack" not in data or "dtype" not in data:
            raise ProfileError("profile: deployment must be a mapping with stack and dtype")
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(data) - known
        if unknown:
            raise ProfileError(f"profile: unknown key 'deployment.{sorted(unknown)[0]}'")
        args = dict(data)
        args["extra_args"] = tuple(str(a) for a in data.get("extra_args", ()))
        args["env"] = tuple((str(k), str(v)) for k, v in dict(data.get("env", {})).items())
        return cls(**args)
