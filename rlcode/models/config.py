"""The decoder's configuration: one dataclass with a switch per family difference.

Qwen2, Llama, Mistral, Qwen3, Qwen2/Qwen3-MoE, Gemma 3, OLMo 2 and Phi-3 are one decoder
here; what differs between them is a field: q/k norms, where the norms sit, Gemma's
(1 + w) norm scale and embedding scale, the MLP's activation, the attention scale, the
rope of the local layers, mixture-of-experts MLPs. rlcode.models.hf_config translates
Hugging Face config.json files to and from it; this module must not touch weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from rlcode.kernels.spec import NSAConfig
from rlcode.models import rope as rope_lib
from rlcode.models.lora import LoRAConfig

LAYER_KINDS = ("dense", "sliding", "document", "nsa")
REMAT_NAMES = ("none", "full", "dots", "offload")
QK_NORMS = ("none", "head", "full")
NORM_LAYOUTS = ("pre", "post", "sandwich")
MLP_ACTS = ("silu", "gelu_tanh")
MOE_IMPLS = ("auto", "ragged", "tiled", "dense")
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class MoEConfig:
  """Mixture-of-experts MLPs (rlcode.models.moe): a router picks top_k of num_experts
  SwiGLU experts per token.

  Attributes:
    num_experts: X, the routed experts of an MoE layer.
    top_k: experts per token.
    intermediate_size: each expert's SwiGLU width.
    norm_topk_prob: the top-k router probabilities renormalised to sum to 1 (Qwen3-MoE);
      False keeps them as the softmax gave them (Qwen2-MoE).
    shared_intermediate_size: width of an always-on shared expert, gated by a sigmoid of
      its own router (Qwen2-MoE); 0: none.
    dense_layers: layers whose MLP is a plain SwiGLU of the model's intermediate_size
      (Hugging Face's mlp_only_layers and decoder_sparse_step).
    impl: the grouped matmul over tokens sorted by expert: "ragged" (jax.lax.ragged_dot,
      the accelerators' grouped GEMM), "tiled" (each expert's rows padded to whole tiles, a
      scan of one matmul a tile: XLA:CPU's fast path), "dense" (every expert on every token,
      masked: the reference); "auto": ragged on GPU and TPU, tiled on CPU.
    tile: rows per tile of the tiled matmul.
    aux_loss_weight: weight of the Switch load-balancing loss added to training losses
      (0: off, the RL default: it pulls the policy away from its reward).
  """

  num_experts: int
  top_k: int
  intermediate_size: int
  norm_topk_prob: bool = True
  shared_intermediate_size: int = 0
  dense_layers: tuple[int, ...] = ()
  impl: str = "auto"
  tile: int = 64
  aux_loss_weight: float = 0.0

  def __post_init__(self):
    object.__setattr__(self, "dense_layers", tuple(int(i) for i in self.dense_layers))
    if not 1 <= self.top_k <= self.num_experts:
      raise ValueError(f"model.moe: top_k={self.top_k} must be in [1, num_experts="
                       f"{self.num_experts}]")
    for name in ("intermediate_size", "tile"):
      if getattr(self, name) < 1:
        raise ValueError(f"model.moe.{name}={getattr(self, name)} must be >= 1")
    if self.shared_intermediate_size < 0 or self.aux_loss_weight < 0:
      raise ValueError("model.moe: shared_intermediate_size and aux_loss_weight must be >= 0")
    if self.impl not in MOE_IMPLS:
      raise ValueError(f"model.moe.impl={self.impl!r}; expected one of {MOE_IMPLS}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """A decoder of the Qwen2/Llama lineage (with the switches of the families above).

  Attributes:
    vocab_size: rows of the embedding table (may exceed the tokenizer's).
    hidden_size: model width E.
    intermediate_size: SwiGLU width F.
    num_layers: decoder blocks.
    num_heads: query heads H.
    num_kv_heads: key/value heads K (grouped-query attention; H % K == 0).
    head_dim: D; defaults to hidden_size // num_heads.
    rope_theta: RoPE base.
    rope_scaling: None or a Hugging Face rope parameters dict whose rope_type is
      "linear" (factor), "llama3" (factor, low_freq_factor, high_freq_factor,
      original_max_position_embeddings) or "yarn" (factor,
      original_max_position_embeddings, optional beta_fast, beta_slow, attention_factor,
      mscale, mscale_all_dim, truncate): rlcode.models.rope.
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
    qk_norm: RMSNorm on queries and keys before rope: "head" (over each head's D: Qwen3,
      Gemma 3), "full" (over all heads' H*D and K*D: OLMo 2) or "none".
    norm_layout: "pre" (norm, sublayer, residual: Llama), "post" (sublayer, norm,
      residual: OLMo 2) or "sandwich" (norm, sublayer, norm, residual: Gemma 3).
    norm_plus_one: RMSNorm scales by (1 + w), in float32 (Gemma).
    scale_embeddings: embeddings multiplied by sqrt(hidden_size) (Gemma).
    mlp_act: the gated MLP's activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU, Gemma).
    query_scale: attention logits scaled by query_scale ** -0.5 (Gemma's
      query_pre_attn_scalar); 0: head_dim ** -0.5.
    local_rope_theta: the rope base of sliding layers, unscaled (Gemma 3's local layers);
      0: every layer uses rope_theta and rope_scaling.
    moe: a MoEConfig (or its fields): MLPs of mixture-of-experts layers; None: dense.
    family: the Hugging Face model_type exported to (rlcode.models.hf_config); "" picks
      qwen2 or llama by qkv_bias.
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
  qk_norm: str = "none"
  norm_layout: str = "pre"
  norm_plus_one: bool = False
  scale_embeddings: bool = False
  mlp_act: str = "silu"
  query_scale: float = 0.0
  local_rope_theta: float = 0.0
  moe: Any = None
  family: str = ""

  def __post_init__(self):
    object.__setattr__(self, "attention_pattern", tuple(self.attention_pattern))
    if isinstance(self.moe, Mapping):
      object.__setattr__(self, "moe", MoEConfig(**self.moe))
    if self.moe is not None and not isinstance(self.moe, MoEConfig):
      raise ValueError(f"ModelConfig.moe={self.moe!r}: a MoEConfig, its fields or None")
    for name, allowed in (("qk_norm", QK_NORMS), ("norm_layout", NORM_LAYOUTS),
                          ("mlp_act", MLP_ACTS)):
      if getattr(self, name) not in allowed:
        raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r}; expected one of "
                         f"{allowed}")
    if self.query_scale < 0 or self.local_rope_theta < 0:
      raise ValueError("ModelConfig: query_scale and local_rope_theta must be >= 0")
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
      kind = self.rope_scaling.get("rope_type", "llama3")
      if kind not in rope_lib.ROPE_TYPES:
        raise ValueError(f"ModelConfig.rope_scaling: rope_type {kind!r} is not supported "
                         f"(supported: {list(rope_lib.ROPE_TYPES)})")
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

  def is_moe_layer(self, i: int) -> bool:
    return self.moe is not None and i % self.num_layers not in self.moe.dense_layers

  @property
  def block_kinds(self) -> tuple[tuple[str, bool], ...]:
    """(attention kind, MoE MLP) of each layer: what a block's parameters look like."""
    return tuple((self.layer_kind(i), self.is_moe_layer(i)) for i in range(self.num_layers))

  def replace(self, **changes) -> ModelConfig:
    return dataclasses.replace(self, **changes)

  def num_params(self, active: bool = False) -> int:
    """Parameters (active=True: those one token uses, top_k experts of each MoE layer)."""
    e, f, h, k, d = (self.hidden_size, self.intermediate_size, self.num_heads,
                     self.num_kv_heads, self.head_dim)
    attn = e * h * d * 2 + e * k * d * 2 + (h * d + 2 * k * d) * self.qkv_bias
    norms = 2 * e * (2 if self.norm_layout == "sandwich" else 1)
    qk = {"none": 0, "head": 2 * d, "full": (h + k) * d}[self.qk_norm]
    total = 0
    for i in range(self.num_layers):
      mlp = 3 * e * f
      if self.is_moe_layer(i):
        moe = self.moe
        experts = moe.top_k if active else moe.num_experts
        mlp = experts * 3 * e * moe.intermediate_size + e * moe.num_experts
        if moe.shared_intermediate_size:
          mlp += 3 * e * moe.shared_intermediate_size + e
      total += attn + mlp + norms + qk
    head = 0 if self.tie_embeddings else self.vocab_size * e
    return total + self.vocab_size * e + e + head


class _FrozenDict(dict):
  """A hashable dict, so that a config holding one can be a jit static argument."""

  def __hash__(self):
    return hash(tuple(sorted(self.items())))

  def _immutable(self, *args, **kwargs):
    raise TypeError("ModelConfig.rope_scaling is immutable")

  __setitem__ = __delitem__ = update = pop = clear = setdefault = _immutable
