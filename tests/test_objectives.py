"""The objectives (GSPO, GSPO-token, CISPO), the importance corrections (truncated and
masked IS, per token and per sequence) and DAPO's overlong shaping, each against numpy
written out here; the config keys that select them."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import tiny_runs
from rlcode import cli
from rlcode.config import rl as rl_config
from rlcode.models import Decoder, ModelConfig
from rlcode.parallel import sharding
from rlcode.rl import algorithm, correction, grpo, objective, overlong, rollout, sequences
from rlcode.sampling import Generation
from rlcode.train import grpo_loop

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRPO = os.path.join(ROOT, "configs", "grpo_tiny.py")

# Five rows, five target positions; row 3 trains nothing. Each row's mean log-ratio sits
# clearly inside or outside GSPO's clip range [0.8, 1.28], and CISPO's weights cross both of
# its bounds (r = e^2 > 6, r = e^-2 < 0.5), so no value sits on a kink of a clip.
MASK = np.array([[1, 1, 1, 0, 0],
                 [1, 1, 1, 1, 1],
                 [1, 1, 0, 0, 0],
                 [0, 0, 0, 0, 0],
                 [1, 1, 1, 1, 0]], np.float64)
OLD = np.array([[-1.0, -0.6, -2.0, -0.3, -0.2],
                [-0.4, -1.1, -0.7, -0.8, -1.3],
                [-2.2, -0.3, -0.5, -1.0, -0.9],
                [-0.5, -0.5, -0.5, -0.5, -0.5],
                [-0.9, -1.4, -0.2, -0.6, -0.4]])
LOG_RATIO = np.array([[0.05, 0.10, -0.09, 0.0, 0.0],    # mean 0.02: inside
                      [0.50, 0.40, 0.70, 0.45, 0.55],   # mean 0.52: above
                      [2.00, -0.30, 0.0, 0.0, 0.0],     # mean 0.85: above
                      [0.0, 0.0, 0.0, 0.0, 0.0],
                      [-0.50, -2.00, 0.10, -0.20, 0.0]])  # mean -0.65: below
LOGP = OLD + LOG_RATIO
ADV = np.array([1.5, -0.7, 0.9, 0.3, -1.2])
WEIGHT = np.array([[1.0, 0.5, 1.5, 1.0, 1.0],
                   [0.8, 1.2, 1.0, 0.9, 1.1],
                   [1.3, 0.7, 1.0, 1.0, 1.0],
                   [1.0, 1.0, 1.0, 1.0, 1.0],
                   [0.6, 1.4, 1.0, 0.9, 1.0]])
REF = OLD + np.array([[0.1, -0.2, 0.05, 0.0, 0.0]] * 5)
EPS_LOW, EPS_HIGH, MAX_LEN = 0.2, 0.28, 7


def _coefficients(aggregation):
  """What each token's loss is multiplied by in the batch's loss, [N, W]."""
  lengths = MASK.sum(1, keepdims=True)
  if aggregation == "seq_mean_token_mean":
    return MASK / np.maximum(lengths, 1) / (lengths > 0).sum()
  if aggregation == "token_mean":
    return MASK / MASK.sum()
  return MASK / (MASK.shape[0] * MAX_LEN)  # seq_mean_token_sum_norm


def _clip(x, low, high):
  return min(max(x, low), high)


def _numpy_loss(name, logp, weight, aggregation, beta=0.0, cispo_low=None, cispo_high=5.0):
  """The batch's loss, token by token, in float64."""
  c = _coefficients(aggregation)
  total = 0.0
  for i in range(MASK.shape[0]):
    n = int(MASK[i].sum())
    s = np.exp(sum(logp[i, t] - OLD[i, t] for t in range(n)) / max(n, 1))
    for t in range(n):
      r = np.exp(logp[i, t] - OLD[i, t])
      if name == "ppo":
        surrogate = min(r * ADV[i], _clip(r, 1 - EPS_LOW, 1 + EPS_HIGH) * ADV[i])
      elif name in ("gspo", "gspo_token"):  # the same value
        surrogate = min(s * ADV[i], _clip(s, 1 - EPS_LOW, 1 + EPS_HIGH) * ADV[i])
      else:  # cispo
        low = 0.0 if cispo_low is None else 1 - cispo_low
        surrogate = _clip(r, low, 1 + cispo_high) * ADV[i] * logp[i, t]
      d = REF[i, t] - logp[i, t]
      total += c[i, t] * (-weight[i, t] * surrogate + beta * (np.exp(d) - d - 1))
  return total


