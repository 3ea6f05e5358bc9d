"""Rotary position embeddings (rotate-half convention, as Llama and Qwen2), in float32."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp


def frequencies(head_dim: int, theta: float,
                scaling: Mapping[str, Any] | None = None) -> jax.Array:
  """Inverse frequencies [D/2], with Llama-3 scaling when `scaling` says so."""
  inv = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  if scaling is None:
    return inv
  factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
  old = scaling["original_max_position_embeddings"]
  wavelen = 2 * math.pi / inv
  scaled = jnp.where(wavelen > old / low, inv / factor, inv)
  smooth = (old / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = (wavelen >= old / high) & (wavelen <= old / low)
  return jnp.where(medium, smoothed, scaled)


def table(positions_bt: jax.Array, inv_freq: jax.Array) -> tuple[jax.Array, jax.Array]:
  """cos and sin [B, T, 1, D] for the positions; compute once, apply in every layer."""
  angles = positions_bt.astype(jnp.float32)[..., None] * inv_freq  # [B, T, D/2]
  angles = jnp.concatenate([angles, angles], -1)[:, :, None, :]
  return jnp.cos(angles), jnp.sin(angles)


def apply(x_bthd: jax.Array, rope: tuple[jax.Array, jax.Array]) -> jax.Array:
  cos, sin = rope
  x = x_bthd.astype(jnp.float32)
  x1, x2 = jnp.split(x, 2, axis=-1)
  return (x * cos + jnp.concatenate([-x2, x1], -1) * sin).astype(x_bthd.dtype)
