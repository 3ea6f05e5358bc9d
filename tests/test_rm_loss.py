"""The Plackett-Luce choice loss and its gradients against numpy; pooling; the reward model
on eight devices against one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlcode.parallel import sharding
from rlcode import optim
from rlcode.models import ModelConfig
from rlcode.rm import loss as rm_loss
from rlcode.rm.batch import ChoiceBatch
from rlcode.rm.model import HeadConfig, RewardModel, pool
from rlcode.rm.steps import make_update_step


def _numpy_nll_and_grad(scores, chosen):
  """Per row: -s[c] + log sum exp s, and its gradient softmax(s) - onehot(c), one at a time."""
  nll, grad = [], []
  for s, c in zip(scores.astype(np.float64), chosen):
    z = np.exp(s - s.max())
    nll.append(-s[c] + s.max() + np.log(z.sum()))
    g = z / z.sum()
    g[c] -= 1.0
    grad.append(g)
  return np.array(nll), np.array(grad)


@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_plackett_luce_loss_and_gradient_match_numpy(k):
  rng = np.random.default_rng(k)
  scores = rng.normal(size=(6, k)).astype(np.float32) * 3
  chosen = rng.integers(0, k, 6).astype(np.int32)
  valid = np.ones((6, k), np.float32)
  fn = lambda s: rm_loss.plackett_luce_loss(s, jnp.asarray(chosen), jnp.asarray(valid))
  loss, grad = jax.value_and_grad(fn)(jnp.asarray(scores))
  nll, g = _numpy_nll_and_grad(scores, chosen)
  np.testing.assert_allclose(float(loss), nll.mean(), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(grad), g / 6, rtol=1e-5, atol=1e-7)
  # Per row, lse - s_c in float32 is exact to about eps * |s| (|s| <= ~15 here), which is
  # all a near-certain choice's tiny loss can be resolved to.
  np.testing.assert_allclose(np.asarray(rm_loss.choice_nll(scores, chosen, valid)), nll,
                             rtol=1e-5, atol=15 * np.finfo(np.float32).eps)


def test_bradley_terry_is_plackett_luce_at_two():
  rng = np.random.default_rng(0)
  scores = jnp.asarray(rng.normal(size=(7, 2)).astype(np.float32))
  chosen = jnp.asarray(rng.integers(0, 2, 7).astype(np.int32))
  pl = lambda s: rm_loss.plackett_luce_loss(s, chosen, jnp.ones((7, 2)))
  other = 1 - chosen
  pick = lambda s, i: jnp.take_along_axis(s, i[:, None], axis=1)[:, 0]
  bt = lambda s: rm_loss.bradley_terry_loss(pick(s, chosen), pick(s, other))
  (l1, g1), (l2, g2) = jax.value_and_grad(pl)(scores), jax.value_and_grad(bt)(scores)
  np.testing.assert_allclose(float(l1), float(l2), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(g1), np.asarray(g2), rtol=1e-5, atol=1e-7)
  # And against the textbook formula, -log sigmoid(r_c - r_o), in numpy.
  s = np.asarray(scores, np.float64)
  d = s[np.arange(7), np.asarray(chosen)] - s[np.arange(7), np.asarray(other)]
  np.testing.assert_allclose(float(l1), np.mean(np.log1p(np.exp(-d))), rtol=1e-6)


def test_ragged_choices_and_padding_rows():
  # Choices of 2, 3 and 5 candidates padded to K = 5; whatever sits in the padding slots
  # (huge, -inf, NaN) never reaches the loss or the gradient, nor do padding rows.
  rng = np.random.default_rng(1)
  ks = [2, 3, 5, 4]
  scores = rng.normal(size=(4, 5)).astype(np.float32)
  chosen = np.array([1, 2, 4, 0], np.int32)
  valid = np.array([[j < k for j in range(5)] for k in ks], np.float32)
  weight = np.array([1, 1, 1, 0], np.float32)
  hostile = scores.copy()
  hostile[0, 2:] = [1e30, -np.inf, np.nan]
  hostile[1, 3:] = [np.inf, 1e30]
  hostile[3] = [np.nan, 1e30, 0, 0, 0]  # a padding row: weight 0
  fn = lambda s: rm_loss.plackett_luce_loss(s, jnp.asarray(chosen), jnp.asarray(valid),
                                            jnp.asarray(weight))
  loss, grad = jax.value_and_grad(fn)(jnp.asarray(hostile))
  expect, g = [], np.zeros((4, 5))
  for i, k in enumerate(ks[:3]):
    n, gi = _numpy_nll_and_grad(scores[i:i + 1, :k], chosen[i:i + 1])
    expect.append(n[0])
    g[i, :k] = gi[0] / 3
  np.testing.assert_allclose(float(loss), np.mean(expect), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(grad), g, rtol=1e-5, atol=1e-7)


def test_choice_accuracy_by_hand():
  scores = np.array([[0.1, 0.9, 0.0], [2.0, 1.0, 5.0], [1.0, 1.0, 0.0], [0.0, 3.0, 9.0]],
                    np.float32)
  valid = np.array([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0]], np.float32)
  chosen = np.array([1, 0, 1, 1], np.int32)
  # Row 2's tie goes to the first index (a miss); row 3's 9.0 sits in a padding slot.
  assert float(rm_loss.choice_accuracy(scores, chosen, valid)) == pytest.approx(0.5)
  assert float(rm_loss.choice_accuracy(scores, chosen, valid,
                                       np.array([1, 0, 0, 1], np.float32))) == 1.0


def test_pooling_against_numpy():
  rng = np.random.default_rng(2)
  h = rng.normal(size=(3, 8, 4)).astype(np.float32)
  start, length = np.array([2, 0, 5], np.int32), np.array([6, 3, 8], np.int32)
  last = np.asarray(pool(jnp.asarray(h), start, length, "last"))
  mean = np.asarray(pool(jnp.asarray(h), start, length, "mean"))
  for i in range(3):
    np.testing.assert_allclose(last[i], h[i, length[i] - 1])
    np.testing.assert_allclose(mean[i], h[i, start[i]:length[i]].mean(0), rtol=1e-6)


CFG = ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=1,
                  num_heads=2, num_kv_heads=2, max_seq_len=32)


def _batch(rows=8, k=3, length=12, features=2):
  rng = np.random.default_rng(3)
  start = rng.integers(3, 6, (rows, k)).astype(np.int32)
  return ChoiceBatch(
      tokens=rng.integers(0, 32, (rows, k, length)).astype(np.int32), start=start,
      length=(start + rng.integers(2, 6, (rows, k))).astype(np.int32),
      valid=np.array([[j < 2 + i % 2 for j in range(k)] for i in range(rows)], np.float32),
      chosen=(np.arange(rows) % 2).astype(np.int32), weight=np.ones((rows,), np.float32),
      features=rng.normal(size=(rows, k, features)).astype(np.float32))


@pytest.mark.slow
def test_reward_model_on_eight_devices_matches_one():
  head = HeadConfig(pooling="mean", hidden=16, features=("a", "b"))
  batch = _batch()
  runs = []
  for mesh in (sharding.make_mesh(1, 1, 1), sharding.make_mesh(2, 2, 2)):
    model = sharding.init_sharded(lambda: RewardModel(CFG, head, rngs=nnx.Rngs(0)), mesh)
    graphdef, _ = nnx.split(model, nnx.Param)
    opt = optim.make_optimizer(optim.OptimizerConfig(learning_rate=1e-2, warmup_steps=1,
                                                   decay_steps=10))
    state = optim.init_state(model, opt, mesh)
    if mesh.size == 8:  # parameters really are split: embed over fsdp, mlp over tensor
      spec = state.params["w_state"].get_value().sharding.spec
      assert tuple(spec) == ("fsdp", "tensor")
    update = make_update_step(graphdef, opt, mesh, state, batch)
    out = []
    for _ in range(2):
      state, m = update(state, batch)
      out.append((float(m["loss"]), float(m["accuracy"])))
    runs.append(out)
  np.testing.assert_allclose(runs[1], runs[0], atol=1e-5)
  assert runs[0][1][0] < runs[0][0][0]  # the loss goes down on a repeated batch
