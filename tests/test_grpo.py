"""GRPO's pieces against hand-computed numpy, and the jitted update's behaviour."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlcode.parallel import sharding
from rlcode import optim
from rlcode.rl import advantages
from rlcode.rl import grpo
from rlcode.rl import objective
from rlcode.rl import sequences
from rlcode.models import Decoder, ModelConfig

# Three completions, four target positions; row 2 has a single token.
LOGP = np.array([[-1.0, -0.5, -2.0, -0.1],
                 [-0.3, -1.2, -0.7, -0.9],
                 [-2.5, -0.2, -0.4, -1.1]], np.float32)
OLD = np.array([[-1.1, -0.5, -1.5, -0.1],
                [-0.3, -1.0, -0.9, -0.9],
                [-2.0, -0.2, -0.4, -1.1]], np.float32)
REF = np.array([[-0.9, -0.6, -2.2, -0.2],
                [-0.4, -1.1, -0.6, -1.0],
                [-2.4, -0.3, -0.5, -1.0]], np.float32)
MASK = np.array([[1, 1, 1, 0],
                 [1, 1, 1, 1],
                 [1, 0, 0, 0]], np.float32)
ADV = np.array([1.5, -0.5, 2.0], np.float32)


def _per_token_numpy(eps_low, eps_high, beta):
  """The GRPO objective written out one token at a time."""
  out = np.zeros_like(LOGP)
  for i in range(3):
    for t in range(4):
      r = np.exp(LOGP[i, t] - OLD[i, t])
      c = min(max(r, 1 - eps_low), 1 + eps_high)
      pg = -min(r * ADV[i], c * ADV[i])
      d = REF[i, t] - LOGP[i, t]
      out[i, t] = pg + beta * (np.exp(d) - d - 1)
  return out


@pytest.mark.parametrize("aggregation", sorted(objective.AGGREGATIONS))
@pytest.mark.parametrize("eps_low,eps_high,beta", [(0.2, 0.2, 0.0), (0.1, 0.28, 0.04)])
def test_policy_loss_matches_numpy(aggregation, eps_low, eps_high, beta):
  cfg = objective.LossConfig(clip_eps_low=eps_low, clip_eps_high=eps_high, beta=beta,
                        aggregation=aggregation, max_completion_len=6)
  loss, metrics = objective.policy_loss(jnp.asarray(LOGP), jnp.asarray(OLD), jnp.asarray(ADV),
                                   jnp.asarray(MASK), cfg, ref_logp_nt=jnp.asarray(REF))
  per_tok = _per_token_numpy(eps_low, eps_high, beta)
  if aggregation == "seq_mean_token_mean":
    expect = np.mean([sum(per_tok[i, t] * MASK[i, t] for t in range(4)) / MASK[i].sum()
                      for i in range(3)])
  elif aggregation == "token_mean":
    expect = sum(per_tok[i, t] * MASK[i, t] for i in range(3) for t in range(4)) / MASK.sum()
  else:  # Dr.GRPO: token sums over one constant, the generation budget (6), per sequence
    expect = sum(per_tok[i, t] * MASK[i, t] for i in range(3) for t in range(4)) / (3 * 6)
  np.testing.assert_allclose(float(loss), expect, rtol=1e-6, atol=1e-7)
  # The KL metric is reported whenever reference log-probs are given, beta = 0 included.
  kl = [np.exp(REF[i, t] - LOGP[i, t]) - (REF[i, t] - LOGP[i, t]) - 1
        for i in range(3) for t in range(4) if MASK[i, t]]
  np.testing.assert_allclose(float(metrics["kl"]), np.mean(kl), rtol=1e-5)  # float32 sums
  if not beta:
    _, without = objective.policy_loss(jnp.asarray(LOGP), jnp.asarray(OLD), jnp.asarray(ADV),
                                  jnp.asarray(MASK), cfg)
    assert "kl" not in without
  ratios = np.exp(LOGP - OLD)[MASK > 0]
  clipped = (ratios < 1 - eps_low) | (ratios > 1 + eps_high)
  np.testing.assert_allclose(float(metrics["clip_frac"]), clipped.mean(), rtol=1e-6)


@pytest.mark.parametrize("aggregation", sorted(objective.AGGREGATIONS))
def test_masked_positions_never_reach_exp(aggregation):
  # Where the mask is 0 (prompt, padding) the batch may hold anything: -inf log-probs,
  # huge reference or behaviour log-probs. Loss, metrics and gradients must equal those
  # of a batch with benign values there (inf * 0 is NaN if exp runs first).
  cfg = objective.LossConfig(clip_eps_low=0.1, clip_eps_high=0.28, beta=0.04,
                        aggregation=aggregation, max_completion_len=6)
  masked = MASK == 0
  hostile = (np.where(masked, -np.inf, LOGP), np.where(masked, 1e30, OLD),
             np.where(masked, 1e30, REF))

  def run(logp, old, ref):
    fn = lambda lp: objective.policy_loss(lp, jnp.asarray(old), jnp.asarray(ADV), jnp.asarray(MASK),
                                     cfg, ref_logp_nt=jnp.asarray(ref))
    (loss, metrics), grad = jax.value_and_grad(fn, has_aux=True)(jnp.asarray(logp))
    return float(loss), {k: float(v) for k, v in metrics.items()}, np.asarray(grad)

  loss, metrics, grad = run(LOGP, OLD, REF)
  bad_loss, bad_metrics, bad_grad = run(*hostile)
  assert np.isfinite(bad_loss) and bad_loss == loss
  assert bad_metrics == metrics
  assert np.all(np.isfinite(bad_grad))
  np.testing.assert_array_equal(bad_grad, grad)
  assert np.all(grad[masked] == 0)


def test_advantages_match_numpy():
  rewards = np.array([1, 0, 0, 1, 0, 0, 0, 0, 0.5, 1.0, 0.0, 0.25], np.float32)
  got = advantages.group_advantages(rewards, 4, "grpo")
  got_dr = advantages.group_advantages(rewards, 4, "dr_grpo")
  for g in range(3):
    r = rewards[4 * g:4 * g + 4]
    mean = sum(r) / 4
    std = np.sqrt(sum((x - mean) ** 2 for x in r) / 4)
    np.testing.assert_allclose(got[4 * g:4 * g + 4], (r - mean) / (std + 1e-6), rtol=1e-5)
    np.testing.assert_allclose(got_dr[4 * g:4 * g + 4], r - mean, rtol=1e-6)
  assert np.all(got[4:8] == 0)  # a group that all failed carries no signal
  # negative_weight scales the samples below their group's mean, and only those.
  for w in (0.0, 0.25):
    weighted = advantages.group_advantages(rewards, 4, "grpo", negative_weight=w)
    np.testing.assert_allclose(weighted, [a * w if a < 0 else a for a in got], rtol=1e-6)
  np.testing.assert_allclose(advantages.group_advantages(rewards, 4, negative_weight=0.0)[:4],
                             [1.0, 0.0, 0.0, 1.0], rtol=1e-5)  # (1 - 0.5) / 0.5
  with pytest.raises(ValueError, match="negative_weight"):
    advantages.group_advantages(rewards, 4, negative_weight=1.5)
  with pytest.raises(ValueError, match="groups of 5"):
    advantages.group_advantages(rewards, 5)
  with pytest.raises(KeyError, match="known"):
    advantages.group_advantages(rewards, 4, "ppo")


def test_unknown_aggregation_names_the_known_ones():
  with pytest.raises(KeyError, match="seq_mean_token_mean"):
    objective.LossConfig(aggregation="mean")


def test_learning_rate_schedules_match_hand_values():
  # optax counts from 0; make_optimizer's update k (from 1) uses the rate at count k.
  peak, end = 3e-3, 3e-4
  wsd = optim.learning_rate_schedule(optim.OptimizerConfig(
      learning_rate=peak, warmup_steps=20, decay_steps=600, schedule="wsd",
      cooldown_steps=150))
  hand = {0: 0.0, 10: peak / 2, 20: peak, 300: peak, 450: peak,
          525: peak + (end - peak) * 75 / 150, 600: end, 900: end}
  for count, rate in hand.items():
    np.testing.assert_allclose(float(wsd(count)), rate, rtol=1e-6, atol=1e-12)
  cosine = optim.learning_rate_schedule(optim.OptimizerConfig(
      learning_rate=peak, warmup_steps=20, decay_steps=1000))
  for count in (20, 500, 1000):
    frac = (count - 20) / 980
    np.testing.assert_allclose(float(cosine(count)),
                               end + (peak - end) * 0.5 * (1 + np.cos(np.pi * frac)), rtol=1e-5)
  with pytest.raises(ValueError, match="cooldown_steps"):
    optim.OptimizerConfig(learning_rate=1e-3, warmup_steps=20, decay_steps=100,
                         schedule="wsd", cooldown_steps=0)
  with pytest.raises(ValueError, match="schedule"):
    optim.OptimizerConfig(learning_rate=1e-3, schedule="linear")


CFG = ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=1,
                  num_heads=2, num_kv_heads=1, max_seq_len=32)


def _setup(mesh, lr=1e-2):
  model = sharding.init_sharded(lambda: Decoder(CFG, rngs=nnx.Rngs(0)), mesh)
  graphdef, params = nnx.split(model, nnx.Param)
  opt_cfg = optim.OptimizerConfig(learning_rate=lr, warmup_steps=1, decay_steps=10)
  optimizer = optim.make_optimizer(opt_cfg)
  state = optim.init_state(model, optimizer, mesh)
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 32, (8, 12)).astype(np.int32)
  # Prompts of 6 tokens, completions of 6: the window is target positions 5..10.
  mask = np.ones((8, 6), np.float32)
  batch = sequences.SequenceBatch(tokens=tokens, start=np.full((8,), 5, np.int32), mask=mask,
                             old_logp=np.zeros_like(mask), ref_logp=np.zeros_like(mask),
                             adv=np.array([1, -1] * 4, np.float32), weight=np.ones_like(mask))
  cfg = objective.LossConfig(max_completion_len=6)
  update = grpo.make_update_step(graphdef, optimizer, cfg, mesh, state, batch)
  return graphdef, state, batch, update, cfg


def test_update_is_one_jit_and_old_logp_makes_ratio_one():
  mesh = sharding.make_mesh(1, 1, 1)
  graphdef, state, batch, update, cfg = _setup(mesh)
  logp, _ = jax.jit(lambda p, b: sequences.sequence_logprobs(nnx.merge(graphdef, p), b, 1.0))(
      state.params, batch)
  batch.old_logp = np.asarray(logp) * batch.mask
  before = jax.tree.map(np.asarray, state.params)
  state, m = update(state, batch)
  assert float(m["skipped"]) == 0 and int(state.step) == 1
  np.testing.assert_allclose(float(m["ratio"]), 1.0, rtol=1e-5)
  np.testing.assert_allclose(float(m["clip_frac"]), 0.0)
  moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - b).max()), state.params, before)
  assert max(jax.tree.leaves(moved)) > 0


def test_nonfinite_loss_skips_the_update():
  mesh = sharding.make_mesh(1, 1, 1)
  _, state, batch, update, _ = _setup(mesh)
  batch.old_logp = np.full_like(batch.old_logp, np.nan)
  before = jax.tree.map(np.asarray, state.params)
  state, m = update(state, batch)
  assert float(m["skipped"]) == 1 and int(state.step) == 0
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(before)):
    np.testing.assert_array_equal(np.asarray(a), b)


def test_update_on_eight_devices_matches_one():
  losses = []
  for mesh in (sharding.make_mesh(1, 1, 1), sharding.make_mesh(2, 2, 2)):
    _, state, batch, update, _ = _setup(mesh)
    out = []
    for _ in range(3):
      state, m = update(state, batch)
      out.append(float(m["loss"]))
    losses.append(out)
  np.testing.assert_allclose(losses[1], losses[0], atol=1e-5)


def test_window_logprobs_equal_full_logits_at_each_rows_completion():
  """Rows with prompts of different lengths: the windowed output layer gives, at each
  completion position, numpy's log-softmax of the full forward's logits (temperature 0.7),
  and the entropy of that distribution."""
  model = Decoder(CFG, rngs=nnx.Rngs(3))
  rng = np.random.default_rng(1)
  tokens = rng.integers(0, CFG.vocab_size, (3, 14)).astype(np.int32)
  start = np.array([2, 5, 9], np.int32)
  w = 4
  mask = np.ones((3, w), np.float32)
  batch = sequences.SequenceBatch(tokens=tokens, start=start, mask=mask, old_logp=mask,
                             ref_logp=mask, adv=np.zeros(3, np.float32), weight=mask)
  logp, ent = jax.jit(lambda b: sequences.sequence_logprobs(model, b, 0.7))(batch)
  logits = np.asarray(jax.jit(model)(jnp.asarray(tokens)), np.float64) / 0.7
  logits -= logits.max(-1, keepdims=True)
  log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  for i in range(3):
    for j in range(w):
      pos = start[i] + j
      np.testing.assert_allclose(float(logp[i, j]), log_softmax[i, pos, tokens[i, pos + 1]],
                                 atol=1e-5)
      p = np.exp(log_softmax[i, pos])
      np.testing.assert_allclose(float(ent[i, j]), -(p * log_softmax[i, pos]).sum(), atol=1e-5)
