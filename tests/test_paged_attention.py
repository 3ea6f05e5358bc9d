"""Paged attention against decode's dense reference on the gathered cache.

The pool is laid out as an engine would: pages in no order, a group's prompt
pages shared by three rows, a row ending mid-page, one ending on a page
boundary, one shorter than the chunk of queries (its first queries see no
key). Every slot no row may read (page 0, pages no row uses, slots past a
row's length) holds NaN, so a read of one shows in the result. Tolerances as
in test_kernels_decode (float32 2e-5).
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from rlcode import kernels
from rlcode.kernels import dispatch
from rlcode.kernels.spec import AttentionSpec
from kernel_impls import PALLAS

TOL = 2e-5
PAGE = 16
# Rows 0-2 are one group: their first two pages hold the shared prompt (32 positions).
LENGTHS = np.array([45, 32, 40, 3], np.int32)
TABLE = np.array([[5, 2, 8, 0, 0],
                  [5, 2, 0, 0, 0],
                  [5, 2, 3, 0, 0],
                  [7, 0, 0, 0, 0]], np.int32)
POOL = 10
# block_k = two pages: the XLA version's tiles span pages, the last one padded.
SPECS = {"dense": AttentionSpec(block_k=2 * PAGE),
         "sliding": AttentionSpec("sliding", window=9, block_k=2 * PAGE),
         "document": AttentionSpec("document", block_k=2 * PAGE)}


def _inputs(tq, h=4, kh=2, d=16):
  """q, the NaN-filled pools, and the clean dense caches [B, K, M * S, D] they hold."""
  rng = np.random.default_rng(3)
  b, m = TABLE.shape
  q = rng.standard_normal((b, tq, h, d)).astype(np.float32)
  k_pages, v_pages = rng.standard_normal((2, POOL, kh, PAGE, d)).astype(np.float32)
  dense = [p[TABLE].transpose(0, 2, 1, 3, 4).reshape(b, kh, m * PAGE, d) for p in (k_pages, v_pages)]
  used = np.zeros((POOL, PAGE), bool)
  for row, length in enumerate(LENGTHS):
    j = np.arange(length)
    used[TABLE[row, j // PAGE], j % PAGE] = True
  assert not used[0].any() and not used[[1, 4, 6, 9]].any()
  for pool in (k_pages, v_pages):
    pool.transpose(0, 2, 1, 3)[~used] = np.nan
  return q, k_pages, v_pages, dense


@functools.partial(jax.jit, static_argnames=("spec", "impl"))
def _paged(q, k_pages, v_pages, table, lengths, q_offset=None, *, spec, impl):
  return kernels.paged_attention(q, k_pages, v_pages, table, lengths, spec=spec, impl=impl,
                                 q_offset=q_offset, return_lse=True)


@functools.partial(jax.jit, static_argnames=("spec",))
def _dense_truth(q, k, v, lengths=LENGTHS, q_offset=None, *, spec):
  return kernels.decode_attention(q, k, v, lengths, spec=spec, impl="reference",
                                  q_offset=q_offset, return_lse=True, kv_head_major=True)


def _assert_close(got, want):
  (out, lse), (out_ref, lse_ref) = [tuple(np.asarray(x) for x in pair) for pair in (got, want)]
  np.testing.assert_allclose(out, out_ref, atol=TOL, rtol=TOL)
  np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(lse_ref))
  finite = np.isfinite(lse_ref)
  np.testing.assert_allclose(lse[finite], lse_ref[finite], atol=TOL, rtol=TOL)


@pytest.mark.parametrize("kind, tq, impl", [
    *((kind, tq, "xla") for kind in SPECS for tq in (1, 5)),
    ("dense", 5, "reference"), ("sliding", 1, "reference")])
def test_paged_matches_dense_reference(kind, tq, impl):
  q, k_pages, v_pages, (k, v) = _inputs(tq)
  got = _paged(q, k_pages, v_pages, TABLE, LENGTHS, spec=SPECS[kind], impl=impl)
  _assert_close(got, _dense_truth(q, k, v, spec=SPECS[kind]))
  if tq == 5:  # row 3 holds 3 keys: its first two queries see nothing
    assert np.all(np.asarray(got[0])[3, :2] == 0) and np.isneginf(np.asarray(got[1])[3, :2]).all()


# Interpreted Pallas is slow: decode, and a chunk of prefill in blocks of two queries
# (three blocks, the last one partial) under a window.
@pytest.mark.parametrize("impl", PALLAS)
@pytest.mark.parametrize("tq, spec", [(1, SPECS["dense"]),
                                      (5, AttentionSpec("sliding", window=9, block_q=2))])
def test_paged_pallas_matches_dense_reference(tq, spec, impl):
  q, k_pages, v_pages, (k, v) = _inputs(tq)
  got = _paged(q, k_pages, v_pages, TABLE, LENGTHS, spec=spec, impl=impl)
  _assert_close(got, _dense_truth(q, k, v, spec=spec))


def test_paged_explicit_offset_and_empty_row():
  q, k_pages, v_pages, (k, v) = _inputs(1)
  lengths = LENGTHS.copy()
  lengths[1] = 0  # an idle slot: no key, out 0
  offset = np.maximum(lengths - 1, 0)
  want = _dense_truth(q, k, v, lengths, offset, spec=SPECS["dense"])
  got = _paged(q, k_pages, v_pages, TABLE, lengths, offset, spec=SPECS["dense"], impl="xla")
  _assert_close(got, want)
  assert np.all(np.asarray(got[0])[1] == 0)


def test_paged_dispatch():
  assert dispatch.choose("auto", family="paged", backend="cpu").impl == "xla"
  assert dispatch.choose("auto", family="paged", backend="gpu").impl == "pallas"
  with pytest.raises(ValueError, match="cuDNN is not used for paged"):
    dispatch.choose("cudnn", family="paged", backend="gpu")
  if jax.default_backend() != "gpu":
    q, k_pages, v_pages, _ = _inputs(1)
    call = functools.partial(kernels.paged_attention, impl="pallas")
    with pytest.warns(UserWarning, match="falling back to impl='xla'"):
      jax.eval_shape(call, q, k_pages, v_pages, TABLE, LENGTHS)


@pytest.mark.parametrize("change, message", [
    (dict(page_table=TABLE[:3]), "page_table has shape"),
    (dict(page_table=TABLE.astype(np.float32)), "page_table must hold integer"),
    (dict(lengths=LENGTHS[:3]), "lengths has shape"),
    (dict(lengths=LENGTHS + 40), "lengths .* must lie in"),
    (dict(v_pages=np.zeros((POOL, 2, PAGE, 8), np.float32)), "v_pages"),
    (dict(q=np.zeros((4, 1, 3, 16), np.float32)), "multiple of KV heads"),
    (dict(q_offset=np.zeros(3, np.int32)), "q_offset must be"),
])
def test_paged_rejects_bad_arguments(change, message):
  q, k_pages, v_pages, _ = _inputs(1)
  args = dict(q=q, k_pages=k_pages, v_pages=v_pages, page_table=TABLE, lengths=LENGTHS)
  args.update(change)
  with pytest.raises(ValueError, match=message):
    kernels.paged_attention(**args)
