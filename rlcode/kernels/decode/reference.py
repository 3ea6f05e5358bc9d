"""Decode attention's dense-mask reference: masked attention's reference on the cache.

A decoded token belongs to a document row's final segment, which sees every
earlier key, so document decoding is dense causal; dense and sliding are
themselves. Small sizes only (it builds [Tq, S]).
"""

from __future__ import annotations

from rlcode.kernels.flash import reference as flash_reference
from rlcode.kernels.spec import DENSE_CAUSAL, AttentionSpec


def attention(q, k, v, spec: AttentionSpec, *, lengths, q_offset, scale=None):
  """q [B, Tq, H, D] against k, v [B, S, K, D] with lengths [B]: (out, lse)."""
  spec = DENSE_CAUSAL if spec.kind == "document" else spec
  return flash_reference.attention(q, k, v, spec, q_offset=q_offset, kv_lengths=lengths,
                                   scale=scale)
