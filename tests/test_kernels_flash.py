"""Masked attention (dense, sliding, document): every implementation against the
dense-mask reference, forward and gradients.

Shapes are small and deliberately awkward: GQA and MQA, lengths that are not
multiples of the tiles, padding (kv_lengths), fully masked rows (a row with no
valid key, queries placed before every key), T != S with q_offset, float32 and
bfloat16. Pallas kernels run with interpret=True.

Tolerances (absolute and relative, on values of order 1): float32 2e-5, a few
hundred float32 ulps for sums over <= 53 keys; bfloat16 3e-2, about four
bfloat16 ulps at 1.0 (outputs and gradients are rounded to bfloat16 once by
both sides, and the Pallas kernels round probabilities to bfloat16 before the
P @ V matmul, as FlashAttention does).
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlcode import kernels
from rlcode.kernels import pallas_common, tiling
from rlcode.kernels.flash import reference
from rlcode.kernels.flash import pallas as flash_pallas
from rlcode.kernels.flash import xla as flash_xla
from rlcode.kernels.spec import AttentionSpec
from kernel_impls import ON_GPU, PALLAS

TOL = {jnp.float32: 2e-5, jnp.bfloat16: 3e-2}

_SEG = np.array([[0] * 10 + [1] * 20 + [2] * 23, [0] * 30 + [4] * 23], np.int32)
_SEG4 = np.array([np.repeat([0, 1, 2, 3, 4], [8, 8, 8, 8, 21]), [0] * 16 + [1] * 37], np.int32)

# name -> (spec, H, K, S, dtype, keyword arguments); B=2, T=37, D=16.
CASES = {
    "dense_causal_gqa_padded": (
        AttentionSpec(block_q=8, block_k=16), 4, 2, 53, jnp.float32,
        dict(kv_lengths=np.array([53, 41]))),
    "dense_full_mqa_empty_row_bf16": (
        AttentionSpec(causal=False, block_q=8, block_k=16), 3, 1, 53, jnp.bfloat16,
        dict(kv_lengths=np.array([53, 0]))),
    "sliding_offsets": (
        AttentionSpec("sliding", window=7, block_q=8, block_k=8), 4, 2, 53, jnp.float32,
        dict(q_offset=np.array([16, -5]), kv_lengths=np.array([40, 53]))),
    "document_kv_segments_bf16": (
        AttentionSpec("document", block_q=8, block_k=8), 4, 2, 53, jnp.bfloat16,
        dict(segment_ids=_SEG[:, 16:], kv_segment_ids=_SEG)),
    "document_gap_between_visits": (  # key tiles of document 2 skip document 3's queries
        AttentionSpec("document", block_q=8, block_k=8), 2, 1, 53, jnp.float32,
        dict(segment_ids=_SEG4[:, 16:], kv_segment_ids=_SEG4)),
    "document_square_padded": (
        AttentionSpec("document", block_q=16, block_k=8), 2, 2, 37, jnp.float32,
        dict(segment_ids=_SEG[:, 16:], kv_lengths=np.array([30, 37]))),
}


def _inputs(h, kh, dtype, t=37, s=53, d=16, seed=0):
  rng = np.random.default_rng(seed)
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
  q = normal(2, t, h, d).astype(dtype)
  k = normal(2, s, kh, d).astype(dtype)
  v = normal(2, s, kh, d).astype(dtype)
  return q, k, v, normal(2, t, h, d), normal(2, t, h)


def _value_and_grads(fn, q, k, v, w_out, w_lse):
  """(out, lse) and d/d(q, k, v) of a loss that uses both out and lse."""
  def loss(q, k, v):
    out, lse = fn(q, k, v)
    finite = jnp.where(jnp.isfinite(lse), lse, 0.0)
    return jnp.sum(out.astype(jnp.float32) * w_out) + jnp.sum(finite * w_lse), (out, lse)
  (_, (out, lse)), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
  return out, lse, grads


def _assert_close(name, got, want, dtype):
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  assert np.all(np.isfinite(got)), f"{name}: non-finite values"
  np.testing.assert_allclose(got, want, atol=TOL[dtype], rtol=TOL[dtype], err_msg=name)


def _assert_lse_close(got, want):
  got, want = np.asarray(got), np.asarray(want)
  assert not np.any(np.isnan(got))
  np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
  finite = np.isfinite(want)
  np.testing.assert_allclose(got[finite], want[finite], atol=2e-5, rtol=2e-5)


def _case(name, seed=0):
  """The spec, the dtype, keyword arguments and inputs (q, k, v, w_out, w_lse) of a case."""
  spec, h, kh, s, dtype, kwargs = CASES[name]
  kwargs = {k: jnp.asarray(v) for k, v in kwargs.items()}
  return spec, dtype, kwargs, _inputs(h, kh, dtype, s=s, seed=seed)


def _run_case(case, impl):
  spec, _, kwargs, inputs = _case(case)
  fn = lambda q, k, v: kernels.attention(q, k, v, spec, impl=impl, return_lse=True, **kwargs)
  return jax.jit(lambda *a: _value_and_grads(fn, *a))(*inputs)


_reference_case = functools.lru_cache(lambda case: _run_case(case, "reference"))


@pytest.mark.parametrize("impl", ["xla", *PALLAS])
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_reference(case, impl):
  dtype = CASES[case][4]
  want = _reference_case(case)
  got = _run_case(case, impl)
  assert got[0].dtype == dtype and got[1].dtype == jnp.float32
  _assert_close("out", got[0], want[0], dtype)
  _assert_lse_close(got[1], want[1])
  for name, g, w in zip(("dq", "dk", "dv"), got[2], want[2]):
    assert g.dtype == dtype
    _assert_close(name, g, w, dtype)


def test_fully_masked_rows_are_zero_with_minus_inf_lse():
  spec, _, kwargs, (q, k, v, w_out, w_lse) = _case("sliding_offsets")
  out, lse, grads = jax.jit(lambda *a: _value_and_grads(
      lambda q, k, v: flash_xla.attention(q, k, v, spec, **kwargs), *a))(q, k, v, w_out, w_lse)
  # Row 1 starts at position -5: its first five queries precede every key.
  assert np.all(np.asarray(out[1, :5]) == 0)
  assert np.all(np.isneginf(np.asarray(lse[1, :5])))
  assert np.all(np.isfinite(np.asarray(lse[1, 5:])))
  assert np.all(np.asarray(grads[0][1, :5]) == 0)


def test_reference_dense_matches_softmax_by_hand():
  q, k, v, _, _ = _inputs(2, 1, jnp.float32, t=5, s=5, d=4)
  out, lse = jax.jit(reference.attention, static_argnums=3)(q, k, v, AttentionSpec())
  qn, kn, vn = (np.asarray(x, np.float64) for x in (q, k, v))
  for b in range(2):
    for h in range(2):
      logits = qn[b, :, h] @ kn[b, :, 0].T / 2.0
      logits[np.triu_indices(5, 1)] = -np.inf
      p = np.exp(logits - logits.max(1, keepdims=True))
      want = (p / p.sum(1, keepdims=True)) @ vn[b, :, 0]
      np.testing.assert_allclose(np.asarray(out[b, :, h]), want, atol=1e-6)
      np.testing.assert_allclose(np.asarray(lse[b, :, h]),
                                 np.log(np.exp(logits).sum(1)), atol=1e-6)


def test_tiles_outside_the_attended_area_are_skipped():
  t = s = 1024
  sliding = tiling.make_layout(tiling.Mask(window=100), 1, t, s, 64, 64)
  lo, hi = np.asarray(sliding.lo[0]), np.asarray(sliding.hi[0])
  # A query tile [64i, 64i+63] needs keys (64i - 100, 64i + 63]: at most 3 tiles.
  assert np.all(hi - lo <= 3) and np.all(hi == np.arange(1, 17))
  causal = tiling.make_layout(tiling.Mask(), 1, t, s, 64, 64)
  np.testing.assert_array_equal(causal.lo[0], 0)
  np.testing.assert_array_equal(causal.hi[0], np.arange(1, 17))
  seg = jnp.asarray(np.repeat(np.arange(4), 256)[None])
  doc = tiling.make_layout(tiling.Mask(document=True), 1, t, s, 64, 64, segment_ids=seg)
  # Documents 0-2 start at tile 0, 4 and 8; the final one (tiles 12-15) sees everything.
  np.testing.assert_array_equal(doc.lo[0], [0] * 4 + [4] * 4 + [8] * 4 + [0] * 4)
  # The backward walks, for each key tile, its own document's query tiles and then
  # the final document's: not the documents in between.
  first, end1, start2, last = (np.asarray(x[0]) for x in flash_pallas._query_ranges(
      doc.lo, doc.hi, s // 64))
  walked = (end1 - first) + (last - start2)
  own_tiles_up_to_end = 4 - np.arange(16) % 4  # causal inside the document
  np.testing.assert_array_equal(walked[:12], own_tiles_up_to_end[:12] + 4)
  np.testing.assert_array_equal(walked[12:], own_tiles_up_to_end[12:])
  visits = (doc.lo[0][:, None] <= np.arange(16)) & (np.arange(16) < doc.hi[0][:, None])
  for j in range(16):
    in_ranges = np.zeros(16, bool)
    in_ranges[first[j]:end1[j]] = in_ranges[start2[j]:last[j]] = True
    np.testing.assert_array_equal(in_ranges, visits[:, j])


def test_blockwise_never_materialises_t_by_s():
  t = 4096
  spec = AttentionSpec("sliding", window=64, block_q=64, block_k=64)
  shape = jax.ShapeDtypeStruct((1, t, 1, 16), jnp.float32)

  def temp_bytes(fn):
    loss = lambda q, k, v: jnp.sum(fn(q, k, v, spec)[0])
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(shape, shape, shape).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  # The dense reference needs several T x S buffers; forward + backward of the
  # blockwise version stays below 1% of one.
  assert temp_bytes(reference.attention) > t * t * 4
  assert temp_bytes(flash_xla.attention) < t * t * 4 // 100


def test_merge_of_key_halves_equals_whole():
  q, k, v, _, _ = _inputs(4, 2, jnp.float32)
  spec = AttentionSpec(causal=False)

  @jax.jit
  def whole_and_merged(q, k, v):
    whole = kernels.attention(q, k, v, spec, impl="xla", return_lse=True)
    parts = [kernels.attention(q, k[:, a:b], v[:, a:b], spec, impl="xla", return_lse=True)
             for a, b in ((0, 20), (20, 53))]
    return whole, kernels.merge([p[0] for p in parts], [p[1] for p in parts])
  whole, (out, lse) = whole_and_merged(q, k, v)
  np.testing.assert_allclose(out, whole[0], atol=2e-5)
  np.testing.assert_allclose(lse, whole[1], atol=2e-5)


@pytest.mark.skipif(ON_GPU, reason="checks the fallback where no GPU is present")
def test_auto_is_xla_on_cpu_and_pallas_falls_back_with_warning():
  q, k, v, _, _ = _inputs(2, 1, jnp.float32, t=8, s=8, d=8)
  assert kernels.resolve_impl("auto") == "xla"
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    auto = jax.jit(lambda *a: kernels.attention(*a, impl="auto"))(q, k, v)
  with pytest.warns(UserWarning, match="impl='pallas' needs a GPU"):
    fallback = jax.jit(lambda *a: kernels.attention(*a, impl="pallas"))(q, k, v)
  np.testing.assert_array_equal(auto, fallback)


@pytest.mark.parametrize("call, message", [
    (lambda q, k, v: kernels.attention(q[:, :, :3], k, v), "multiple of KV heads"),
    (lambda q, k, v: kernels.attention(q, k, v[:, :5]), "same shape"),
    (lambda q, k, v: kernels.attention(q, k, v, impl="cuda"), "impl='cuda'"),
    (lambda q, k, v: kernels.attention(q, k, v, kv_lengths=jnp.array([3])), "kv_lengths"),
    (lambda q, k, v: kernels.attention(q, k, v, AttentionSpec("document")), "segment_ids"),
    (lambda q, k, v: kernels.attention(q, k, v, AttentionSpec("document"),
                                       segment_ids=jnp.array([[0, 0, 1, 1, 0, 2, 2, 2]] * 2)),
     "non-decreasing"),
    (lambda q, k, v: kernels.attention(q, k, v, segment_ids=jnp.zeros((2, 8), jnp.int32)),
     "only used by kind='document'"),
    (lambda q, k, v: kernels.decode_attention(q, k, v, jnp.array([1, 2, 3])), "lengths"),
])
def test_bad_input_names_the_argument(call, message):
  q, k, v, _, _ = _inputs(4, 2, jnp.float32, t=8, s=8, d=8)
  with pytest.raises(ValueError, match=message):
    call(q, k, v)


@pytest.mark.parametrize("kwargs, message", [
    (dict(kind="sliding", window=0), "window=0"),
    (dict(kind="sliding"), "window=0"),
    (dict(kind="dense", window=4), "only meaningful"),
    (dict(kind="document", causal=False), "causal=False"),
    (dict(block_k=0), "block_k=0"),
    (dict(kind="ring"), "kind='ring'"),
])
def test_bad_spec_names_the_field(kwargs, message):
  with pytest.raises(ValueError, match=message):
    AttentionSpec(**kwargs)


def test_triton_sizes_must_be_powers_of_two():
  pallas_common.check_gpu_sizes(True, block_q=24)  # the interpreter takes any size
  with pytest.raises(ValueError, match="block_q=24"):
    pallas_common.check_gpu_sizes(False, block_q=24, block_k=64)
  with pytest.raises(ValueError, match="head_dim=8"):  # below Triton's matmul minimum
    pallas_common.check_gpu_sizes(False, block_q=16, head_dim=8)
  # Tiles asked smaller than 16 are raised to 16 on GPU, never passed to Triton.
  assert pallas_common.tile_sizes(8, 8, 37, 53, interpret=False) == (16, 16)
