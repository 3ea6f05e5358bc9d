"""NSA's dense-mask references: each branch and the block scores, built the obvious way.

The truth `kernels.nsa`'s blockwise XLA and Pallas versions are tested
against. They build [T, nc] and [T, S] masks, so they are for small sizes
only; softmax under a mask is masked attention's reference
(`kernels.flash.reference.masked_attention`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rlcode.kernels.flash.reference import NEG_INF, masked_attention
from rlcode.kernels.spec import NSAConfig

def compressed_mask(cfg: NSAConfig, t: int, nc: int) -> jax.Array:
  """Boolean [T, nc]: query t sees compressed token i iff the block ends at or before t."""
  end = jnp.arange(nc) * cfg.stride_cmp + cfg.block_cmp - 1
  return end[None, :] <= jnp.arange(t)[:, None]


def compressed_attention(q, k_cmp, v_cmp, cfg: NSAConfig, *, scale=None):
  """The compressed branch: (out, lse) of q over the compressed keys, dense."""
  b, t = q.shape[:2]
  m = jnp.broadcast_to(compressed_mask(cfg, t, k_cmp.shape[1]), (b, t, k_cmp.shape[1]))
  return masked_attention(q, k_cmp, v_cmp, m, scale=scale)


def selection_scores(q, k_cmp, cfg: NSAConfig, s: int, *, scale=None) -> jax.Array:
  """Block importance [B, T, K, nsel] (the paper's eqs. 8-10), dense.

  p_cmp = softmax of q over the visible compressed keys, per head; summed over
  the query heads of each KV group; mapped onto selection blocks by eq. 9:
  p_slc[j] = sum_{m < l'/d} sum_{n < l/d} p_cmp[(l'/d) j - m - n] (terms whose
  index falls outside [0, nc) are absent).
  """
  b, t, h, d = q.shape
  nc, kh = k_cmp.shape[1], k_cmp.shape[2]
  scale = d ** -0.5 if scale is None else scale
  qg = q.reshape(b, t, kh, h // kh, d).astype(jnp.float32)
  logits = jnp.einsum("btkgd,bckd->btkgc", qg, k_cmp.astype(jnp.float32)) * scale
  m = compressed_mask(cfg, t, nc)[None, :, None, None, :]
  probs = jax.nn.softmax(jnp.where(m, logits, NEG_INF), axis=-1)
  probs = jnp.where(m, probs, 0.0).sum(axis=3)  # [B, T, K, nc]; no-key rows stay 0
  nsel = cfg.num_blocks(s)
  ratio, span = cfg.block_sel // cfg.stride_cmp, cfg.block_cmp // cfg.stride_cmp
  weights = np.zeros((nc, nsel), np.float32)
  for j in range(nsel):
    for mm in range(ratio):
      for n in range(span):
        i = ratio * j - mm - n
        if 0 <= i < nc:
          weights[i, j] += 1.0
  return jnp.einsum("btkc,cj->btkj", probs, weights)


def selected_mask(indices, cfg: NSAConfig, s: int) -> jax.Array:
  """Boolean [B, K, T, S] from block indices [B, T, K, n] (-1 = no block).

  Query t sees key j iff j's selection block is among its indices and j <= t.
  """
  t = indices.shape[1]
  block_of_key = jnp.arange(s) // cfg.block_sel
  chosen = (indices[..., None] == block_of_key).any(axis=3)  # [B, T, K, S]
  causal = jnp.arange(s)[None, :] <= jnp.arange(t)[:, None]
  return chosen.transpose(0, 2, 1, 3) & causal[None, None]


def selected_attention(q, k, v, indices, cfg: NSAConfig, *, scale=None):
  """The selected branch: (out, lse) over the keys of the selected blocks, dense."""
  return masked_attention(q, k, v, selected_mask(indices, cfg, k.shape[1]), scale=scale)
