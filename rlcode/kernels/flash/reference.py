"""Masked attention's dense-mask reference: the truth the other versions are tested against.

`masked_attention` (softmax under an explicit boolean mask) is also the
kernel of the decode and NSA references. These build the full [T, S] mask
and score matrix, so they are for small sizes only. They must stay obviously
correct: no tiling, no tricks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlcode.kernels.spec import AttentionSpec

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
      raise ValueError(f"{spec.kind} attention needs segment_ids")
    q_seg = jnp.asarray(segment_ids, jnp.int32)
    k_seg = q_seg if kv_segment_ids is None else jnp.asarray(kv_segment_ids, jnp.int32)
    same = q_seg[:, :, None] == k_seg[:, None, :]
    if spec.kind == "packed":
      allowed = (kpos <= qpos) & same
    else:
      final = jnp.max(k_seg, axis=1)[:, None, None]
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
