"""Rotary position embeddings (rotate-half convention, as Llama and Qwen2), in float32.

The frequency schedules are Hugging Face's `rope_type`s, computed as transformers does
(`modeling_rope_utils`): "default", "linear" (positions divided by `factor`), "llama3"
(Llama 3's smoothed band scaling) and "yarn" (NTK-by-parts interpolation with its
attention factor on cos and sin). "dynamic" and "longrope" change the frequencies with the
sequence's length at run time, which one compiled step with a KV cache cannot follow;
they are refused by the config loader.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def frequencies(head_dim: int, theta: float,
                scaling: Mapping[str, Any] | None = None) -> jax.Array:
  """Inverse frequencies [D/2] under the scaling `scaling` names (None: the default)."""
  inv = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  kind = "default" if scaling is None else scaling.get("rope_type", "llama3")
  if kind == "default":
    return inv
  if kind == "linear":
    return inv / scaling["factor"]
  if kind == "yarn":
    return _yarn(inv, head_dim, theta, scaling)
  if kind != "llama3":
    raise ValueError(f"rope_type {kind!r}; expected one of {ROPE_TYPES}")
  factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
  old = scaling["original_max_position_embeddings"]
  wavelen = 2 * math.pi / inv
  scaled = jnp.where(wavelen > old / low, inv / factor, inv)
  smooth = (old / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = (wavelen >= old / high) & (wavelen <= old / low)
  return jnp.where(medium, smoothed, scaled)


def attention_factor(scaling: Mapping[str, Any] | None) -> float:
  """What cos and sin are multiplied by: YaRN's 0.1 ln(factor) + 1 (or its configured
  value), 1 otherwise."""
  if scaling is None or scaling.get("rope_type") != "yarn":
    return 1.0
  if scaling.get("attention_factor") is not None:
    return float(scaling["attention_factor"])
  factor = scaling["factor"]
  mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
  if mscale and mscale_all:
    return _mscale(factor, mscale) / _mscale(factor, mscale_all)
  return _mscale(factor)


def _mscale(factor: float, mscale: float = 1.0) -> float:
  return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn(inv: jax.Array, dim: int, base: float, scaling: Mapping[str, Any]) -> jax.Array:
  """NTK-by-parts: high-frequency dimensions keep their frequency (extrapolate), low ones
  are divided by `factor` (interpolate), with a linear ramp between the two bounds."""
  factor = scaling["factor"]
  old = scaling["original_max_position_embeddings"]
  beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

  def correction_dim(rotations):
    return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(base))

  low, high = correction_dim(beta_fast), correction_dim(beta_slow)
  if scaling.get("truncate", True):
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, dim - 1)
  if low == high:
    high += 0.001
  ramp = jnp.clip((jnp.arange(dim // 2, dtype=jnp.float32) - low) / (high - low), 0, 1)
  extrapolate = 1 - ramp
  return inv / factor * (1 - extrapolate) + inv * extrapolate


def table(positions_bt: jax.Array, inv_freq: jax.Array,
          factor: float = 1.0) -> tuple[jax.Array, jax.Array]:
  """cos and sin [B, T, 1, D] for the positions (times `factor`, YaRN's attention factor);
  compute once, apply in every layer."""
  angles = positions_bt.astype(jnp.float32)[..., None] * inv_freq  # [B, T, D/2]
  angles = jnp.concatenate([angles, angles], -1)[:, :, None, :]
  if factor == 1.0:
    return jnp.cos(angles), jnp.sin(angles)
  return jnp.cos(angles) * factor, jnp.sin(angles) * factor


def apply(x_bthd: jax.Array, rope: tuple[jax.Array, jax.Array]) -> jax.Array:
  cos, sin = rope
  x = x_bthd.astype(jnp.float32)
  x1, x2 = jnp.split(x, 2, axis=-1)
  return (x * cos + jnp.concatenate([-x2, x1], -1) * sin).astype(x_bthd.dtype)
