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

from rlcode.errors import BadInput
from rlcode.kernels.spec import NSAConfig
from rlcode.models.lora import LoRAConfig

# Hugging Face `architectures` entries the decoder implements exactly.
SUPPORTED_ARCHITECTURES = ("Qwen2ForCausalLM", "LlamaForCausalLM")
LAYER_KINDS = ("dense", "sliding", "document", "nsa")
REMAT_NAMES = ("none", "full", "dots", "offload")
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
    attention_pattern: the attention kind of each layer, repeated over the
      layers: "dense", "sliding" (window `sliding_window`), "document" (packed
      documents by segment ids, the last one the query) or "nsa" (DeepSeek's
      native sparse attention, sizes `nsa`). ("sliding",) * 3 + ("dense",)
      is sliding everywhere with a dense layer every 4th.
    sliding_window: w of the sliding layers: a query sees itself and the w-1
      tokens before it.
    nsa: a kernels.NSAConfig (or a dict of its fields) for the NSA layers.
    document_positions: with segment ids, "restart" counts positions from 0
      in each document (so a document's keys do not depend on what precedes
      it, which is what lets its KV be cached alone) or "continue".
    remat: what each block keeps for the backward pass (rlcode.models.stack):
      "none", "full", "dots" or "offload".
    scan_layers: the blocks' parameters stacked on a `layers` axis and scanned.
    logits_chunk: positions per chunk of the output layer when training computes
      log-probabilities (None: all at once): no [rows, tokens, vocab] float32 array exists
      in the forward or the backward (rlcode.rl.logprobs).
    lora: a models.lora.LoRAConfig (or a dict of its fields), or None.
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
  attention_pattern: tuple[str, ...] = ("dense",)
  sliding_window: int = 0
  nsa: Any = None
  document_positions: str = "restart"
  remat: str = "none"
  scan_layers: bool = False
  logits_chunk: int | None = None
  lora: Any = None

  def __post_init__(self):
    object.__setattr__(self, "attention_pattern", tuple(self.attention_pattern))
    if isinstance(self.lora, Mapping):
      object.__setattr__(self, "lora", LoRAConfig(**self.lora))
    if self.lora is not None and not isinstance(self.lora, LoRAConfig):
      raise ValueError(f"ModelConfig.lora={self.lora!r}: a LoRAConfig, its fields or None")
    if self.remat not in REMAT_NAMES:
      raise ValueError(f"ModelConfig.remat={self.remat!r}; expected one of {REMAT_NAMES}")
    if self.logits_chunk is not None and self.logits_chunk < 1:
      raise ValueError(f"ModelConfig.logits_chunk={self.logits_chunk} must be >= 1 (None: "
                       "all positions at once)")
    if isinstance(self.nsa, Mapping):
      object.__setattr__(self, "nsa", NSAConfig(**self.nsa))
    unknown = set(self.attention_pattern) - set(LAYER_KINDS)
    if not self.attention_pattern or unknown:
      raise ValueError(f"ModelConfig.attention_pattern={self.attention_pattern}: kinds must be "
                       f"from {LAYER_KINDS}")
    if "sliding" in self.attention_pattern and self.sliding_window < 1:
      raise ValueError("ModelConfig.sliding_window must be >= 1 when a layer is 'sliding'")
    if "nsa" in self.attention_pattern and not isinstance(self.nsa, NSAConfig):
      raise ValueError("ModelConfig.nsa must be set (an NSAConfig or its fields) when a layer "
                       "is 'nsa'")
    if self.document_positions not in ("restart", "continue"):
      raise ValueError(f"ModelConfig.document_positions={self.document_positions!r}; "
                       "expected 'restart' or 'continue'")
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
    if self.lora is not None and self.lora.base_dtype not in (None, *_DTYPES):
      raise ValueError(f"model.lora.base_dtype={self.lora.base_dtype!r}; expected one of "
                       f"{sorted(_DTYPES)} or None")
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

  @property
  def jnp_base_dtype(self):
    """The storage dtype of every parameter but LoRA adapters (lora.base_dtype if set)."""
    if self.lora is not None and self.lora.base_dtype is not None:
      return _DTYPES[self.lora.base_dtype]
    return self.jnp_param_dtype

  def layer_kind(self, i: int) -> str:
    return self.attention_pattern[i % len(self.attention_pattern)]

  @property
  def layer_kinds(self) -> tuple[str, ...]:
    return tuple(self.layer_kind(i) for i in range(self.num_layers))

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
    raise BadInput(f"{source}: architectures={archs} (model_type={model_type!r}) is not "
                     f"supported; supported: {list(SUPPORTED_ARCHITECTURES)}")
  if hf.get("hidden_act", "silu") != "silu":
    raise BadInput(f"{source}: hidden_act={hf['hidden_act']!r}; only 'silu' (SwiGLU) is supported")
  if hf.get("mlp_bias"):
    raise BadInput(f"{source}: mlp_bias=true is not supported")
  if hf.get("use_sliding_window"):
    raise BadInput(f"{source}: use_sliding_window=true is not supported by the HF loader")
  rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
  rope_theta = hf.get("rope_theta", rope.pop("rope_theta", 10000.0))
  rope.pop("rope_theta", None)
  rope_type = rope.get("rope_type", rope.get("type", "default"))
  if rope_type == "default":
    rope_scaling = None
  elif rope_type == "llama3":
    wanted = ("factor", "low_freq_factor", "high_freq_factor",
              "original_max_position_embeddings")
    missing = [k for k in wanted if k not in rope]
    if missing:
      raise BadInput(f"{source}: rope type 'llama3' needs {missing} in its rope parameters")
    rope_scaling = {k: rope[k] for k in wanted}
    rope_scaling["rope_type"] = "llama3"
  else:
    raise BadInput(f"{source}: rope type {rope_type!r} is not supported "
                     "(supported: 'default', 'llama3')")
  qkv_bias = model_type == "qwen2" or bool(hf.get("attention_bias", False))
  dtype = hf.get("dtype") or hf.get("torch_dtype") or "float32"
  missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                         "num_attention_heads") if k not in hf]
  if missing:
    raise BadInput(f"{source}: missing {missing}")
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
  try:
    return ModelConfig(**kwargs)
  except (ValueError, TypeError) as e:
    raise BadInput(f"{source}: {e}") from None


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
  """A checkpoint's config.json; one that does not parse is one line naming it."""
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise BadInput(f"{path}: not valid JSON ({e})") from None
