"""Which implementation serves which call, and the library path's argument mapping.

The choice is a pure function (`kernels.dispatch.choose`), tested here for
every case on any backend. The cuDNN path is `jax.nn.dot_product_attention`
with implementation="cudnn"; every call the dispatcher would send there runs
here with implementation="xla" (the same arguments, runnable on CPU) against
our dense-mask reference, forward and gradients, so the GPU path differs only
in that string (on a GPU, tests/kernel_impls.py adds "cudnn" itself).
Tolerances as in test_kernels_flash: float32 2e-5, bfloat16 3e-2.
"""

from __future__ import annotations

import logging
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlcode import kernels
from rlcode.kernels import api, dispatch
from rlcode.kernels.flash import library, reference
from rlcode.kernels.spec import AttentionSpec
from kernel_impls import LIBRARY, ON_GPU

TOL = {jnp.float32: 2e-5, jnp.bfloat16: 3e-2}
BF16, F32 = jnp.bfloat16, jnp.float32
DENSE, FULL = AttentionSpec(), AttentionSpec(causal=False)
SLIDING = AttentionSpec("sliding", window=7)
DOC = AttentionSpec("document")


def _shapes(t=38, s=38, h=4, kh=2, d=16):
  return dict(q_shape=(2, t, h, d), k_shape=(2, s, kh, d))


# name -> (choose keyword arguments, expected impl on "gpu").
CHOICES = {
    "dense_causal_bf16": (dict(spec=DENSE, dtype=BF16, **_shapes()), "cudnn"),
    "dense_full_t_ne_s": (dict(spec=FULL, dtype=BF16, q_offset=np.array([3, 4]),
                               **_shapes(t=6, s=38)), "cudnn"),
    "sliding_bf16": (dict(spec=SLIDING, dtype=BF16, **_shapes()), "cudnn"),
    "sliding_fp16_offset_0": (dict(spec=SLIDING, dtype=jnp.float16, q_offset=0,
                                   **_shapes(t=20, s=38)), "cudnn"),
    "dense_head_dim_128": (dict(spec=DENSE, dtype=BF16, **_shapes(d=128)), "cudnn"),
    "needs_lse": (dict(spec=DENSE, dtype=BF16, needs_lse=True, **_shapes()), "pallas"),
    "document": (dict(spec=DOC, dtype=BF16, **_shapes()), "pallas"),
    "float32": (dict(spec=DENSE, dtype=F32, **_shapes()), "pallas"),
    "head_dim_12": (dict(spec=DENSE, dtype=BF16, **_shapes(d=12)), "pallas"),
    "head_dim_256": (dict(spec=DENSE, dtype=BF16, **_shapes(d=256)), "pallas"),
    "causal_bottom_right": (dict(spec=DENSE, dtype=BF16, **_shapes(t=6, s=38)), "pallas"),
    "sliding_more_queries_than_keys": (dict(spec=SLIDING, dtype=BF16, q_offset=0,
                                            **_shapes(t=38, s=24)), "pallas"),
    "odd_query_length": (dict(spec=DENSE, dtype=BF16, **_shapes(t=37, s=37)), "pallas"),
    "odd_key_length": (dict(spec=FULL, dtype=BF16, **_shapes(t=6, s=37)), "pallas"),
    "causal_array_offset": (dict(spec=SLIDING, dtype=BF16, q_offset=np.array([0, 0]),
                                 **_shapes()), "pallas"),
    "causal_offset_3": (dict(spec=DENSE, dtype=BF16, q_offset=3, **_shapes()), "pallas"),
}


@pytest.mark.parametrize("name", sorted(CHOICES))
def test_attention_choice_on_gpu_and_elsewhere(name):
  call, want = CHOICES[name]
  got = dispatch.choose("auto", family="attention", backend="gpu", **call)
  assert got.impl == want and not got.fallback, got
  assert (got.reason == "a mask cuDNN computes, no log-sum-exp needed") == (want == "cudnn")
  assert dispatch.choose("auto", family="attention", backend="cpu", **call).impl == "xla"
  if want == "cudnn":
    assert dispatch.choose("cudnn", family="attention", backend="gpu", **call).impl == "cudnn"
  else:
    with pytest.raises(ValueError, match="impl='cudnn' cannot compute this call"):
      dispatch.choose("cudnn", family="attention", backend="gpu", **call)


@pytest.mark.parametrize("family", ["decode", "nsa"])
def test_decode_and_nsa_are_ours(family):
  assert dispatch.choose("auto", family=family, backend="gpu").impl == "pallas"
  assert dispatch.choose("auto", family=family, backend="cpu").impl == "xla"
  with pytest.raises(ValueError, match=f"cuDNN is not used for {family}"):
    dispatch.choose("cudnn", family=family, backend="gpu")


@pytest.mark.parametrize("impl", ["pallas", "cudnn"])
def test_gpu_only_requests_fall_back_off_gpu(impl):
  call = CHOICES["dense_causal_bf16"][0]
  got = dispatch.choose(impl, family="attention", backend="cpu", **call)
  assert got.impl == "xla" and got.fallback and f"impl='{impl}' needs a GPU" in got.reason
  for requested in ("reference", "xla", "pallas_interpret"):
    got = dispatch.choose(requested, family="attention", backend="gpu", **call)
    assert got.impl == requested and not got.fallback


def test_bad_requests_name_the_argument():
  with pytest.raises(ValueError, match="impl='triton'"):
    dispatch.choose("triton", family="attention", backend="gpu")
  with pytest.raises(ValueError, match="family='ring'"):
    dispatch.choose("auto", family="ring", backend="gpu")


