"""NSA branches against their dense-mask references, and block selection against numpy.

Small sizes: l=8, d=4, l'=16, n=4, T=75 (not a multiple of any block), GQA
with 2 heads per KV group. Tolerances as in test_kernels_attention: float32
2e-5, bfloat16 3e-2.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlcode.kernels import nsa
from rlcode.kernels.nsa import pallas as nsa_pallas
from rlcode.kernels.nsa import reference
from rlcode.kernels.spec import NSAConfig
from kernel_impls import PALLAS

CFG = NSAConfig(block_cmp=8, stride_cmp=4, block_sel=16, num_sel=4, num_local=2, window=12,
                block_q=8)
B, T, H, K, D = 2, 75, 4, 2, 16
TOL = {jnp.float32: 2e-5, jnp.bfloat16: 3e-2}


def _normal(rng, shape, dtype=jnp.float32):
  return jnp.asarray(rng.standard_normal(shape), jnp.float32).astype(dtype)


def _inputs(dtype=jnp.float32, seed=0):
  rng = np.random.default_rng(seed)
  nc = CFG.num_compressed(T)
  return (_normal(rng, (B, T, H, D), dtype), _normal(rng, (B, nc, K, D), dtype),
          _normal(rng, (B, nc, K, D), dtype), _normal(rng, (B, T, K, D), dtype),
          _normal(rng, (B, T, K, D), dtype))


def _value_and_grads(fn, q, k, v):
  rng = np.random.default_rng(7)
  w_out = _normal(rng, (B, T, H, D))
  w_lse = _normal(rng, (B, T, H))

  def loss(q, k, v):
    out, lse = fn(q, k, v)
    return (jnp.sum(out.astype(jnp.float32) * w_out)
            + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0) * w_lse)), (out, lse)
  (_, (out, lse)), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
  return out, lse, grads


def _assert_all_close(got, want, dtype):
  tol = TOL[dtype]
  np.testing.assert_allclose(np.asarray(got[0], np.float32), np.asarray(want[0], np.float32),
                             atol=tol, rtol=tol, err_msg="out")
  lse, lse_ref = np.asarray(got[1]), np.asarray(want[1])
  np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(lse_ref))
  finite = np.isfinite(lse_ref)
  np.testing.assert_allclose(lse[finite], lse_ref[finite], atol=2e-5, rtol=2e-5)
  for name, g, w in zip(("dq", "dk", "dv"), got[2], want[2]):
    g = np.asarray(g, np.float32)
    assert np.all(np.isfinite(g)), name
    np.testing.assert_allclose(g, np.asarray(w, np.float32), atol=tol, rtol=tol, err_msg=name)


@functools.lru_cache
def _compressed(impl):
  q, kc, vc, _, _ = _inputs()
  fn = lambda q, k, v: nsa.compressed_attention(q, k, v, CFG, impl=impl, return_lse=True)
  return jax.jit(lambda *a: _value_and_grads(fn, *a))(q, kc, vc)


@pytest.mark.parametrize("impl", ["xla", *PALLAS])
def test_compressed_branch_matches_reference(impl):
  want = _compressed("reference")
  _assert_all_close(_compressed(impl), want, jnp.float32)
  # Queries before the end of the first compressed block (t < 7) see nothing.
  assert np.isneginf(np.asarray(want[1][:, :7])).all()
  assert np.isfinite(np.asarray(want[1][:, 7:])).all()


def _numpy_selection(q, k_cmp, cfg, t_len):
  """Block scores and top-n sets from scratch in float64 (eqs. 8-10 of the paper)."""
  q, k_cmp = np.asarray(q, np.float64), np.asarray(k_cmp, np.float64)
  b, t, h, d = q.shape
  nc, kh = k_cmp.shape[1], k_cmp.shape[2]
  g = h // kh
  nsel = -(-t_len // cfg.block_sel)
  ratio, span = cfg.block_sel // cfg.stride_cmp, cfg.block_cmp // cfg.stride_cmp
  scores = np.zeros((b, t, kh, nsel))
  chosen = {}
  for bi in range(b):
    for ti in range(t):
      visible = [c for c in range(nc) if c * cfg.stride_cmp + cfg.block_cmp - 1 <= ti]
      for ki in range(kh):
        p_cmp = np.zeros(nc)
        for hi in range(ki * g, (ki + 1) * g):
          if visible:
            logits = k_cmp[bi, visible, ki] @ q[bi, ti, hi] / np.sqrt(d)
            p = np.exp(logits - logits.max())
            p_cmp[visible] += p / p.sum()
        for j in range(nsel):
          scores[bi, ti, ki, j] = sum(p_cmp[ratio * j - m - n] for m in range(ratio)
                                      for n in range(span) if 0 <= ratio * j - m - n < nc)
        own = ti // cfg.block_sel
        ranked = np.array(scores[bi, ti, ki])
        ranked[[0] + [j for j in range(own - cfg.num_local + 1, own + 1) if j >= 0]] = np.inf
        ranked[own + 1:] = -np.inf
        order = [j for j in np.argsort(-ranked, kind="stable")[:cfg.num_sel]
                 if ranked[j] > -np.inf]
        chosen[bi, ti, ki] = set(order)
  return scores, chosen


def test_block_selection_matches_numpy():
  q, kc, _, _, _ = _inputs(seed=3)
  _, lse = jax.jit(lambda q, k: nsa.compressed_attention(
      q, k, k, CFG, impl="reference", return_lse=True))(q, kc)
  idx = np.asarray(jax.jit(lambda q, k, l: nsa.select_blocks(q, k, l, CFG))(q, kc, lse))
  scores, chosen = _numpy_selection(q, kc, CFG, T)
  ref_scores = jax.jit(lambda q, k: reference.selection_scores(q, k, CFG, T))(q, kc)
  np.testing.assert_allclose(np.asarray(ref_scores), scores, atol=1e-5)
  assert idx.shape == (B, T, K, CFG.num_sel) and idx.dtype == np.int32
  for (bi, ti, ki), want in chosen.items():
    row = idx[bi, ti, ki]
    assert set(row[row >= 0].tolist()) == want, (bi, ti, ki, row, want)
    assert np.all(row[len(want):] == -1)


@jax.jit
def _select(q, k_cmp):
  _, lse = nsa.compressed_attention(q, k_cmp, k_cmp, CFG, impl="xla", return_lse=True)
  return nsa.select_blocks(q, k_cmp, lse, CFG)


def test_selection_always_includes_first_and_local_blocks():
  q, kc, _, _, _ = _inputs(seed=4)
  idx = np.asarray(_select(q, kc))
  for ti in range(T):
    own = ti // CFG.block_sel
    for row in idx[:, ti].reshape(-1, CFG.num_sel):
      picked = row[row >= 0]
      assert len(set(picked.tolist())) == len(picked)  # distinct
      assert {0, own, max(own - 1, 0)} <= set(picked.tolist())
      assert picked.max() <= own  # never a block after the query's own
      assert len(picked) == min(CFG.num_sel, own + 1)


@functools.lru_cache
def _selected(impl, dtype):
  q, kc, _, k, v = _inputs(dtype, seed=5)
  idx = _select(q, kc)
  # Leave some slots empty too, as when fewer blocks are wanted than exist.
  idx = idx.at[:, ::3, :, -1].set(-1)
  fn = lambda q, k, v: nsa.selected_attention(q, k, v, idx, CFG, impl=impl, return_lse=True)
  return jax.jit(lambda *a: _value_and_grads(fn, *a))(q, k, v)


@pytest.mark.parametrize("impl, dtype", [("xla", jnp.float32), ("xla", jnp.bfloat16),
                                         *((p, d) for p in PALLAS
                                           for d in (jnp.float32, jnp.bfloat16))])
def test_selected_branch_matches_reference(impl, dtype):
  _assert_all_close(_selected(impl, dtype), _selected("reference", dtype), dtype)


def test_selected_branch_pallas_backward_is_kernels_not_a_scatter():
  q, kc, _, k, v = _inputs(seed=5)
  idx = _select(q, kc)
  loss = lambda q, k, v: jnp.sum(nsa.selected_attention(q, k, v, idx, CFG,
                                                         impl="pallas_interpret"))
  jaxpr = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v))
  for name in ("nsa_selected", "nsa_selected_dq", "nsa_selected_dkv"):
    assert f"name={name}" in jaxpr
  assert "scatter" not in jaxpr


def test_block_queries_inverts_the_selection():
  rng = np.random.default_rng(8)
  b, kh, t, n, nb = 2, 3, 11, 4, 5
  idx = np.full((b, kh, t, n), -1, np.int32)
  for bi in range(b):
    for ki in range(kh):
      for ti in range(t):
        chosen = rng.choice(nb, size=rng.integers(0, n + 1), replace=False)
        idx[bi, ki, ti, :len(chosen)] = chosen
  queries, ranges = (np.asarray(x) for x in nsa_pallas.block_queries(jnp.asarray(idx), nb))
  for bi in range(b):
    for ki in range(kh):
      for j in range(nb):
        lo, hi = ranges[bi, ki, j]
        want = [ti for ti in range(t) if j in idx[bi, ki, ti]]
        assert queries[bi, ki, lo:hi].tolist() == want, (bi, ki, j)


def test_sliding_branch_is_windowed_attention():
  q, _, _, k, v = _inputs(seed=6)
  fn = jax.jit(lambda q, k, v, impl: nsa.sliding_attention(q, k, v, CFG, impl=impl),
               static_argnums=3)
  np.testing.assert_allclose(fn(q, k, v, "xla"), fn(q, k, v, "reference"), atol=2e-5)


@pytest.mark.parametrize("kwargs, message", [
    (dict(block_cmp=30, stride_cmp=16), "block_cmp=30"),
    (dict(block_sel=40, stride_cmp=16), "block_sel=40"),
    (dict(block_sel=16, block_cmp=32), "block_sel=16"),
    (dict(num_sel=2, num_local=2), "num_sel=2"),
    (dict(window=0), "window=0"),
])
def test_bad_config_names_the_field(kwargs, message):
  with pytest.raises(ValueError, match=message):
    NSAConfig(**kwargs)


def test_bad_branch_inputs_name_the_argument():
  q, kc, vc, k, v = _inputs()
  with pytest.raises(ValueError, match="compressed tokens"):
    nsa.compressed_attention(q, kc[:, :-1], vc[:, :-1], CFG)
  with pytest.raises(ValueError, match="indices has shape"):
    nsa.selected_attention(q, k, v, jnp.zeros((B, T, 1, 4), jnp.int32), CFG)
  with pytest.raises(ValueError, match="multiple of KV heads"):
    nsa.selected_attention(q[:, :, :3], k, v, jnp.zeros((B, T, K, 4), jnp.int32), CFG)


def test_decode_of_one_query_equals_its_row_of_the_full_sequence():
  # Every branch has its own keys; the caches hold them head-major, padded to
  # whole selection blocks (75 -> 80), with noise beyond each row's length.
  rng = np.random.default_rng(11)
  q, kc, vc, ks, vs = _inputs(seed=3)
  kw, vw = _normal(rng, (B, T, K, D)), _normal(rng, (B, T, K, D))
  gates = jax.nn.sigmoid(_normal(rng, (B, T, H, 3)))
  full = nsa.nsa_attention(q, (kc, vc), (ks, vs), (kw, vw), gates, CFG, impl="reference")
  s = 80
  cache = lambda x: jnp.pad(x, ((0, 0), (0, s - T), (0, 0), (0, 0))).swapaxes(1, 2)
  nc = CFG.num_compressed(s)
  cmp = lambda x: jnp.pad(x, ((0, 0), (0, nc - x.shape[1]), (0, 0), (0, 0))).swapaxes(1, 2)
  noise = lambda x, n: jnp.where(jnp.arange(x.shape[2])[:, None] < n, x, 9.0)

  @jax.jit
  def decode(t):
    lengths = jnp.full((B,), t + 1)
    num_cmp = jnp.maximum((t + 1 - CFG.block_cmp) // CFG.stride_cmp + 1, 0)
    take = lambda x: jax.lax.dynamic_slice_in_dim(x, t, 1, axis=1)
    return nsa.nsa_decode(
        take(q), (noise(cmp(kc), num_cmp), noise(cmp(vc), num_cmp)), jnp.full((B,), num_cmp),
        (noise(cache(ks), t + 1), noise(cache(vs), t + 1)),
        (noise(cache(kw), t + 1), noise(cache(vw), t + 1)), lengths, take(gates), CFG)

  for t in (0, 6, 7, 15, 16, 40, 74):  # before / at the first compressed token, block edges
    np.testing.assert_allclose(np.asarray(decode(t))[:, 0], np.asarray(full)[:, t], atol=2e-5,
                               err_msg=f"position {t}")
