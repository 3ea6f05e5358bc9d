"""A paged KV cache: one pool of fixed-size pages per layer, and a page table per row.

    pools      k[i], v[i]: [P, K, S, D] for layer i: P pages of S positions, head-major
               inside a page (each head's keys contiguous, as decode attention reads them)
    page_table [B, M] int32: row b's position j lives in page page_table[b, j // S], at
               slot j % S
    lengths    [B] positions already cached per row
    valid      [B] how many of this call's T tokens are real; the rest (a short row in a
               chunk of prefill, a padding row) are written to page 0, which the engine
               keeps as scratch and no page table points a cached position at

Rows never own pages here: which pages a row holds, and which rows share a page (a group's
prompt, a cached prefix), is the engine's business (rlcode.engine.pages). The model only
writes the new tokens' keys and values through the table and attends through it
(`kernels.paged_attention`). This module must not know about requests or scheduling.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from rlcode.models.config import ModelConfig

SCRATCH_PAGE = 0


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PagedLayer:
  """One layer's pools with the call's page table: what an attention layer is handed."""

  k: jax.Array
  v: jax.Array
  page_table: jax.Array
  valid: jax.Array

  @property
  def page_size(self) -> int:
    return self.k.shape[2]

  def write(self, k_btkd, v_btkd, lengths_b) -> PagedLayer:
    """The pools with the T new tokens' keys and values at positions lengths + t (t <
    valid); the others go to the scratch page."""
    b, t = k_btkd.shape[:2]
    s = self.page_size
    pos = lengths_b[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
    column = jnp.minimum(pos // s, self.page_table.shape[1] - 1)
    page = jnp.take_along_axis(self.page_table, column, axis=1)
    real = jnp.arange(t, dtype=jnp.int32)[None, :] < self.valid[:, None]
    page = jnp.where(real, page, SCRATCH_PAGE)
    slot = jnp.where(real, pos % s, jnp.arange(t, dtype=jnp.int32)[None, :] % s)
    put = lambda pool, x: pool.at[page, :, slot, :].set(x.astype(pool.dtype))
    return dataclasses.replace(self, k=put(self.k, k_btkd), v=put(self.v, v_btkd))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PagedCache:
  """The pools of every layer, and the rows' page tables for one call (see the module)."""

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  page_table: jax.Array
  lengths: jax.Array
  valid: jax.Array

  @classmethod
  def zeros(cls, cfg: ModelConfig, num_pages: int, page_size: int, dtype=None) -> PagedCache:
    """Empty pools (no rows yet: the page table, lengths and valid are set per call)."""
    if "nsa" in cfg.layer_kinds:
      raise ValueError("a paged cache holds keys and values; NSA layers keep compressed "
                       "per-row state and cannot be paged")
    shape = (num_pages, cfg.num_kv_heads, page_size, cfg.head_dim)
    dtype = dtype or cfg.jnp_dtype
    zeros = tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers))
    empty = jnp.zeros((0,), jnp.int32)
    return cls(k=zeros, v=tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers)),
               page_table=jnp.zeros((0, 1), jnp.int32), lengths=empty, valid=empty)

  def layer(self, i: int) -> PagedLayer:
    return PagedLayer(self.k[i], self.v[i], self.page_table, self.valid)

  def with_layers(self, layers: list[PagedLayer]) -> PagedCache:
    """The pools the layers wrote, the rows advanced by their valid tokens."""
    return dataclasses.replace(self, k=tuple(x.k for x in layers),
                               v=tuple(x.v for x in layers),
                               lengths=self.lengths + self.valid)
