"""The decoder's configuration, and its translation from Hugging Face config.json.

This module knows which Hugging Face architectures we can load and says clearly
which fields we do not support; it must not touch weights (see hf.py).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

# Hugging Face `architectures` entries the decoder implements exactly.
SUPPORTED_ARCHITECTURES = ("Qwen2ForCausalLM", "LlamaForCausalLM")
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """A Qwen2/Llama-family decoder.

  Attributes:
    vocab_size: rows of the embedding table (may exceed the tokenizer's).
    hidden_size: model width E.
    intermediate_size: SwiGLU width F.
    num_layers: decoder blocks.
    num_heads: query heads H.
    num_kv_heads: key/value heads K (grouped-query attention; H % K == 0).
    head_dim: D; defaults to hidden_size // num_heads.
    rope_theta: RoPE base.
    rope_scaling: None or a Llama-3 style dict (rope_type "llama3": factor,
      low_freq_factor, high_freq_factor, original_max_position_embeddings).
    rms_norm_eps: RMSNorm epsilon.
    qkv_bias: biases on the q/k/v projections (Qwen2: True; Llama: False).
    tie_embeddings: the output projection is the embedding table transposed.
    max_seq_len: the context length; longer inputs are an error.
    param_dtype, dtype: storage and compute dtypes ("float32", "bfloat16").
    attn_impl: the kernels.attention implementation ("auto", "xla", ...).
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int = 0
  rope_theta: float = 10000.0
  rope_scaling: Mapping[str, Any] | None = None
  rms_norm_eps: float = 1e-6
  qkv_bias: bool = False
  tie_embeddings: bool = False
  max_seq_len: int = 2048
  param_dtype: str = "float32"
  dtype: str = "float32"
  attn_impl: str = "auto"

  def __post_init__(self):
    if self.head_dim == 0:
      object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
    if self.rope_scaling is not None:
      object.__setattr__(self, "rope_scaling", _FrozenDict(self.rope_scaling))
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                 "num_heads", "num_kv_heads", "head_dim", "max_seq_len"):
      if getattr(self, name) <= 0:
        raise ValueError(f"ModelConfig.{name}={getattr(self, name)} must be positive")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"ModelConfig: num_heads={self.num_heads} is not a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")
    for name in ("param_dtype", "dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r}; "
                         f"expected one of {sorted(_DTYPES)}")

  @property
  def jnp_param_dtype(self):
    return _DTYPES[self.param_dtype]

  @property
  def jnp_dtype(self):
    return _DTYPES[self.dtype]

  def replace(self, **changes) -> ModelConfig:
    return dataclasses.replace(self, **changes)

  def num_params(self) -> int:
    e, f, h, k, d = (self.hidden_size, self.intermediate_size, self.num_heads,
                     self.num_kv_heads, self.head_dim)
    attn = e * h * d * 2 + e * k * d * 2 + (h * d + 2 * k * d) * self.qkv_bias
    layer = attn + 3 * e * f + 2 * e
    head = 0 if self.tie_embeddings else self.vocab_size * e
    return self.num_layers * layer + self.vocab_size * e + e + head


class _FrozenDict(dict):
  """A hashable dict, so that a config holding one can be a jit static argument."""

  def __hash__(self):
    return hash(tuple(sorted(self.items())))

  def _immutable(self, *args, **kwargs):
    raise TypeError("ModelConfig.rope_scaling is immutable")

  __setitem__ = __delitem__ = update = pop = clear = setdefault = _immutable


def from_hf_config(hf: Mapping[str, Any], *, source: str = "config.json",
                   **overrides) -> ModelConfig:
  """Translates a Hugging Face config dict; unsupported features are errors."""
  archs = hf.get("architectures") or []
  model_type = hf.get("model_type")
  if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
    raise ValueError(f"{source}: architectures={archs} (model_type={model_type!r}) is not "
                     f"supported; supported: {list(SUPPORTED_ARCHITECTURES)}")
  if hf.get("hidden_act", "silu") != "silu":
    raise ValueError(f"{source}: hidden_act={hf['hidden_act']!r}; only 'silu' (SwiGLU) is supported")
  if hf.get("mlp_bias"):
    raise ValueError(f"{source}: mlp_bias=true is not supported")
  if hf.get("use_sliding_window"):
    raise ValueError(f"{source}: use_sliding_window=true is not supported by the HF loader")
  rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
  rope_theta = hf.get("rope_theta", rope.pop("rope_theta", 10000.0))
  rope.pop("rope_theta", None)
  rope_type = rope.get("rope_type", rope.get("type", "default"))
  if rope_type == "default":
    rope_scaling = None
  elif rope_type == "llama3":
    rope_scaling = {k: rope[k] for k in ("factor", "low_freq_factor", "high_freq_factor",
                                         "original_max_position_embeddings")}
    rope_scaling["rope_type"] = "llama3"
  else:
    raise ValueError(f"{source}: rope type {rope_type!r} is not supported "
                     "(supported: 'default', 'llama3')")
  qkv_bias = model_type == "qwen2" or bool(hf.get("attention_bias", False))
  dtype = hf.get("dtype") or hf.get("torch_dtype") or "float32"
  kwargs = dict(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
      intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"],
      num_heads=hf["num_attention_heads"],
      num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
      head_dim=hf.get("head_dim") or 0, rope_theta=float(rope_theta),
      rope_scaling=rope_scaling, rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
      qkv_bias=qkv_bias, tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      max_seq_len=hf.get("max_position_embeddings", 2048),
      param_dtype=dtype if dtype in _DTYPES else "float32",
      dtype=dtype if dtype in _DTYPES else "float32")
  kwargs.update(overrides)
  return ModelConfig(**kwargs)


def to_hf_config(cfg: ModelConfig, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """The config.json for `cfg`; fields of `base` we do not model are kept as they were."""
  out = dict(base or {})
  if not out:
    out.update(architectures=["Qwen2ForCausalLM" if cfg.qkv_bias else "LlamaForCausalLM"],
               model_type="qwen2" if cfg.qkv_bias else "llama", hidden_act="silu")
  if out.get("model_type") == "llama":
    out["attention_bias"] = cfg.qkv_bias
  elif not cfg.qkv_bias:
    raise ValueError("a qwen2 config always has q/k/v biases; use a llama base for qkv_bias=False")
  rope = {"rope_theta": cfg.rope_theta, "rope_type": "default"}
  if cfg.rope_scaling is not None:
    rope.update(dict(cfg.rope_scaling))
  out.pop("rope_scaling", None)
  out.pop("rope_theta", None)
  out.update(
      vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
      intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
      num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
      head_dim=cfg.head_dim, rope_parameters=rope, rms_norm_eps=cfg.rms_norm_eps,
      tie_word_embeddings=cfg.tie_embeddings, max_position_embeddings=cfg.max_seq_len,
      dtype=cfg.param_dtype)
  return out


def read_hf_config(path) -> dict[str, Any]:
  with open(path) as f:
    return json.load(f)
