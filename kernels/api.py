"""The dispatcher: argument checks, implementation choice, fallbacks with warnings."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp

from kernels import reference
from kernels.spec import AttentionSpec

IMPLS = ("auto", "reference", "xla", "pallas", "pallas_interpret")


def _check(q, k, v, spec, segment_ids):
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError(f"attention: q, k, v must be rank 4 ([B, T, H, D], [B, S, K, D]); "
                     f"got q{q.shape} k{k.shape} v{v.shape}")
  if k.shape != v.shape:
    raise ValueError(f"attention: k{k.shape} and v{v.shape} must have the same shape")
  if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
    raise ValueError(f"attention: batch and head_dim of q{q.shape} and k{k.shape} differ")
  if q.shape[2] % k.shape[2]:
    raise ValueError(f"attention: query heads H={q.shape[2]} must be a multiple of "
                     f"KV heads K={k.shape[2]}")
  if spec.kind == "document" and segment_ids is None:
    raise ValueError("attention: spec.kind='document' needs segment_ids [B, T]")


def _resolve(impl: str) -> str:
  if impl not in IMPLS:
    raise ValueError(f"attention: impl={impl!r}; expected one of {IMPLS}")
  if impl == "auto":
    return "pallas" if jax.default_backend() == "gpu" else "xla"
  return impl


def attention(q, k, v, spec: AttentionSpec = AttentionSpec(), *, impl: str = "auto",
              segment_ids=None, kv_segment_ids=None, q_offset=None, kv_lengths=None,
              scale=None, return_lse: bool = False):
  """Attention of q over k, v under `spec`'s mask.

  Args:
    q: [B, T, H, D]. k, v: [B, S, K, D].
    spec: the kind of attention (see AttentionSpec for the masks).
    impl: "auto" (Pallas on GPU, xla elsewhere), "reference", "xla", "pallas",
      "pallas_interpret". One that cannot run here falls back with a warning.
    segment_ids: [B, T] non-decreasing document ids of the queries (document kind).
    kv_segment_ids: [B, S] ids of the keys; defaults to segment_ids (T == S).
    q_offset: int or [B]: absolute position of query 0 among the keys; default
      S - T, so the last query sits on the last key.
    kv_lengths: [B] number of valid keys per row; keys beyond are padding.
    scale: logit scale, default D ** -0.5.
    return_lse: also return the log-sum-exp [B, T, H] (float32).
  """
  _check(q, k, v, spec, segment_ids)
  impl = _resolve(impl)
  if impl != "reference":
    warnings.warn(f"attention impl={impl!r} is not available yet; "
                  "falling back to the dense reference", stacklevel=2)
  out, lse = reference.attention(q, k, v, spec, q_offset=q_offset, kv_lengths=kv_lengths,
                                 segment_ids=segment_ids, kv_segment_ids=kv_segment_ids,
                                 scale=scale)
  return (out, lse) if return_lse else out


def decode_attention(q, k, v, lengths, *, spec: AttentionSpec = AttentionSpec(),
                     impl: str = "auto", scale=None, return_lse: bool = False):
  """A few new queries against a KV cache with per-sequence lengths.

  q: [B, Tq, H, D], the queries at positions lengths-Tq .. lengths-1 (their own
  keys are already written to the cache). k, v: [B, S, K, D] caches. lengths: [B].
  """
  lengths = jnp.asarray(lengths, jnp.int32)
  return attention(q, k, v, spec, impl=impl, q_offset=lengths - q.shape[1],
                   kv_lengths=lengths, scale=scale, return_lse=return_lse)


def merge(outs, lses):
  """Exact merge of partial attentions over disjoint key sets.

  outs: sequence of [B, T, H, D]; lses: sequence of [B, T, H]. Returns the merged
  (out, lse). Parts with lse = -inf (no visible key) contribute nothing.
  """
  lse_all = jnp.stack([l.astype(jnp.float32) for l in lses])
  m = jnp.max(lse_all, axis=0)
  m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
  w = jnp.exp(lse_all - m_safe)
  denom = jnp.sum(w, axis=0)
  out = sum(wi[..., None] * o.astype(jnp.float32) for wi, o in zip(w, outs))
  out = out / jnp.where(denom > 0, denom, 1.0)[..., None]
  lse = jnp.where(denom > 0, m_safe + jnp.log(jnp.where(denom > 0, denom, 1.0)), -jnp.inf)
  return out.astype(outs[0].dtype), lse
