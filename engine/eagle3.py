"""EAGLE-3 draft heads: one decoder layer fed with the target's own hidden states.

The checkpoint format and the math are vLLM's (``vllm/model_executor/models/llama_eagle3.py``;
docs/eagle3.md records the upstream commit, the config keys and the tensor names). The target's
forward also returns the hidden states of a few of its layers (``layer_ids``; id i is the residual
stream entering layer i, engine.model.Transformer.forward_hidden); ``fc`` fuses their
concatenation (k * target_hidden_size -> hidden_size). At head position t, with e = embed(token)
and h the fused target state (or, from the second draft step on, the head's own pre-norm output):

    residual = h
    x = concat(input_layernorm(e), hidden_norm(h))            # (B, T, 2H): q/k/v take 2H
    residual = residual + self_attn(x)                        # RoPE at the target's positions
    out = residual + mlp(post_attention_layernorm(residual))  # pre-norm output, fed back as h
    logits = lm_head(norm(out))                               # (B, T, draft_vocab_size)

Draft id d is target id ``d + d2t[d]``; other target ids get logit -inf (vLLM's compute_logits).

Three published layouts load: vLLM's, the EAGLE-3 authors' (the same config keys and tensor names),
and the ``speculators`` library's (``speculators_model_type: "eagle3"``), read as vLLM reads it
(:func:`speculators_layout`). A pickled ``pytorch_model.bin`` is converted first
(engine.checkpoint.convert_pickled, ``autotune convert-head``). docs/eagle3.md lists the files read.

How the engine drafts with a head (alignment, rollback, trees): engine.eagle3_drafter.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from engine.checkpoint import PICKLED, load_state_dict
from engine.config import ModelConfig, rope_inv_freq
from engine.errors import EngineInputError
from engine.kv_cache import KVCache
from engine.model import MLP, Attention, ExplicitAttention, RMSNorm, Transformer

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")  # vLLM: llama_eagle3
# keys of vLLM's llama_eagle3 variants the engine does not implement: refused when set
REFUSED_KEYS: dict[str, Callable[[Any], bool]] = {
    "norm_before_fc": bool,
    "fc_norm": bool,
    "norm_output": bool,
    "norm_before_residual": bool,
    "logit_scale": lambda v: v is not None and v != 1,
    "dflash_config": lambda v: v is not None,
}
# vLLM's speculators reader (update_eagle3): the layer's model_type -> the architecture it builds
SPECULATORS_ARCHITECTURES = {"llama": "Eagle3LlamaForCausalLM", "qwen3": "Eagle3Qwen3ForCausalLM"}
# keys update_eagle3 copies from the top level of a speculators config over the layer's config
SPECULATORS_KEYS = ("draft_vocab_size", "norm_before_fc", "fc_norm", "norm_output")
LAYER = "midlayer."  # the decoder layer's tensor prefix on disk (vLLM also reads "layers.0.")


@dataclass(frozen=True)
class Eagle3Config:
    """An EAGLE-3 head's hyper-parameters, validated against its target."""

    layer: ModelConfig  # the head's decoder layer (vocab_size: the target's vocabulary)
    layer_ids: tuple[int, ...]  # target layers whose hidden states are fused, ascending
    target_hidden_size: int
    draft_vocab_size: int

    @classmethod
    def from_dict(cls, raw: Any, target: ModelConfig, source: str) -> Eagle3Config:
        """Validate a parsed config.json for ``target``; anything the engine would compute differently
        from vLLM (or vLLM could not load) is one EngineInputError naming ``source`` and the key.

        Example:
            >>> tgt = ModelConfig(64, 32, 64, 4, 4, 4, 8)
            >>> raw = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "vocab_size": 64,
            ...     "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            ...     "num_attention_heads": 4, "draft_vocab_size": 16,
            ...     "eagle_config": {"eagle_aux_hidden_state_layer_ids": [3, 0, 2]}}
            >>> Eagle3Config.from_dict(raw, tgt, "config.json").layer_ids
            (0, 2, 3)
        """
        if not isinstance(raw, dict):
            raise EngineInputError(f"{source}: must be a JSON object")
        names: dict[str, str] = {}  # a key of the vLLM layout -> the key as the file spells it
        layer_source = source
        if raw.get("speculators_model_type") is not None or raw.get("speculators_config") is not None:
            raw, names = speculators_layout(raw, source)
            layer_source = f"{source}: transformer_layer_config"

        def error(key: str, why: str) -> EngineInputError:
            return EngineInputError(f"{source}: key {names.get(key, key)!r} {why}")

        arch = raw.get("architectures")
        if not isinstance(arch, list) or not any(a in ARCHITECTURES for a in arch):
            raise error("architectures", f"must name one of {', '.join(ARCHITECTURES)} (got {arch!r})")
        if raw.get("model_type") != "llama":
            raise error("model_type", f"must be 'llama' for {arch[0]} (got {raw.get('model_type')!r})")
        eagle = raw.get("eagle_config") or {}
        if not isinstance(eagle, dict):
            raise error("eagle_config", f"must be a JSON object (got {eagle!r})")
        for key, is_set in REFUSED_KEYS.items():
            for where, value in (("", raw.get(key)), ("eagle_config.", eagle.get(key))):
                if value is not None and is_set(value):
                    raise error(where + key, f"{value!r} is not supported by the engine")
        if eagle.get("use_aux_hidden_state", True) is not True:
            raise error("eagle_config.use_aux_hidden_state", "must be true (the EAGLE-3 fusion)")
        if raw.get("num_hidden_layers") != 1:
            raise error("num_hidden_layers", f"must be 1 (got {raw.get('num_hidden_layers')!r})")
        if raw.get("hidden_act", "silu") != "silu":
            act = raw["hidden_act"]
            raise error("hidden_act", f"must be 'silu', vLLM's only Llama activation (got {act!r})")
        layer = ModelConfig.from_dict(raw, layer_source)
        if layer.vocab_size != target.vocab_size:
            raise error("vocab_size", f"must equal the target's {target.vocab_size} (got {layer.vocab_size})")
        vocab, draft_vocab = layer.vocab_size, raw.get("draft_vocab_size") or layer.vocab_size
        if isinstance(draft_vocab, bool) or not isinstance(draft_vocab, int) or not 1 <= draft_vocab <= vocab:
            raise error("draft_vocab_size", f"must be an integer in 1..{vocab} (got {draft_vocab!r})")
        target_hidden = raw.get("target_hidden_size") or layer.hidden_size
        if target_hidden != target.hidden_size:
            raise error(
                "target_hidden_size",
                f"must equal the target's hidden_size {target.hidden_size} (got {target_hidden!r})",
            )
        ids = _layer_ids(raw, eagle, target.num_hidden_layers, error)
        count = raw.get("num_aux_hidden_states")
        if count is not None and count != len(ids):
            raise error("num_aux_hidden_states", f"must equal the {len(ids)} layer ids (got {count!r})")
        return cls(layer, ids, target_hidden, draft_vocab)

    @classmethod
    def from_folder(cls, folder: Path, target: ModelConfig) -> Eagle3Config:
        path = folder / "config.json"
        if not path.is_file():
            raise EngineInputError(f"{folder}: no config.json (expected an EAGLE-3 head folder)")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise EngineInputError(f"{path}: not valid JSON ({exc})") from None
        return cls.from_dict(raw, target, str(path))

    def to_dict(self) -> dict[str, Any]:
        """The config.json vLLM loads for this head (the keys :meth:`from_dict` reads)."""
        c = self.layer
        return {
            "architectures": [ARCHITECTURES[0]],
            "model_type": "llama",
            "vocab_size": c.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "hidden_size": c.hidden_size,
            "target_hidden_size": self.target_hidden_size,
            "intermediate_size": c.intermediate_size,
            "num_hidden_layers": 1,
            "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads,
            "head_dim": c.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": c.rms_norm_eps,
            "rope_theta": c.rope_theta,
            "rope_scaling": c.rope_scaling,
            "max_position_embeddings": c.max_position_embeddings,
            "attention_bias": c.attention_bias,
            "mlp_bias": c.mlp_bias,
            "tie_word_embeddings": False,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.layer_ids)},
        }