def _finite_difference(fn, x, h=1e-6):
  grad = np.zeros_like(x)
  for idx in np.ndindex(*x.shape):
    up, down = x.copy(), x.copy()
    up[idx] += h
    down[idx] -= h
    grad[idx] = (fn(up) - fn(down)) / (2 * h)
  return grad


def _analytic_grad(name, aggregation, weight, cispo_low=None, cispo_high=5.0):
  """The gradient of the stop-gradient objectives (no KL term), in float64."""
  c = _coefficients(aggregation)
  grad = np.zeros_like(LOGP)
  for i in range(MASK.shape[0]):
    n = int(MASK[i].sum())
    s = np.exp(LOG_RATIO[i, :n].sum() / max(n, 1))
    for t in range(n):
      if name == "gspo_token":  # d s_t / d logp_t = s; min() passes A on the unclipped side
        unclipped = s * ADV[i] <= _clip(s, 1 - EPS_LOW, 1 + EPS_HIGH) * ADV[i]
        grad[i, t] = -c[i, t] * weight[i, t] * (ADV[i] if unclipped else 0.0) * s
      else:  # cispo: sg(w) A d logp
        low = 0.0 if cispo_low is None else 1 - cispo_low
        w = _clip(np.exp(LOG_RATIO[i, t]), low, 1 + cispo_high)
        grad[i, t] = -c[i, t] * weight[i, t] * w * ADV[i]
  return grad


def _jax_loss(cfg, logp, weight=WEIGHT, totals=None, rows=slice(None), ref=REF):
  f32 = lambda x: jnp.asarray(x[rows], jnp.float32)
  return objective.policy_loss(logp, f32(OLD), f32(ADV), f32(MASK), cfg,
                               ref_logp_nt=None if ref is None else f32(ref),
                               weight_nt=f32(weight), totals=totals)


def _cfg(name, aggregation, beta=0.0, **kw):
  return objective.LossConfig(clip_eps_low=EPS_LOW, clip_eps_high=EPS_HIGH, beta=beta,
                              aggregation=aggregation, max_completion_len=MAX_LEN,
                              objective=name, **kw)


def _value_and_grad(cfg, weight=WEIGHT, logp=LOGP):
  fn = lambda lp: _jax_loss(cfg, lp, weight)
  (loss, metrics), grad = jax.value_and_grad(fn, has_aux=True)(jnp.asarray(logp, jnp.float32))
  return float(loss), jax.device_get(metrics), np.asarray(grad, np.float64)


@pytest.mark.parametrize("aggregation", sorted(objective.AGGREGATIONS))
@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_gspo_loss_and_gradient_match_numpy(aggregation, beta):
  loss, metrics, grad = _value_and_grad(_cfg("gspo", aggregation, beta))
  want = _numpy_loss("gspo", LOGP, WEIGHT, aggregation, beta)
  np.testing.assert_allclose(loss, want, rtol=2e-6, atol=1e-7)
  # GSPO has no stop-gradient: its gradient is that of its value.
  fd = _finite_difference(lambda lp: _numpy_loss("gspo", lp, WEIGHT, aggregation, beta), LOGP)
  np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=1e-6)
  assert np.all(grad[MASK == 0] == 0)
  # The ratio metric is each token's sequence ratio; clipped tokens are those whose
  # sequence ratio is outside the range: rows 1, 2 and 4 (11 of 14 trained tokens).
  s = np.exp((LOG_RATIO * MASK).sum(1) / np.maximum(MASK.sum(1), 1))
  per_token = np.repeat(s, MASK.sum(1).astype(int))
  np.testing.assert_allclose(metrics["ratio"], per_token.mean(), rtol=1e-6)
  np.testing.assert_allclose(metrics["clip_frac"], 11 / 14, rtol=1e-6)


