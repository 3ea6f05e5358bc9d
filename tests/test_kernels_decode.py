"""Decode attention (flash-decoding) against the reference, and chunked KV merged by lse.

Cache rows of different lengths, one of them so short that its first query
sees no key (out 0, lse -inf); GQA with two new queries per row. Tolerances as
in test_kernels_attention: float32 2e-5, bfloat16 3e-2.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlcode import kernels
from rlcode.kernels.spec import AttentionSpec
from kernel_impls import PALLAS

TOL = {jnp.float32: 2e-5, jnp.bfloat16: 3e-2}
LENGTHS = np.array([75, 31, 1], np.int32)
SPECS = {"dense": AttentionSpec(block_k=16),
         "sliding": AttentionSpec("sliding", window=9, block_k=8),
         "document": AttentionSpec("document", block_k=16)}


def _inputs(dtype, b=3, tq=2, s=75, h=4, kh=2, d=16):
  rng = np.random.default_rng(1)
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32).astype(dtype)
  return normal(b, tq, h, d), normal(b, s, kh, d), normal(b, s, kh, d)


@functools.partial(jax.jit, static_argnames=("spec", "impl", "num_splits"))
def _decode(q, k, v, lengths, *, spec, impl, num_splits=None, q_offset=None):
  return kernels.decode_attention(q, k, v, lengths, spec=spec, impl=impl, return_lse=True,
                                  q_offset=q_offset, num_splits=num_splits)


def _assert_close(got, want, dtype):
  (out, lse), (out_ref, lse_ref) = got, want
  assert out.dtype == dtype
  out, out_ref = np.asarray(out, np.float32), np.asarray(out_ref, np.float32)
  np.testing.assert_allclose(out, out_ref, atol=TOL[dtype], rtol=TOL[dtype])
  lse, lse_ref = np.asarray(lse), np.asarray(lse_ref)
  np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(lse_ref))
  finite = np.isfinite(lse_ref)
  np.testing.assert_allclose(lse[finite], lse_ref[finite], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("impl, num_splits",
                         [("xla", None), *((name, 3) for name in PALLAS)])
@pytest.mark.parametrize("kind, dtype", [("dense", jnp.float32), ("sliding", jnp.bfloat16),
                                         ("document", jnp.float32)])
def test_decode_matches_reference(kind, dtype, impl, num_splits):
  q, k, v = _inputs(dtype)
  lengths = jnp.asarray(LENGTHS)
  want = _decode(q, k, v, lengths, spec=SPECS[kind], impl="reference")
  got = _decode(q, k, v, lengths, spec=SPECS[kind], impl=impl, num_splits=num_splits)
  _assert_close(got, want, dtype)
  # Row 2 holds one key: its first query (position -1) sees nothing.
  assert np.all(np.asarray(got[0][2, 0]) == 0) and np.isneginf(np.asarray(got[1][2, 0])).all()


def test_decode_reference_is_causal_attention_of_the_last_queries():
  q, k, v = _inputs(jnp.float32)
  lengths = jnp.asarray(LENGTHS)
  out, _ = _decode(q, k, v, lengths, spec=SPECS["dense"], impl="reference")
  # Row 1 with 31 valid keys: its queries sit at positions 29 and 30.
  full = jax.jit(lambda *a: kernels.attention(*a, impl="reference"))(
      q[1:2], k[1:2, :31], v[1:2, :31])
  np.testing.assert_allclose(out[1:2], full, atol=1e-6)


@pytest.mark.parametrize("kind", ["dense", "sliding"])
def test_chunked_cache_merged_equals_one_shot(kind):
  q, k, v = _inputs(jnp.float32)
  lengths = jnp.asarray(LENGTHS)
  spec = SPECS[kind]
  tq = q.shape[1]
  one_shot = _decode(q, k, v, lengths, spec=spec, impl="xla")
  outs, lses = [], []
  for start, stop in ((0, 25), (25, 50), (50, 75)):  # equal sizes: one compile
    chunk_len = jnp.clip(lengths - start, 0, stop - start)
    out, lse = _decode(q, k[:, start:stop], v[:, start:stop], chunk_len, spec=spec,
                       impl="xla", q_offset=lengths - tq - start)
    outs.append(out)
    lses.append(lse)
  _assert_close(kernels.merge(outs, lses), one_shot, jnp.float32)


def test_decode_rejects_bad_splits():
  q, k, v = _inputs(jnp.float32)
  with pytest.raises(ValueError, match="num_splits=0"):
    kernels.decode_attention(q, k, v, jnp.asarray(LENGTHS), impl="pallas_interpret",
                             num_splits=0)
