"""Dense-mask references: the truth every other implementation is tested against.

These build the full [T, S] mask and score matrix, so they are for small sizes
only. They must stay obviously correct: no tiling, no tricks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from kernels.spec import AttentionSpec, NSAConfig

NEG_INF = float("-inf")


def query_positions(batch: int, t: int, s: int, q_offset) -> jax.Array:
  """Absolute positions [B, T] of the queries in the key sequence."""
  if q_offset is None:
    q_offset = s - t  # bottom-right aligned, as FlashAttention
  q_offset = jnp.broadcast_to(jnp.asarray(q_offset, jnp.int32), (batch,))
  return q_offset[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]


def mask(spec: AttentionSpec, batch: int, t: int, s: int, *, q_offset=None,
         kv_lengths=None, segment_ids=None, kv_segment_ids=None) -> jax.Array:
  """Boolean [B, T, S]: True where query i may attend key j."""
  qpos = query_positions(batch, t, s, q_offset)[:, :, None]
  kpos = jnp.arange(s, dtype=jnp.int32)[None, None, :]
  if kv_lengths is None:
    valid = jnp.ones((batch, 1, s), bool)
  else:
    valid = kpos < jnp.asarray(kv_lengths, jnp.int32)[:, None, None]
  if spec.kind == "dense":
    allowed = (kpos <= qpos) if spec.causal else jnp.ones((batch, t, s), bool)
  elif spec.kind == "sliding":
    allowed = (kpos <= qpos) & (kpos > qpos - spec.window)
  else:
    if segment_ids is None:
      raise ValueError("document attention needs segment_ids")
    q_seg = jnp.asarray(segment_ids, jnp.int32)
    k_seg = q_seg if kv_segment_ids is None else jnp.asarray(kv_segment_ids, jnp.int32)
    final = jnp.max(k_seg, axis=1)[:, None, None]
    same = q_seg[:, :, None] == k_seg[:, None, :]
    allowed = (kpos <= qpos) & (same | (q_seg[:, :, None] == final))
  return allowed & valid


def masked_attention(q, k, v, allowed, *, scale=None):
  """Softmax attention under an explicit boolean mask.

  Args:
    q: [B, T, H, D]; k, v: [B, S, K, D].
    allowed: [B, T, S] (shared by all heads) or [B, K, T, S] (per KV group).
    scale: logit scale, default D ** -0.5.

  Returns (out [B, T, H, D] in q's dtype, lse [B, T, H] float32); rows with no
  visible key give out = 0 and lse = -inf.
  """
  b, t, h, d = q.shape
  kh = k.shape[2]
  scale = d ** -0.5 if scale is None else scale
  qg = q.reshape(b, t, kh, h // kh, d).astype(jnp.float32)
  logits = jnp.einsum("btkgd,bskd->bkgts", qg, k.astype(jnp.float32)) * scale
  m = allowed[:, None, None] if allowed.ndim == 3 else allowed[:, :, None]
  logits = jnp.where(m, logits, NEG_INF)
  lse = jax.nn.logsumexp(logits, axis=-1)  # [B, K, G, T]
  probs = jnp.where(m, jnp.exp(logits - jnp.where(
      jnp.isfinite(lse), lse, 0.0)[..., None]), 0.0)
  out = jnp.einsum("bkgts,bskd->btkgd", probs, v.astype(jnp.float32))
  out = out.reshape(b, t, h, d).astype(q.dtype)
  lse = lse.transpose(0, 3, 1, 2).reshape(b, t, h)
  return out, lse


def attention(q, k, v, spec: AttentionSpec, *, q_offset=None, kv_lengths=None,
              segment_ids=None, kv_segment_ids=None, scale=None):
  """Returns (out [B, T, H, D] in q's dtype, lse [B, T, H] float32).

  Rows with no visible key give out = 0 and lse = -inf.
  """
  b, t = q.shape[:2]
  s = k.shape[1]
  m = mask(spec, b, t, s, q_offset=q_offset, kv_lengths=kv_lengths,
           segment_ids=segment_ids, kv_segment_ids=kv_segment_ids)
  return masked_attention(q, k, v, m, scale=scale)


# ----------------------------------------------------------------- NSA


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
