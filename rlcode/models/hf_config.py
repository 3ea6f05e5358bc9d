"""Hugging Face config.json to ModelConfig and back, family by family.

A family is a Hugging Face `model_type` the decoder computes exactly (checked against
transformers by tests/test_model_families.py): what each one switches on is in FAMILIES.
Both the config layout of transformers 5 (`rope_parameters`, `layer_types`) and that of
checkpoints written by earlier versions (`rope_scaling`, `rope_theta`,
`use_sliding_window`, Gemma 3's `rope_local_base_freq`) are read. Anything the decoder
would compute differently (an activation, a bias, softcapping, a rope type, partial
rotary) is refused in one line naming the field; nothing is dropped silently. This
module must not touch weights (rlcode.models.hf).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rlcode.errors import BadInput
from rlcode.models import rope as rope_lib
from rlcode.models.config import ModelConfig, _DTYPES

# model_type -> (architecture class, ModelConfig fields the family fixes).
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2": ("Qwen2ForCausalLM", dict(qkv_bias=True)),
    "llama": ("LlamaForCausalLM", {}),
    "mistral": ("MistralForCausalLM", {}),
    "qwen3": ("Qwen3ForCausalLM", dict(qk_norm="head")),
    "qwen2_moe": ("Qwen2MoeForCausalLM", dict(qkv_bias=True)),
    "qwen3_moe": ("Qwen3MoeForCausalLM", dict(qk_norm="head")),
    "gemma3_text": ("Gemma3ForCausalLM", dict(
        qk_norm="head", norm_layout="sandwich", norm_plus_one=True, scale_embeddings=True)),
    "olmo2": ("Olmo2ForCausalLM", dict(qk_norm="full", norm_layout="post")),
    "phi3": ("Phi3ForCausalLM", {}),
}
SUPPORTED_ARCHITECTURES = tuple(arch for arch, _ in FAMILIES.values())
_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
# What other families are, for the refusal's message.
_KNOWN_MISSING = {
    "deepseek_v3": "multi-head latent attention (MLA) and its latent KV cache are not built",
    "gemma3": "Gemma3ForConditionalGeneration is the vision-language model; load its "
              "language model (model_type gemma3_text) instead",
}


def family_of(hf: Mapping[str, Any], source: str) -> str:
  archs = hf.get("architectures") or []
  model_type = hf.get("model_type")
  for family, (arch, _) in FAMILIES.items():
    if arch in archs or (not archs and model_type == family):
      return family
  why = _KNOWN_MISSING.get(model_type, "")
  raise BadInput(f"{source}: architectures={archs} (model_type={model_type!r}) is not "
                 f"supported{': ' + why if why else ''}; supported: "
                 f"{list(SUPPORTED_ARCHITECTURES)}")


def _rope(params: Mapping[str, Any] | None, hf: Mapping[str, Any], source: str,
          what: str = "rope") -> tuple[float, dict | None]:
  """(theta, rope_scaling) from a rope parameters dict (or the old rope_scaling)."""
  rope = dict(params or {})
  theta = float(rope.pop("rope_theta", hf.get("rope_theta", 10000.0)))
  if rope.pop("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)) != 1.0:
    raise BadInput(f"{source}: partial_rotary_factor != 1 is not supported")
  kind = rope.pop("rope_type", rope.pop("type", "default"))
  if kind == "default":
    return theta, None
  if kind not in rope_lib.ROPE_TYPES:
    raise BadInput(f"{source}: {what} type {kind!r} is not supported (supported: "
                   f"{list(rope_lib.ROPE_TYPES)}; 'dynamic' and 'longrope' rescale with the "
                   "sequence length at run time)")
  needs = {"linear": ("factor",),
           "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                      "original_max_position_embeddings"),
           "yarn": ("factor", "original_max_position_embeddings")}[kind]
  if kind == "yarn":
    rope.setdefault("original_max_position_embeddings",
                    hf.get("original_max_position_embeddings",
                           hf.get("max_position_embeddings")))
  missing = [k for k in needs if rope.get(k) is None]
  if missing:
    raise BadInput(f"{source}: {what} type {kind!r} needs {missing} in its rope parameters")
  return theta, {"rope_type": kind, **{k: v for k, v in rope.items() if v is not None}}


def _layer_kinds(hf: Mapping[str, Any], family: str, n: int, source: str) -> tuple[str, ...]:
  types = hf.get("layer_types")
  window = hf.get("sliding_window")
  if types is None:
    if family == "mistral" and window:
      types = ["sliding_attention"] * n
    elif family in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and hf.get("use_sliding_window"):
      first = hf.get("max_window_layers", n)
      types = ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
    elif family == "gemma3_text":
      every = hf.get("sliding_window_pattern") or hf.get("_sliding_window_pattern") or 6
      types = ["full_attention" if (i + 1) % every == 0 else "sliding_attention"
               for i in range(n)]
    else:
      types = ["full_attention"] * n
  kinds = {"full_attention": "dense", "sliding_attention": "sliding"}
  unknown = sorted(set(types) - set(kinds))
  if unknown:
    raise BadInput(f"{source}: layer_types {unknown} not supported (supported: "
                   f"{sorted(kinds)})")
  if len(types) != n:
    raise BadInput(f"{source}: layer_types has {len(types)} entries for "
                   f"num_hidden_layers={n}")
  out = tuple(kinds[t] for t in types)
  if "sliding" in out and not window:
    raise BadInput(f"{source}: sliding layers without a sliding_window")
  return out


def _moe(hf: Mapping[str, Any], family: str, n: int) -> dict | None:
  if family not in ("qwen2_moe", "qwen3_moe"):
    return None
  every = hf.get("decoder_sparse_step", 1) or 1
  only = set(hf.get("mlp_only_layers") or ())
  dense = tuple(i for i in range(n) if i in only or (i + 1) % every)
  return dict(num_experts=hf.get("num_experts") or hf.get("num_local_experts"),
              top_k=hf["num_experts_per_tok"], intermediate_size=hf["moe_intermediate_size"],
              norm_topk_prob=bool(hf.get("norm_topk_prob", family == "qwen3_moe")),
              shared_intermediate_size=hf.get("shared_expert_intermediate_size", 0) or 0,
              dense_layers=dense)


def from_hf_config(hf: Mapping[str, Any], *, source: str = "config.json",
                   **overrides) -> ModelConfig:
  """Translates a Hugging Face config dict; unsupported features are errors."""
  family = family_of(hf, source)
  act = hf.get("hidden_act", hf.get("hidden_activation", "silu"))
  if act not in _ACTIVATIONS:
    raise BadInput(f"{source}: hidden_act={act!r}; supported: {sorted(_ACTIVATIONS)}")
  for name in ("mlp_bias", "attn_logit_softcapping", "final_logit_softcapping",
               "use_bidirectional_attention"):
    if hf.get(name):
      raise BadInput(f"{source}: {name}={hf[name]!r} is not supported")
  missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                         "num_attention_heads") if k not in hf]
  if missing:
    raise BadInput(f"{source}: missing {missing}")
  n = hf["num_hidden_layers"]
  kinds = _layer_kinds(hf, family, n, source)
  params = hf.get("rope_parameters") or hf.get("rope_scaling")
  local_theta = 0.0
  if family == "gemma3_text":
    if params and "full_attention" in params:  # transformers 5: one dict per layer type
      local_theta, local_scaling = _rope(params.get("sliding_attention"), {}, source,
                                         "sliding layers' rope")
      if local_scaling is not None:
        raise BadInput(f"{source}: scaled rope on sliding layers is not supported")
      params = params["full_attention"]
    else:
      local_theta = float(hf.get("rope_local_base_freq", 10000.0))
  theta, scaling = _rope(params, hf, source)
  fields = dict(FAMILIES[family][1])
  fields["qkv_bias"] = fields.get("qkv_bias", False) or bool(hf.get("attention_bias", False))
  dtype = hf.get("dtype") or hf.get("torch_dtype") or "float32"
  dtype = dtype if dtype in _DTYPES else "float32"
  kwargs = dict(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
      intermediate_size=hf["intermediate_size"], num_layers=n,
      num_heads=hf["num_attention_heads"],
      num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
      head_dim=hf.get("head_dim") or 0, rope_theta=theta, rope_scaling=scaling,
      rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
      tie_embeddings=bool(hf.get("tie_word_embeddings", family == "gemma3_text")),
      max_seq_len=hf.get("max_position_embeddings", 2048), param_dtype=dtype, dtype=dtype,
      attention_pattern=kinds, sliding_window=hf.get("sliding_window") or 0,
      mlp_act=_ACTIVATIONS[act], moe=_moe(hf, family, n), family=family,
      query_scale=float(hf.get("query_pre_attn_scalar") or 0.0) if family == "gemma3_text"
      else 0.0,
      local_rope_theta=local_theta, **fields)
  if "sliding" not in kinds:
    kwargs["sliding_window"] = 0
  kwargs.update(overrides)
  try:
    return ModelConfig(**kwargs)
  except (ValueError, TypeError, KeyError) as e:
    raise BadInput(f"{source}: {e}") from None


def export_family(cfg: ModelConfig) -> str:
  """The model_type `cfg` is written as."""
  if cfg.family:
    return cfg.family
  if cfg.moe is not None or cfg.qk_norm != "none" or cfg.norm_layout != "pre":
    raise ValueError("this model's switches match no Hugging Face family; set "
                     "ModelConfig.family")
  return "qwen2" if cfg.qkv_bias else "llama"


def to_hf_config(cfg: ModelConfig, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """The config.json for `cfg`; fields of `base` we do not model are kept as they were."""
  family = export_family(cfg)
  out = dict(base or {})
  out.update(architectures=[FAMILIES[family][0]], model_type=family)
  if family == "qwen2" and not cfg.qkv_bias:
    raise ValueError("a qwen2 config always has q/k/v biases; use a llama base for qkv_bias=False")
  if family != "gemma3_text":
    out["hidden_act"] = "silu" if cfg.mlp_act == "silu" else "gelu_pytorch_tanh"
  else:
    out["hidden_activation"] = "gelu_pytorch_tanh" if cfg.mlp_act == "gelu_tanh" else "silu"
    scalar = cfg.query_scale or cfg.head_dim  # transformers' config types it as an int
    out["query_pre_attn_scalar"] = int(scalar) if float(scalar).is_integer() else scalar
  if family not in ("qwen2", "qwen2_moe"):
    out["attention_bias"] = cfg.qkv_bias
  rope = {"rope_theta": cfg.rope_theta, "rope_type": "default"}
  if cfg.rope_scaling is not None:
    rope.update(dict(cfg.rope_scaling))
  for stale in ("rope_scaling", "rope_theta", "rope_local_base_freq", "use_sliding_window",
                "max_window_layers", "sliding_window_pattern", "_sliding_window_pattern",
                "num_local_experts"):
    out.pop(stale, None)
  if family == "gemma3_text":
    rope = {"full_attention": rope, "sliding_attention": {
        "rope_type": "default", "rope_theta": cfg.local_rope_theta or cfg.rope_theta}}
  types = {"dense": "full_attention", "sliding": "sliding_attention"}
  if set(cfg.layer_kinds) - set(types):
    raise ValueError(f"layers {sorted(set(cfg.layer_kinds) - set(types))} have no Hugging "
                     "Face equivalent")
  out.update(
      vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
      intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
      num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
      head_dim=cfg.head_dim, rope_parameters=rope, rms_norm_eps=cfg.rms_norm_eps,
      tie_word_embeddings=cfg.tie_embeddings, max_position_embeddings=cfg.max_seq_len,
      dtype=cfg.param_dtype, layer_types=[types[k] for k in cfg.layer_kinds],
      sliding_window=cfg.sliding_window or None)
  if family in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
    out["use_sliding_window"] = "sliding" in cfg.layer_kinds
  if cfg.moe is not None:
    moe = cfg.moe
    out.update(num_experts=moe.num_experts, num_experts_per_tok=moe.top_k,
               moe_intermediate_size=moe.intermediate_size, norm_topk_prob=moe.norm_topk_prob,
               decoder_sparse_step=1, mlp_only_layers=list(moe.dense_layers))
    if family == "qwen2_moe":
      out["shared_expert_intermediate_size"] = moe.shared_intermediate_size
  return out


def read_hf_config(path) -> dict[str, Any]:
  """A checkpoint's config.json; one that does not parse is one line naming it."""
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise BadInput(f"{path}: not valid JSON ({e})") from None