@pytest.mark.parametrize("aggregation", sorted(objective.AGGREGATIONS))
def test_gspo_token_has_gspos_value_and_a_per_token_gradient(aggregation):
  loss, metrics, grad = _value_and_grad(_cfg("gspo_token", aggregation))
  np.testing.assert_allclose(loss, _numpy_loss("gspo", LOGP, WEIGHT, aggregation),
                             rtol=2e-6, atol=1e-7)
  np.testing.assert_allclose(grad, _analytic_grad("gspo_token", aggregation, WEIGHT),
                             rtol=1e-5, atol=1e-7)
  gspo_metrics = _value_and_grad(_cfg("gspo", aggregation))[1]
  for key in ("ratio", "clip_frac", "pg_loss"):
    np.testing.assert_allclose(metrics[key], gspo_metrics[key], rtol=1e-6)
  # With a weight that is constant along each row, GSPO-token's gradient is GSPO's (the
  # paper's identity when every token of a sequence has the sequence's advantage).
  row_weight = np.repeat(WEIGHT[:, :1], WEIGHT.shape[1], 1)
  np.testing.assert_allclose(_value_and_grad(_cfg("gspo_token", aggregation), row_weight)[2],
                             _value_and_grad(_cfg("gspo", aggregation), row_weight)[2],
                             rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("aggregation", sorted(objective.AGGREGATIONS))
@pytest.mark.parametrize("cispo_low,cispo_high", [(None, 5.0), (0.5, 0.28)])
def test_cispo_loss_and_gradient_match_numpy(aggregation, cispo_low, cispo_high):
  cfg = _cfg("cispo", aggregation, cispo_clip_low=cispo_low, cispo_clip_high=cispo_high)
  loss, metrics, grad = _value_and_grad(cfg)
  want = _numpy_loss("cispo", LOGP, WEIGHT, aggregation, cispo_low=cispo_low,
                     cispo_high=cispo_high)
  np.testing.assert_allclose(loss, want, rtol=2e-6, atol=1e-7)
  np.testing.assert_allclose(grad, _analytic_grad("cispo", aggregation, WEIGHT, cispo_low,
                                                  cispo_high), rtol=1e-5, atol=1e-7)
  r = np.exp(LOG_RATIO)[MASK > 0]
  low = 0.0 if cispo_low is None else 1 - cispo_low
  np.testing.assert_allclose(metrics["ratio"], r.mean(), rtol=1e-6)
  np.testing.assert_allclose(metrics["clip_frac"], ((r < low) | (r > 1 + cispo_high)).mean(),
                             rtol=1e-6)
  # Every token keeps a gradient, the clipped ones included (PPO's clip zeroes them).
  assert np.all(grad[(MASK > 0) & (ADV[:, None] != 0)] != 0)


@pytest.mark.parametrize("aggregation", sorted(objective.AGGREGATIONS))
@pytest.mark.parametrize("name", sorted(objective.OBJECTIVES))
def test_micro_batches_sum_to_the_whole_batch(name, aggregation):
  """Each objective through Totals: two micro-batches' shares of the loss, metrics and
  gradient add up to the whole batch's."""
  cfg = _cfg(name, aggregation, beta=0.05)
  logp = jnp.asarray(LOGP, jnp.float32)
  (loss, metrics), grad = jax.value_and_grad(lambda lp: _jax_loss(cfg, lp), has_aux=True)(logp)
  totals = objective.Totals.of(jnp.asarray(MASK, jnp.float32))
  parts = [jax.value_and_grad(
      lambda lp, rows=rows: _jax_loss(cfg, lp, WEIGHT, totals, rows), has_aux=True)(
          logp[rows]) for rows in (slice(0, 2), slice(2, 5))]
  np.testing.assert_allclose(sum(float(p[0][0]) for p in parts), float(loss), rtol=1e-5)
  for key in metrics:
    np.testing.assert_allclose(sum(float(p[0][1][key]) for p in parts), float(metrics[key]),
                               rtol=1e-5, atol=1e-7, err_msg=key)
  np.testing.assert_allclose(np.concatenate([p[1] for p in parts]), grad, rtol=1e-5,
                             atol=1e-8)


def test_masked_positions_never_reach_the_objectives():
  masked = MASK == 0
  for name in sorted(objective.OBJECTIVES):
    cfg = _cfg(name, "token_mean", beta=0.05)
    loss, metrics, grad = _value_and_grad(cfg)
    hostile = np.where(masked, -np.inf, LOGP)
    bad_loss, bad_metrics, bad_grad = _value_and_grad(cfg, logp=hostile)
    assert bad_loss == loss and np.all(np.isfinite(bad_grad)), name
    np.testing.assert_array_equal(bad_grad, grad)
    assert {k: float(v) for k, v in bad_metrics.items()} == {
        k: float(v) for k, v in metrics.items()}


def test_ppo_is_the_default_objective():
  assert objective.LossConfig().objective == "ppo"
  cfg = _cfg("ppo", "token_mean", beta=0.05)
  loss, _, _ = _value_and_grad(cfg)
  np.testing.assert_allclose(loss, _numpy_loss("ppo", LOGP, WEIGHT, "token_mean", 0.05),
                             rtol=2e-6)
  with pytest.raises(KeyError, match="cispo"):
    objective.LossConfig(objective="grpo")


# --------------------------------------------------------------------------- corrections

BEHAVIOUR = OLD
# Token ratios on both sides of [0.8, 1.5]; at sequence level row 1's geometric mean is
# below it (0.78) and row 2's above (1.73).
RECOMPUTED = OLD + np.array([[0.10, -0.05, 0.90, 0.0, 0.0],
                             [-0.90, -0.30, 0.03, -0.10, 0.05],
                             [0.60, 0.50, 0.0, 0.0, 0.0],
                             [0.0, 0.0, 0.0, 0.0, 0.0],
                             [0.01, -0.02, 0.80, -0.05, 0.0]])


def _numpy_correction(mode, level, cap, low, rows):
  """(weight, mask, metrics) written out row by row."""
  weight, mask = np.ones_like(MASK), MASK.copy()
  truncated = masked = 0
  kl, ratios = [], []
  for i in range(MASK.shape[0]):
    n = int(MASK[i].sum())
    if not rows[i] or n == 0:
      continue
    d = [RECOMPUTED[i, t] - BEHAVIOUR[i, t] for t in range(n)]
    kl += [np.exp(x) - x - 1 for x in d]
    seq = np.exp(np.mean(d))
    for t in range(n):
      r = seq if level == "sequence" else np.exp(d[t])
      ratios.append(r)
      if mode == "tis":
        weight[i, t] = min(r, cap)
        truncated += r > cap
      elif low <= r <= cap:
        weight[i, t] = r
      else:
        weight[i, t], mask[i, t] = 0.0, 0.0
        masked += 1
  trained = MASK.sum()
  kept = mask > 0
  return weight, mask, {
      "iw_clip_frac": truncated / trained, "iw_mean": weight[kept].mean(),
      "mismatch_kl": np.mean(kl), "mismatch_ratio_max": max(ratios),
      "mismatch_masked_frac": masked / trained}


@pytest.mark.parametrize("mode", correction.MODES)
@pytest.mark.parametrize("level", correction.LEVELS)
@pytest.mark.parametrize("rows", [(1, 1, 1, 1, 1), (1, 0, 1, 0, 0)])
def test_corrections_match_numpy(mode, level, rows):
  cap, low = 1.5, 0.8
  rows = np.array(rows, bool)
  c = correction.Correction(mode, level, cap, low, every_row=True)
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  weight, mask, metrics = jax.device_get(correction.correct(
      f32(RECOMPUTED), f32(BEHAVIOUR), f32(MASK), jnp.asarray(rows), c))
  want_w, want_mask, want_metrics = _numpy_correction(mode, level, cap, low, rows)
  valid = want_mask > 0
  np.testing.assert_allclose(weight[valid], want_w[valid], rtol=1e-5)
  np.testing.assert_array_equal(mask, want_mask)
  for key, value in want_metrics.items():
    np.testing.assert_allclose(metrics[key], value, rtol=1e-5, atol=1e-7, err_msg=key)
  # The data reach each branch: something truncated (tis) or masked (mis).
  assert (metrics["iw_clip_frac"] if mode == "tis" else metrics["mismatch_masked_frac"]) > 0


def test_corrections_refuse_bad_bounds():
  with pytest.raises(ValueError, match="rollout_correction_cap"):
    correction.Correction("tis", "token", 0.9, every_row=True)
  with pytest.raises(ValueError, match="rollout_correction_low"):
    correction.Correction("mis", "token", 2.0, 1.5, every_row=True)
  with pytest.raises(ValueError, match="max_importance_weight"):
    correction.Correction.decoupled(0.5)


CFG = ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                  num_kv_heads=1, head_dim=16, max_seq_len=64, attn_impl="reference")


