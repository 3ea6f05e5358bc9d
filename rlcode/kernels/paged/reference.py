"""Paged attention's reference: gather the row's pages into a dense cache, then decode's reference.

Plain and obviously right, and as costly as that: it builds the whole
[B, K, M * S, D] cache and the [T, M * S] mask. Small sizes only.
"""

from __future__ import annotations

import jax.numpy as jnp

from rlcode.kernels.decode import reference as decode_reference
from rlcode.kernels.spec import AttentionSpec


def gather(pages, page_table, lengths):
  """The dense cache [B, M * S, K, D] of pages [P, K, S, D] through page_table [B, M].

  Entries at positions >= lengths[b] are zeros: whatever the pool holds there
  (another row's data, a scratch page, NaN) must not reach the result, and a
  masked NaN still poisons a probability-weighted sum (0 * NaN).
  """
  b, m = page_table.shape
  _, kh, s, d = pages.shape
  dense = pages[page_table].transpose(0, 1, 3, 2, 4).reshape(b, m * s, kh, d)
  valid = jnp.arange(m * s)[None, :] < lengths[:, None]
  return jnp.where(valid[:, :, None, None], dense, 0)


def attention(q, k_pages, v_pages, page_table, spec: AttentionSpec, *, lengths, q_offset,
              scale=None):
  """q [B, T, H, D] against the pages of each row: (out [B, T, H, D], lse [B, T, H])."""
  k = gather(k_pages, page_table, lengths)
  v = gather(v_pages, page_table, lengths)
  return decode_reference.attention(q, k, v, spec, lengths=lengths, q_offset=q_offset,
                                    scale=scale)