def _layer_ids(
    raw: dict[str, Any], eagle: dict[str, Any], n_layers: int, error: Callable[[str, str], EngineInputError]
) -> tuple[int, ...]:
    """The aux layer ids as vLLM reads them (top level, else ``eagle_config``, else the target's
    default (2, L // 2, L - 3)), checked and sorted (vLLM concatenates them in ascending order)."""
    key, ids = "eagle_aux_hidden_state_layer_ids", raw.get("eagle_aux_hidden_state_layer_ids")
    nested = eagle.get("eagle_aux_hidden_state_layer_ids")
    if ids and nested and list(nested) != list(ids):
        raise error(f"eagle_config.{key}", f"{nested!r} differs from the top-level {key} {ids!r}")
    if not ids:
        key, ids = f"eagle_config.{key}", nested
    default = not ids
    if default:
        ids = [2, n_layers // 2, n_layers - 3]
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise error(key, f"must be a list of layer ids (got {ids!r})")
    what = f"absent, and the target default {ids}" if default else f"{ids}"
    if any(not 0 <= i <= n_layers for i in ids):
        raise error(key, f"{what}: ids must be in 0..{n_layers} for a {n_layers}-layer target")
    if len(set(ids)) != len(ids):
        raise error(key, f"{what}: ids must be distinct")
    return tuple(sorted(ids))


def speculators_layout(raw: dict[str, Any], source: str) -> tuple[dict[str, Any], dict[str, str]]:
    """A ``speculators`` config.json as vLLM reads it (``SpeculatorsConfig`` and ``update_eagle3``):
    ``transformer_layer_config`` with the eagle3 keys of the top level set over it. Also returns,
    for each key of that layout, the key as this file spells it (for error messages).

    vLLM reads an absent ``norm_before_residual`` as true, unlike the library's own default.

    Example:
        >>> raw = {"speculators_model_type": "eagle3", "speculators_config": {}, "draft_vocab_size": 16,
        ...     "norm_before_residual": False, "eagle_aux_hidden_state_layer_ids": [0, 2],
        ...     "transformer_layer_config": {"model_type": "llama", "hidden_size": 32}}
        >>> layout, names = speculators_layout(raw, "config.json")
        >>> layout["architectures"], layout["hidden_size"], names["hidden_size"]
        (['Eagle3LlamaForCausalLM'], 32, 'transformer_layer_config.hidden_size')
    """

    def error(key: str, why: str) -> EngineInputError:
        return EngineInputError(f"{source}: key {key!r} {why}")

    kind = raw.get("speculators_model_type")
    if kind != "eagle3":
        raise error("speculators_model_type", f"must be 'eagle3', the one the engine reads (got {kind!r})")
    layer = raw.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise error("transformer_layer_config", "must be a JSON object (speculators_model_type 'eagle3')")
    model_type = layer.get("model_type", "llama")
    if model_type != "llama":
        arch = SPECULATORS_ARCHITECTURES.get(model_type, "nothing")
        raise error(
            "transformer_layer_config.model_type",
            f"{model_type!r} is not supported: vLLM builds {arch} from it, the engine implements "
            f"{SPECULATORS_ARCHITECTURES['llama']}",
        )
    if "norm_before_residual" not in raw:
        raise error("norm_before_residual", "is absent, which vLLM reads as true: not supported")
    names = {key: f"transformer_layer_config.{key}" for key in layer}
    out = {**layer, "model_type": model_type, "architectures": [SPECULATORS_ARCHITECTURES[model_type]]}
    for key in (*SPECULATORS_KEYS, "norm_before_residual"):
        out[key], names[key] = raw.get(key), key
    names["architectures"] = "speculators_model_type"
    for key in ("target_hidden_size", "eagle_aux_hidden_state_layer_ids"):
        if raw.get(key):
            out[key], names[key] = raw[key], key
    return out, names


class Eagle3Layer(nn.Module):
    """vLLM's first EAGLE-3 decoder layer: q/k/v read concat(embeddings, hidden) (2H wide)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h, attn = cfg.hidden_size, Attention(cfg, 0)
        attn.q_proj = nn.Linear(2 * h, attn.n_heads * attn.hd, bias=cfg.attention_bias)
        attn.k_proj = nn.Linear(2 * h, attn.n_kv * attn.hd, bias=cfg.attention_bias)
        attn.v_proj = nn.Linear(2 * h, attn.n_kv * attn.hd, bias=cfg.attention_bias)
        self.self_attn = attn
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)

    def forward(
        self,
        embeds: torch.Tensor,  # (B, T, H)
        hidden: torch.Tensor,  # (B, T, H) fused target states or the head's own pre-norm outputs
        cos: torch.Tensor,  # (B, 1, T, hd)
        sin: torch.Tensor,
        cache: KVCache,
        positions: torch.Tensor,  # (B, T)
        kv_len: int,
        slot0: int,
        mask: torch.Tensor,  # (B, 1, T, L)
    ) -> torch.Tensor:  # (B, T, H) pre-norm output
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], -1)  # (B, T, 2H)
        residual = hidden + self.self_attn(x, cos, sin, cache, positions, kv_len, slot0, mask)
        out: torch.Tensor = residual + self.mlp(self.post_attention_layernorm(residual))
        return out


class Eagle3Head(nn.Module):
    """An EAGLE-3 head; parameter names are the checkpoint's (``midlayer.*``, ``fc``, ``norm``, ...).

    The target's embedding table (and, with a full draft vocabulary, its lm_head) serve when the
    checkpoint has none (:func:`load_eagle3` binds them; they are not the head's parameters).
    """

    d2t: torch.Tensor  # (draft_vocab_size,) int64 buffer: target id = draft id + d2t[draft id]
    inv_freq: torch.Tensor  # (head_dim/2,) buffer

    def __init__(self, cfg: Eagle3Config, own_embed: bool = False, own_lm_head: bool = True) -> None:
        super().__init__()
        c = cfg.layer
        self.config = cfg
        self.fc = nn.Linear(len(cfg.layer_ids) * cfg.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size) if own_embed else None
        self.lm_head = nn.Linear(c.hidden_size, cfg.draft_vocab_size, bias=False) if own_lm_head else None
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("inv_freq", rope_inv_freq(c), persistent=False)
        self._shared: tuple[nn.Module, ...] = ()  # (embedding, lm_head) of the target, when used

    def bind(self, target: Transformer) -> Eagle3Head:
        """Use ``target``'s embedding table and lm_head where the head has none."""
        self._shared = (target.model.embed_tokens, target.lm_head)
        return self

    def target_ids(self) -> torch.Tensor:
        """The target id of each draft id: ``arange(draft_vocab_size) + d2t`` (the identity for a
        full vocabulary)."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    @property
    def remaps(self) -> bool:
        """Whether draft ids differ from target ids (a reduced draft vocabulary)."""
        return self.config.draft_vocab_size != self.config.layer.vocab_size

    def new_cache(self, slots: int, max_seq_len: int) -> KVCache:
        c, w = self.config.layer, self.fc.weight
        with torch.inference_mode(False):
            return KVCache(1, slots, c.num_key_value_heads, max_seq_len, c.head_dim, w.dtype, w.device)

    def forward(
        self,
        tokens: torch.Tensor,  # (B, T) target ids
        hidden: torch.Tensor,  # (B, T, H)
        cache: KVCache,
        start: torch.Tensor,  # (B,) each row's first position
        kv_len: int,
        slot0: int = 0,
        attn: ExplicitAttention | None = None,  # a token tree's positions and mask (engine.tree)
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (B, T, V) target-vocabulary logits, (B, T, H) pre-norm
        """Feed T positions at cache slots ``start + j``: causal at RoPE positions ``start + j``, or,
        with ``attn``, at ``attn.positions`` seeing ``attn.visible`` (engine.model.ExplicitAttention)."""
        embed = self.embed_tokens if self.embed_tokens is not None else self._shared[0]
        lm_head = self.lm_head if self.lm_head is not None else self._shared[1]
        t = tokens.shape[1]
        slots = start[:, None] + torch.arange(t, device=tokens.device)[None, :]  # (B, T)
        rope_pos = slots if attn is None else attn.positions
        freqs = rope_pos[..., None].float() * self.inv_freq  # (B, T, hd/2)
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # (B, 1, T, hd)
        x = embed(tokens)  # (B, T, H)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        if attn is None:
            keys = torch.arange(kv_len, device=tokens.device)[None, None, :]
            mask = (keys <= slots[:, :, None])[:, None]  # (B, 1, T, L) causal
        else:
            mask = attn.visible[:, None]  # (B, 1, T, L)
        out = self.midlayer(x, hidden, cos, sin, cache, slots, kv_len, slot0, mask)
        logits: torch.Tensor = lm_head(self.norm(out))  # (B, T, draft_vocab_size)
        if self.remaps:
            full = logits.new_full((*logits.shape[:-1], self.config.layer.vocab_size), float("-inf"))
            logits = full.index_copy(-1, self.target_ids(), logits)
        return logits, out


def load_eagle3(folder: str | Path, target: Transformer) -> Eagle3Head:
    """Load an EAGLE-3 head folder (config.json + *.safetensors in vLLM's, the EAGLE-3 authors' or the
    ``speculators`` layout) for ``target``, on its device and in its dtype. A config or tensor the
    engine does not implement is refused with one :class:`EngineInputError` naming the folder and
    the key.

    Example:
        >>> head = load_eagle3("heads/eagle3", pair.target)  # doctest: +SKIP
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise EngineInputError(f"{folder}: EAGLE-3 head folder not found")
    cfg = Eagle3Config.from_folder(folder, target.config)
    if not any(folder.glob("*.safetensors")) and (folder / PICKLED).is_file():
        raise EngineInputError(
            f"{folder}: pickled .bin checkpoints are not loaded; convert it once with "
            f"`autotune convert-head {folder}` (writes model.safetensors)"
        )
    state = _vllm_names(folder, load_state_dict(folder))
    remaps = cfg.draft_vocab_size != cfg.layer.vocab_size
    if "lm_head.weight" not in state and remaps:
        raise EngineInputError(
            f"{folder}: tensor 'lm_head.weight' is missing (draft_vocab_size {cfg.draft_vocab_size} "
            f"< vocab_size {cfg.layer.vocab_size}: the target's lm_head cannot serve)"
        )
    own_embed = "embed_tokens.weight" in state
    if not own_embed and cfg.layer.hidden_size != target.config.hidden_size:
        raise EngineInputError(
            f"{folder}: key 'hidden_size' {cfg.layer.hidden_size} differs from the target's "
            f"{target.config.hidden_size} and there is no 'embed_tokens.weight' of its own"
        )
    with torch.device("meta"):
        head = Eagle3Head(cfg, own_embed, "lm_head.weight" in state)
    t2d = state.pop("t2d", None)
    d2t = state.pop("d2t", None)
    _check_vocab_map(folder, cfg, d2t, t2d)
    expected = {k for k in head.state_dict() if k != "d2t"}
    missing, unexpected = sorted(expected - state.keys()), sorted(state.keys() - expected)
    if missing or unexpected:
        what = f"missing tensor {missing[0]!r}" if missing else f"unexpected tensor {unexpected[0]!r}"
        raise EngineInputError(f"{folder}: {what} for this config.json (vLLM's llama_eagle3 names)")
    for name, tensor in state.items():
        want = head.get_parameter(name).shape
        if tensor.shape != want:
            raise EngineInputError(
                f"{folder}: tensor {name!r} has shape {tuple(tensor.shape)}, config implies {tuple(want)}"
            )
    w = target.lm_head.weight
    head.load_state_dict({k: v.to(w.dtype) for k, v in state.items()}, strict=False, assign=True)
    head.d2t = torch.zeros(cfg.draft_vocab_size, dtype=torch.long) if d2t is None else d2t.long()
    head.inv_freq = rope_inv_freq(cfg.layer)
    return head.to(w.device).eval().requires_grad_(False).bind(target)


def _vllm_names(folder: Path, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The decoder layer's tensors under ``midlayer.``: vLLM maps ``midlayer.`` to ``layers.0.``, so
    both spellings load (never both at once)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        key = LAYER + name[len("layers.0.") :] if name.startswith("layers.0.") else name
        if key in out:
            other = "layers.0." + key[len(LAYER) :]
            raise EngineInputError(f"{folder}: tensor {key!r} is stored twice, also as {other!r}")
        out[key] = tensor
    return out


def _check_vocab_map(
    folder: Path, cfg: Eagle3Config, d2t: torch.Tensor | None, t2d: torch.Tensor | None
) -> None:
    """``d2t`` must map the draft vocabulary one-to-one into the target's (required exactly when it
    is smaller: vLLM has nowhere to load it otherwise); ``t2d``, which vLLM skips, must agree."""
    vocab, draft = cfg.layer.vocab_size, cfg.draft_vocab_size
    if d2t is None:
        if draft < vocab:
            raise EngineInputError(
                f"{folder}: tensor 'd2t' is missing (draft_vocab_size {draft} < vocab_size {vocab})"
            )
        if t2d is not None:
            raise EngineInputError(f"{folder}: tensor 't2d' without 'd2t'")
        return
    if draft == vocab:
        raise EngineInputError(
            f"{folder}: tensor 'd2t' is present but draft_vocab_size equals vocab_size {vocab} "
            "(vLLM has no draft-to-target map to load it into)"
        )
    if d2t.shape != (draft,) or d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
        raise EngineInputError(
            f"{folder}: tensor 'd2t' must be integer offsets of shape ({draft},) "
            f"(got {d2t.dtype} {tuple(d2t.shape)})"
        )
    targets = torch.arange(draft) + d2t.long()
    mask = torch.zeros(vocab, dtype=torch.bool)
    in_range = bool(((targets >= 0) & (targets < vocab)).all())
    if not in_range or int(mask.index_fill(0, targets, True).sum()) != draft:
        raise EngineInputError(f"{folder}: tensor 'd2t' must map draft ids to distinct target ids < {vocab}")
    if t2d is not None:
        mask[targets] = True
        if t2d.shape != (vocab,) or t2d.dtype != torch.bool or not torch.equal(t2d, mask):
            raise EngineInputError(f"{folder}: tensor 't2d' does not mark exactly the target ids of 'd2t'")


def save_eagle3(head: Eagle3Head, folder: str | Path) -> Path:
    """Write ``head`` as an EAGLE-3 folder vLLM loads (config.json + model.safetensors: ``midlayer.*``,
    ``fc``, ``norm``, ``lm_head``, ``d2t`` and ``t2d`` when the draft vocabulary is reduced)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(head.config.to_dict(), indent=2))
    state = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items() if k != "d2t"}
    if head.remaps:
        cfg = head.config
        state["d2t"] = head.d2t.cpu()
        t2d = torch.zeros(cfg.layer.vocab_size, dtype=torch.bool)
        t2d[head.target_ids().cpu()] = True
        state["t2d"] = t2d
    save_file(state, str(folder / "model.safetensors"))
    return folder