def test_rollout_correction_recomputes_every_row_and_masks():
  """make_proximal_fn with a sequence-level mis correction: every row's old log-probs
  become the trainer's, and the rows whose geometric-mean ratio leaves [low, cap] are
  masked out whole."""
  mesh = sharding.make_mesh(1, 1, 1)
  model = sharding.init_sharded(lambda: Decoder(CFG, rngs=nnx.Rngs(0)), mesh)
  graphdef, params = nnx.split(model, nnx.Param)
  rng = np.random.default_rng(3)
  batch = sequences.sequence_batch([list(rng.integers(3, 32, 6)) for _ in range(2)],
                                   [list(rng.integers(3, 32, n)) for n in (4, 6, 2, 5)],
                                   [0, 0, 1, 1], pad_id=0)
  prox = np.asarray(jax.jit(lambda p, b: sequences.sequence_logprobs(
      nnx.merge(graphdef, p), b, 1.0)[0])(params, batch))
  shift = np.array([0.05, 1.0, -0.02, -1.0], np.float32)[:, None]  # rows 1 and 3 leave
  batch.old_logp = ((prox - shift) * batch.mask).astype(np.float32)
  c = correction.Correction("mis", "sequence", 1.5, 0.7, every_row=True)
  fn = grpo.make_proximal_fn(graphdef, mesh, 1.0, c, rows=4)
  old, weight, mask, metrics = jax.device_get(fn(params, batch, np.ones(4, bool)))
  valid = batch.mask > 0
  np.testing.assert_allclose(old[valid], prox[valid], rtol=1e-6)
  np.testing.assert_array_equal(mask.any(1), [True, False, True, False])
  np.testing.assert_allclose(weight[0, :4], np.exp(0.05), rtol=1e-5)
  np.testing.assert_allclose(metrics["mismatch_masked_frac"], (6 + 5) / 17, rtol=1e-6)
  np.testing.assert_allclose(metrics["mismatch_ratio_max"], np.e, rtol=1e-5)


