"""Low-rank adapters (LoRA, Hu et al. 2021) on the decoder's projections.

A targeted projection y = x W becomes y = x W + (alpha / rank) * dropout(x) A B with A
[in, rank] and B [rank, out]; B starts at zero, so an adapted model computes exactly
what its base does until B moves. The adapters are `LoRAParam`s (a kind of nnx.Param,
so they shard and checkpoint like parameters); training with `model.lora` set
differentiates and optimises them alone (`trainable`), and the base may be stored in a
narrower dtype than the adapters (`base_dtype`).

Targets are named as Hugging Face names the projections (PEFT's `target_modules`,
less "_proj"): q, k, v, o (attention), gate, up, down (the MLP). `merged` folds the
adapters into the base weights, for samplers that want plain matmuls and for exporting
merged Hugging Face weights; rlcode.models.hf writes and reads PEFT adapter directories.

Dropout needs a key: `dropout_key(key)` makes one current while a loss is traced (the
update derives it from its step); without one, dropout is off (evaluation, sampling).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from rlcode.models.dense import dense

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
  """Attributes:
    rank: r, the adapters' inner width.
    alpha: the scale numerator: deltas are multiplied by alpha / rank.
    dropout: dropout on an adapter's input while training (0: none).
    targets: the adapted projections, from TARGETS.
    base_dtype: storage dtype of the frozen base weights ("bfloat16" halves them),
      or None for the model's param dtype. The adapters keep the param dtype.
  """

  rank: int = 16
  alpha: float = 32.0
  dropout: float = 0.0
  targets: tuple[str, ...] = TARGETS
  base_dtype: str | None = None

  def __post_init__(self):
    object.__setattr__(self, "targets", tuple(self.targets))
    if self.rank < 1:
      raise ValueError(f"model.lora.rank={self.rank} must be >= 1")
    unknown = sorted(set(self.targets) - set(TARGETS))
    if unknown or not self.targets:
      raise ValueError(f"model.lora.targets={self.targets}: name at least one of {TARGETS}")
    if not 0.0 <= self.dropout < 1.0:
      raise ValueError(f"model.lora.dropout={self.dropout} must be in [0, 1)")

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


class LoRAParam(nnx.Param):
  """An adapter's A or B: trained while the base (every other Param) is frozen."""


# What is trained: the adapters when a model has them, else every parameter.
def trainable(cfg) -> type:
  return LoRAParam if getattr(cfg, "lora", None) is not None else nnx.Param


def adapter_rngs(rngs: nnx.Rngs) -> nnx.Rngs:
  """A stream for the adapters' draws, derived from `rngs` without drawing from it: a model
  with adapters gets exactly the base weights of the same model without them."""
  stream = rngs.params
  return nnx.Rngs(params=jax.random.fold_in(stream.key[...], 0x10A))


class Adapter(nnx.Module):
  """One projection's A [*in, rank] and B [rank, *out] (in and out may be several axes)."""

  def __init__(self, lora: LoRAConfig, in_shape, in_axes, out_shape, out_axes, dtype,
               *, rngs: nnx.Rngs):
    fan_in = math.prod(in_shape)
    bound = 1.0 / math.sqrt(fan_in)  # PEFT's kaiming_uniform(a=sqrt(5)) on A
    self.a = LoRAParam(jax.random.uniform(rngs.params(), (*in_shape, lora.rank), dtype,
                                          -bound, bound), axes=(*in_axes, "lora"))
    self.b = LoRAParam(jnp.zeros((lora.rank, *out_shape), dtype), axes=("lora", *out_axes))
    self.scale, self.dropout = lora.scale, lora.dropout
    self.contract = len(in_shape)

  def __call__(self, x, dtype, site: int):
    """scale * dropout(x) A B; x [..., *in] -> [..., *out] in `dtype`."""
    key = _KEY.get()
    if self.dropout > 0 and key is not None:
      keep = jax.random.bernoulli(jax.random.fold_in(key, site), 1.0 - self.dropout, x.shape)
      x = jnp.where(keep, x / (1.0 - self.dropout), 0.0).astype(x.dtype)
    xa = dense(x, self.a[...].astype(dtype), contract=self.contract)
    return dense(xa, (self.scale * self.b[...]).astype(dtype))

  def delta_weight(self) -> jax.Array:
    """scale * A B as a weight of shape (*in, *out), in float32."""
    a = self.a[...].astype(jnp.float32)
    b = self.b[...].astype(jnp.float32)
    return self.scale * jnp.tensordot(a, b, axes=1)


_KEY: contextvars.ContextVar = contextvars.ContextVar("rlcode_lora_key", default=None)


@contextlib.contextmanager
def dropout_key(key):
  """Makes `key` the adapters' dropout key inside the block (None: no dropout)."""
  token = _KEY.set(key)
  try:
    yield
  finally:
    _KEY.reset(token)


def layer_key(index):
  """Within a scanned or looped layer: the current key folded with the layer's index."""
  key = _KEY.get()
  return None if key is None else jax.random.fold_in(key, index)


@contextlib.contextmanager
def in_layer(index):
  token = _KEY.set(layer_key(index))
  try:
    yield
  finally:
    _KEY.reset(token)