# name -> (spec, H, K, T, S, dtype, keyword arguments of the call); B=2, D=16.
MAPPING = {
    "dense_causal_gqa_padded_bf16": (DENSE, 4, 2, 38, 38, BF16,
                                     dict(kv_lengths=np.array([37, 20]))),
    "dense_causal_mqa_f32": (DENSE, 3, 1, 38, 38, F32, {}),
    "dense_full_empty_row_bf16": (FULL, 4, 2, 22, 38, BF16,
                                  dict(kv_lengths=np.array([37, 0]))),
    "sliding_padded_f32": (SLIDING, 4, 2, 38, 38, F32, dict(kv_lengths=np.array([37, 11]))),
    "sliding_offset_0_fewer_queries_bf16": (SLIDING, 4, 2, 24, 38, BF16, dict(q_offset=0)),
    "dense_offset_0_fewer_queries_f32": (DENSE, 4, 2, 20, 38, F32, dict(q_offset=0)),
}


def _mapping_inputs(h, kh, t, s, dtype, d=16):
  rng = np.random.default_rng(0)
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
  return (normal(2, t, h, d).astype(dtype), normal(2, s, kh, d).astype(dtype),
          normal(2, s, kh, d).astype(dtype), normal(2, t, h, d))


def _out_and_grads(fn, q, k, v, w):
  loss = lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * w)
  return fn(q, k, v), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)


@pytest.mark.slow
@pytest.mark.parametrize("implementation, case", [
    (impl, case) for impl in LIBRARY for case in sorted(MAPPING)
    if impl == "xla" or MAPPING[case][5] != F32])  # cuDNN takes half precision only
def test_library_mapping_matches_reference(implementation, case):
  spec, h, kh, t, s, dtype, kwargs = MAPPING[case]
  q, k, v, w = _mapping_inputs(h, kh, t, s, dtype)
  # The mapping is exercised exactly where the dispatcher would send it to cuDNN.
  call = dict(spec=spec, q_shape=q.shape, k_shape=k.shape, q_offset=kwargs.get("q_offset"))
  if dtype == BF16:
    assert dispatch.choose("auto", family="attention", backend="gpu", dtype=dtype,
                           **call).impl == "cudnn"
  else:
    assert dispatch.cudnn_gap(needs_lse=False, dtype=BF16, **call) is None
  lengths = kwargs.get("kv_lengths")
  lib = jax.jit(lambda *a: _out_and_grads(lambda q, k, v: library.attention(
      q, k, v, spec, implementation=implementation, kv_lengths=lengths), *a))
  ref = jax.jit(lambda *a: _out_and_grads(lambda q, k, v: reference.attention(
      q, k, v, spec, **kwargs)[0], *a))
  (out, grads), (out_ref, grads_ref) = lib(q, k, v, w), ref(q, k, v, w)
  assert out.dtype == dtype
  for name, got, want in zip(("out", "dq", "dk", "dv"), (out, *grads), (out_ref, *grads_ref)):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert np.all(np.isfinite(got)), name
    np.testing.assert_allclose(got, want, atol=TOL[dtype], rtol=TOL[dtype], err_msg=name)
  if case == "dense_full_empty_row_bf16":
    assert np.all(np.asarray(out[1]) == 0)  # no valid key: 0, as every implementation


def test_auto_on_gpu_calls_the_library_with_cudnn(monkeypatch):
  """The wiring, faking a GPU backend: only the implementation string is swapped to run here."""
  seen = []
  real = library.attention

  def on_cpu(*args, implementation, **kwargs):
    seen.append(implementation)
    return real(*args, implementation="xla", **kwargs)
  monkeypatch.setattr(api, "_backend", lambda: "gpu")
  monkeypatch.setattr(library, "attention", on_cpu)
  spec, h, kh, t, s, dtype, kwargs = MAPPING["dense_causal_gqa_padded_bf16"]
  q, k, v, _ = _mapping_inputs(h, kh, t, s, dtype)
  lengths = jnp.asarray(kwargs["kv_lengths"])
  out = jax.jit(lambda *a: kernels.attention(*a, spec, kv_lengths=lengths))(q, k, v)
  want = reference.attention(q, k, v, spec, kv_lengths=lengths)[0]
  assert seen == ["cudnn"]
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want, np.float32),
                             atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.slow
def test_each_distinct_choice_is_logged_once(monkeypatch, caplog):
  monkeypatch.setattr(dispatch, "_logged", set())
  q = jnp.zeros((1, 8, 2, 8), jnp.float32)
  with caplog.at_level(logging.DEBUG, logger="kernels"):
    for _ in range(3):
      kernels.attention(q, q, q, impl="xla")
      kernels.attention(q, q, q, impl="reference")
  lines = [r.getMessage() for r in caplog.records if r.name == "kernels"]
  assert lines == ["attention: impl='xla' (requested)",
                   "attention: impl='reference' (requested)"]


@pytest.mark.skipif(ON_GPU, reason="checks the fallback where no GPU is present")
def test_cudnn_request_off_gpu_falls_back_with_warning_and_errors_name_the_gap():
  q = jnp.zeros((1, 8, 2, 8), jnp.bfloat16)
  with pytest.warns(UserWarning, match="impl='cudnn' needs a GPU"):
    out = kernels.attention(q, q, q, impl="cudnn")
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    np.testing.assert_array_equal(out, kernels.attention(q, q, q, impl="xla"))
  with pytest.raises(ValueError, match="log-sum-exp"):
    kernels.attention(q, q, q, impl="cudnn", return_lse=True)
  with pytest.raises(ValueError, match="cuDNN is not used for decode"):
    kernels.decode_attention(q, q, q, jnp.array([8]), impl="cudnn")