# --------------------------------------------------------------------------- overlong


def _dapo_penalty(length, l_max, l_cache, factor):
  """DAPO's R_length (its equation 13), times the factor."""
  if length <= l_max - l_cache:
    return 0.0
  if length <= l_max:
    return ((l_max - l_cache) - length) / l_cache * factor
  return -factor


def test_overlong_penalty_matches_dapo():
  lengths = np.arange(0, 23)
  for buffer, factor in ((4, 1.0), (8, 0.5), (20, 2.0)):
    shaping = overlong.Overlong(max_len=20, buffer=buffer, factor=factor)
    want = [_dapo_penalty(n, 20, buffer, factor) for n in lengths]
    np.testing.assert_allclose(shaping.penalty(lengths), want, rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(overlong.Overlong(max_len=20).penalty(lengths), 0.0)
  with pytest.raises(ValueError, match="overlong_buffer"):
    overlong.Overlong(max_len=20, buffer=21)


def test_overlong_shaping_of_a_rollout():
  lengths = np.array([3, 20, 18, 20], np.int32)
  finished = np.array([True, False, True, True])  # row 3 stopped on its last token
  gen = Generation(tokens=np.zeros((4, 20), np.int32), logprobs=np.zeros((4, 20), np.float32),
                   lengths=lengths, finished=finished, prompt_index=np.array([0, 0, 1, 1]))
  ro = rollout.Rollout([], [[1], [1]], gen, [""] * 4, 0.0, None,
                       loss_lengths=np.array([3, 12, 18, 20], np.int32))
  scores = np.array([1.0, 0.0, 1.0, 0.5], np.float32)
  shaped = overlong.Overlong(max_len=20, buffer=4, factor=1.0, filter=True).apply(ro, scores)
  np.testing.assert_allclose(shaped, [1.0, -1.0, 1.0 - 0.5, 0.5 - 1.0], rtol=1e-6)
  np.testing.assert_array_equal(ro.loss_lengths, [3, 0, 18, 20])  # only the cut row


# --------------------------------------------------------------------------- config


def test_schema_choices_are_the_registries():
  fields = {f.name: f for f in rl_config.RL.__dataclass_fields__.values()}
  assert set(fields["objective"].metadata["choices"]) == set(objective.OBJECTIVES)
  assert tuple(fields["rollout_correction"].metadata["choices"]) == ("none",) + correction.MODES
  assert tuple(fields["rollout_correction_level"].metadata["choices"]) == correction.LEVELS
  cfg = algorithm.loss(rl_config.RL(objective="cispo", cispo_clip_low=0.3),
                                         16)
  assert (cfg.objective, cfg.cispo_clip_low, cfg.cispo_clip_high) == ("cispo", 0.3, 5.0)
  hash(cfg)  # a jit static argument
  assert algorithm.correction(rl_config.RL()) == correction.Correction.decoupled(2.0)
  assert algorithm.correction(rl_config.RL(
      rollout_correction="mis", rollout_correction_level="sequence")) == correction.Correction(
          "mis", "sequence", 2.0, 0.5, every_row=True)


@pytest.mark.parametrize("flag, needle", [
    ("--config.rl.objective=grpo", "config.rl.objective='grpo'"),
    ("--config.rl.cispo_clip_low=1.5", "config.rl.cispo_clip_low=1.5: must be in [0, 1]"),
    ("--config.rl.rollout_correction=is", "config.rl.rollout_correction='is'"),
    ("--config.rl.rollout_correction_level=row", "config.rl.rollout_correction_level='row'"),
    ("--config.rl.rollout_correction_cap=0.5", "config.rl.rollout_correction_cap=0.5"),
    ("--config.rl.overlong_buffer=-1", "config.rl.overlong_buffer=-1"),
    ("--config.rl.overlong_buffer=100000", "rl.overlong_buffer=100000 must be at most"),
])
def test_bad_objective_settings_are_one_line(capsys, flag, needle):
  assert cli.main(["config", "show", GRPO, flag]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and needle in err, err


@pytest.mark.slow
def test_the_grpo_loop_runs_the_new_switches_together(tmp_path):
  """Two tiny GRPO steps with GSPO, sequence-level masked IS of every row, and both of
  DAPO's overlong switches: the metrics are logged and in range. The sampler's and the
  trainer's log-probs are both float32 on this CPU, so their mismatch is near 0."""
  rows = tiny_runs.steps(grpo_loop.train(tiny_runs.config(
      tmp_path, "--config.rl.objective=gspo", "--config.rl.rollout_correction=mis",
      "--config.rl.rollout_correction_level=sequence", "--config.rl.overlong_filter=true",
      "--config.rl.overlong_buffer=4")))
  assert len(rows) == 2
  for r in rows:
    assert np.isfinite(r["loss"]) and not r["skipped"]
    assert 0 <= r["mismatch_kl"] < 1e-3 and abs(r["mismatch_ratio_max"] - 1) < 1e-2
    assert r["mismatch_masked_frac"] == 0
    assert 0 <= r["truncated_frac"] <= 1 and -1 <= r["overlong_penalty"] <= 0
    # Cut completions train nothing: the trained length is that of the finished ones.
    assert r["trained_len"] <= (1 - r["truncated_frac"]) * 12
