"""The NSA model layer: same output through every implementation, gradients reach
every parameter, parameters carry logical axis names."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlcode.kernels.spec import NSAConfig
from rlcode.models import rope as rope_lib
from rlcode.models.nsa import NSAAttention

CFG = NSAConfig(block_cmp=8, stride_cmp=4, block_sel=16, num_sel=4, window=12,
                compress_hidden=32, block_q=8)
AXES = {"embed", "heads", "kv_heads", "head_dim", "mlp", None}


def _layer(impl, qkv_bias=True, dtype=jnp.float32):
  return NSAAttention(hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8, nsa=CFG,
                      qkv_bias=qkv_bias, param_dtype=jnp.float32,
                      dtype=dtype, impl=impl, rngs=nnx.Rngs(0))


def _batch(t=45):
  x = jnp.asarray(np.random.default_rng(0).standard_normal((2, t, 32)), jnp.float32)
  positions = jnp.broadcast_to(jnp.arange(t), (2, t))
  return x, rope_lib.table(positions, rope_lib.frequencies(8, 10000.0))


@nnx.jit
def _loss_and_grads(layer, x, rope):
  def loss(layer):
    y, _ = layer(x, rope)
    return jnp.sum(y.astype(jnp.float32) ** 2), y
  (_, y), grads = nnx.value_and_grad(loss, has_aux=True)(layer)
  return y, grads


@pytest.mark.slow
def test_layer_matches_reference_and_every_parameter_gets_a_gradient():
  x, rope = _batch()
  y_ref, g_ref = _loss_and_grads(_layer("reference"), x, rope)
  y, grads = _loss_and_grads(_layer("xla"), x, rope)
  assert y.shape == x.shape
  np.testing.assert_allclose(y, y_ref, atol=2e-5, rtol=2e-5)
  flat, flat_ref = nnx.to_flat_state(grads), dict(nnx.to_flat_state(g_ref))
  assert {path for path, _ in flat} == set(flat_ref)
  for path, g in flat:
    g = np.asarray(g[...])
    assert np.all(np.isfinite(g)), path
    assert np.abs(g).max() > 0, f"no gradient reaches {path}"
    np.testing.assert_allclose(g, np.asarray(flat_ref[path][...]), atol=2e-5, rtol=2e-4,
                               err_msg=str(path))


def test_parameters_name_their_logical_axes():
  layer = _layer("xla")
  params = nnx.to_flat_state(nnx.state(layer, nnx.Param))
  assert len(params) == 12
  for path, param in params:
    axes = param.get_metadata()["axes"]
    assert len(axes) == param[...].ndim, path
    assert set(axes) <= AXES, path


def test_sequence_shorter_than_a_compressed_block():
  x, rope = _batch(t=5)
  y = nnx.jit(lambda layer, x, r: layer(x, r)[0])(_layer("xla", qkv_bias=False), x, rope)
  assert y.shape == x.shape and np.all(np.isfinite(np.asarray(y)))


def test_rope_rotates_half_pairs():
  x = jnp.asarray(np.arange(8, dtype=np.float32).reshape(1, 1, 1, 8))
  table = rope_lib.table(jnp.array([[3]]), rope_lib.frequencies(8, 10000.0))
  got = np.asarray(rope_lib.apply(x, table))[0, 0, 0]
  inv = 1.0 / 10000.0 ** (np.arange(0, 8, 2) / 8)
  cos, sin = np.cos(3 * inv), np.sin(3 * inv)
  xs = np.arange(8, dtype=np.float64)
  want = np.concatenate([xs[:4] * cos - xs[4:] * sin, xs[4:] * cos + xs[:4] * sin])
  np.testing.assert_allclose(got, want, atol=1e-5)


def test_bad_head_counts_are_rejected():
  with pytest.raises(ValueError, match="num_heads=3"):
    NSAAttention(hidden_size=32, num_heads=3, num_kv_heads=2, head_dim=8, nsa=CFG,
                 qkv_bias=False, param_dtype=jnp.float32, dtype=jnp.float32,
                 impl="xla", rngs=nnx.Rngs(0))
