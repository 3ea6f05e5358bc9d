"""The shared-prefix update equals the naive repeated-prompt update."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rlcode.parallel import sharding
from rlcode.rl import shared_prefix
from rlcode import optim
from rlcode.rl import objective
from rlcode.rl import sequences
from rlcode.models import Decoder, ModelConfig

CFG = ModelConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_layers=2,
                  num_heads=4, num_kv_heads=2, qkv_bias=True, max_seq_len=128)
G = 3
PAD = 0


def _data(seed, longest_first):
  rng = np.random.default_rng(seed)
  lengths = [9, 4, 13] if longest_first else [4, 9, 13]
  prompts = [rng.integers(1, 40, n).tolist() for n in lengths]
  completions = [rng.integers(1, 40, int(rng.integers(1, 7))).tolist()
                 for _ in range(len(prompts) * G)]
  old = [(-rng.random(8) * 2).astype(np.float32) for _ in completions]
  ref = [(-rng.random(8) * 2).astype(np.float32) for _ in completions]
  adv = rng.normal(size=len(completions)).astype(np.float32)
  return prompts, completions, old, ref, adv


def _naive(prompts, completions, old, ref, adv):
  batch = sequences.sequence_batch(prompts, completions, np.repeat(np.arange(len(prompts)), G),
                                 pad_id=PAD, old_logp=old, adv=adv)
  ref_b = sequences.sequence_batch(prompts, completions, np.repeat(np.arange(len(prompts)), G),
                                 pad_id=PAD, old_logp=ref)
  batch.ref_logp = ref_b.old_logp
  return batch


def _grouped(prompts, completions, old, ref, adv, padding_side, completion_len=8):
  if padding_side == "left":  # the same prompts, arriving left-padded in one array
    width = max(map(len, prompts)) + 2
    prompts = [[PAD] * (width - len(p)) + p for p in prompts]
  batch = shared_prefix.grouped_batch(prompts, completions, pad_id=PAD,
                                      completion_len=completion_len, old_logp=old, adv=adv,
                                      padding_side=padding_side)
  batch.ref_logp = shared_prefix.grouped_batch(prompts, completions, pad_id=PAD,
                                               completion_len=completion_len, old_logp=ref,
                                               padding_side=padding_side).old_logp
  return batch


def _losses_and_grads(graphdef, params, batch, logprob_fn):
  """{aggregation: (loss, grads)} for every loss aggregation, in one compiled program.

  The model's backward pass is compiled once: each aggregation's gradient with respect
  to the log-probs is pulled back through the model's VJP, vmapped over aggregations
  (the chain rule, the same gradients as value_and_grad of each loss)."""
  configs = [objective.LossConfig(aggregation=name, beta=0.05, clip_eps_low=0.2,
                             clip_eps_high=0.28, max_completion_len=8)
             for name in objective.AGGREGATIONS]

  @jax.jit
  def run(params):
    logp, pull_back = jax.vjp(lambda p: logprob_fn(nnx.merge(graphdef, p), batch)[0], params)
    losses, cotangents = zip(*[jax.value_and_grad(lambda lp, cfg=cfg: objective.policy_loss(
        lp, batch.old_logp, batch.adv, batch.mask, cfg, ref_logp_nt=batch.ref_logp)[0])(logp)
                               for cfg in configs])
    (grads,) = jax.vmap(pull_back)(jnp.stack(cotangents))
    return {name: (losses[i], jax.tree.map(lambda g, i=i: g[i], grads))
            for i, name in enumerate(objective.AGGREGATIONS)}
  return run(params)


@pytest.fixture(scope="module")
def model():
  return nnx.split(Decoder(CFG, rngs=nnx.Rngs(1)), nnx.Param)


# G * completion_len queries per prompt: 24 run the prefix part through the decode
# kernel, 96 through the blockwise kernel (DECODE_QUERIES = 64 separates them).
@pytest.mark.slow
@pytest.mark.parametrize("longest_first,padding_side,completion_len",
                         [(True, "right", 8), (False, "left", 32)])
def test_loss_and_grads_equal_repeated_prompt(model, longest_first, padding_side,
                                              completion_len):
  graphdef, params = model
  data = _data(0, longest_first)
  naive_fn = lambda m, b: sequences.sequence_logprobs(m, b, 1.0)
  naive = _losses_and_grads(graphdef, params, _naive(*data), naive_fn)
  shared = _losses_and_grads(graphdef, params,
                             _grouped(*data, padding_side, completion_len),
                             shared_prefix.logprob_fn(1.0))
  for name in objective.AGGREGATIONS:
    (loss_a, grads_a), (loss_b, grads_b) = naive[name], shared[name]
    np.testing.assert_allclose(float(loss_b), float(loss_a), rtol=1e-5, atol=1e-6,
                               err_msg=name)
    flat_a = dict(nnx.to_flat_state(grads_a))
    for path, g in nnx.to_flat_state(grads_b):
      np.testing.assert_allclose(np.asarray(g.get_value()),
                                 np.asarray(flat_a[path].get_value()),
                                 rtol=1e-4, atol=1e-6, err_msg=f"{name} {path}")


def test_logprobs_equal_per_token(model):
  graphdef, params = model
  data = _data(3, True)
  m = nnx.merge(graphdef, params)
  naive = _naive(*data)
  grouped = _grouped(*data, "right")
  logp_a, ent_a = jax.jit(lambda b: sequences.sequence_logprobs(m, b, 0.7))(naive)
  logp_b, ent_b = jax.jit(lambda b: shared_prefix.grouped_logprobs(m, b, 0.7))(grouped)
  # The full forward's log-softmax at each completion token, computed independently.
  full = jax.jit(lambda t: jax.nn.log_softmax(m(t) / 0.7, axis=-1))(naive.tokens)
  prompts, completions = data[0], data[1]
  for i, c in enumerate(completions):
    start = len(prompts[i // G]) - 1
    expect = np.asarray(full)[i, start + np.arange(len(c)), c]
    np.testing.assert_allclose(np.asarray(logp_a[i, :len(c)]), expect, atol=2e-5)
    np.testing.assert_allclose(np.asarray(logp_b[i, :len(c)]),
                               np.asarray(logp_a[i, :len(c)]), atol=2e-5)
    np.testing.assert_allclose(np.asarray(ent_b[i, :len(c)]),
                               np.asarray(ent_a[i, :len(c)]), atol=2e-5)


@pytest.mark.slow
def test_update_step_runs_sharded(model):
  mesh = sharding.make_mesh(2, 1, 2)
  graphdef, params = model
  # A copy: the update donates its state, and the module fixture's params are shared.
  m = sharding.shard_module(nnx.merge(graphdef, jax.tree.map(lambda x: x.copy(), params)), mesh)
  opt_cfg = optim.OptimizerConfig(learning_rate=1e-3, warmup_steps=1, decay_steps=10)
  optimizer = optim.make_optimizer(opt_cfg)
  data = _data(5, True)
  prompts = data[0] + data[0][:1]  # 4 prompts: divisible by the data axis
  completions = data[1] + data[1][:G]
  batch = shared_prefix.grouped_batch(prompts, completions, pad_id=PAD, completion_len=8,
                                      old_logp=data[2] + data[2][:G],
                                      adv=np.concatenate([data[4], data[4][:G]]))
  state = optim.init_state(m, optimizer, mesh)
  cfg = objective.LossConfig(max_completion_len=8)
  update = shared_prefix.update_step(nnx.split(m, nnx.Param)[0], optimizer, cfg, mesh, state,
                                     batch)
  state, metrics = update(state, batch)
  assert float(metrics["skipped"]) == 0 and np.isfinite(float(metrics["loss"]))


def test_bad_input():
  with pytest.raises(ValueError, match="do not split into groups"):
    shared_prefix.grouped_batch([[1, 2], [3]], [[1]] * 3, pad_id=0, completion_len=4)
  with pytest.raises(ValueError, match="more than completion_len=2"):
    shared_prefix.grouped_batch([[1, 2]], [[1, 2, 3]], pad_id=0, completion_len=2)
  with pytest.raises(ValueError, match="padding_side"):
    shared_prefix.grouped_batch([[1]], [[1]], pad_id=0, completion_len=2, padding_side="up")


@pytest.mark.slow
def test_sliding_window_layers_equal_repeated_prompt():
  """Sliding layers read only the prefix's last window-1 keys; still exact."""
  cfg = ModelConfig(**{**CFG.__dict__, "attention_pattern": ("sliding", "dense"),
                       "sliding_window": 6})
  graphdef, params = nnx.split(Decoder(cfg, rngs=nnx.Rngs(2)), nnx.Param)
  data = _data(1, True)
  naive_fn = lambda m, b: sequences.sequence_logprobs(m, b, 1.0)
  naive = _losses_and_grads(graphdef, params, _naive(*data), naive_fn)
  shared = _losses_and_grads(graphdef, params, _grouped(*data, "right"),
                             shared_prefix.logprob_fn(1.0))
  for name in objective.AGGREGATIONS:
    np.testing.assert_allclose(float(shared[name][0]), float(naive[name][0]), rtol=1e-5,
                               atol=1e-6, err_msg=name)
    flat = dict(nnx.to_flat_state(naive[name][1]))
    for path, g in nnx.to_flat_state(shared[name][1]):
      np.testing.assert_allclose(np.asarray(g.get_value()), np.asarray(flat[path].get_value()),
                                 rtol=1e-4, atol=1e-6, err_msg=f"{name} {path}")


def _idle_batch(model, seed=7):
  """4 groups of G: group 0 with signal; group 1 flat (advantages 0); group 2 with signal,
  one row cut (mask 0) and 15 tokens long; group 3 flat with a long row. Trained rows
  are at most 5 tokens, so the width can fall from 16 to 8. The behaviour log-probs are
  the model's, jittered, so that some ratios are clipped and most are not."""
  rng = np.random.default_rng(seed)
  prompts = [rng.integers(1, 40, n).tolist() for n in (5, 9, 3, 7)]
  lengths = [3, 5, 2, 4, 14, 1, 5, 15, 4, 2, 16, 3]
  completions = [rng.integers(1, 40, k).tolist() for k in lengths]
  old = [(-rng.random(k) * 2).astype(np.float32) for k in lengths]
  adv = rng.normal(size=4 * G).astype(np.float32)
  adv[3:6] = 0.0
  adv[9:12] = 0.0
  masks = [[1] * k for k in lengths]
  masks[7] = [0] * lengths[7]  # cut, masked out whole
  masks[1] = [1, 1, 0, 0, 1]  # an observation inside a trajectory
  batch = shared_prefix.grouped_batch(prompts, completions, pad_id=PAD, completion_len=16,
                                      old_logp=old, adv=adv, masks=masks)
  batch.weight = rng.uniform(0.5, 1.5, batch.weight.shape).astype(np.float32)
  graphdef, params = model
  logp, _ = shared_prefix.grouped_logprobs(nnx.merge(graphdef, params), batch, 1.0)
  batch.old_logp = (np.asarray(logp) + rng.normal(0, 0.15, logp.shape)).astype(np.float32)
  return batch


def _loss_and_grads(graphdef, params, batch, cfg):
  def loss(p):
    logp, _ = shared_prefix.grouped_logprobs(nnx.merge(graphdef, p), batch, 1.0)
    return objective.policy_loss(logp, batch.old_logp, batch.adv, batch.mask, cfg,
                            weight_nt=batch.weight)[0]
  return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.slow
@pytest.mark.parametrize("aggregation", sorted(objective.AGGREGATIONS))
def test_drop_idle_groups_keeps_loss_and_grads(model, aggregation):
  graphdef, params = model
  cfg = objective.LossConfig(aggregation=aggregation, clip_eps_low=0.2, clip_eps_high=0.28,
                        max_completion_len=16)
  full = _idle_batch(model)
  small = shared_prefix.drop_idle_groups(full, G, cfg, multiple=8)
  # Groups 0 and 2 kept (a power of two already), 8 columns instead of 16.
  assert small.prompt_tokens.shape[0] == 2 and small.completion_tokens.shape == (2 * G, 8)
  np.testing.assert_array_equal(small.prompt_lengths, full.prompt_lengths[[0, 2]])
  loss_a, grads_a = _loss_and_grads(graphdef, params, full, cfg)
  loss_b, grads_b = _loss_and_grads(graphdef, params, small, cfg)
  assert abs(float(loss_a)) > 1e-3 and float(optax.tree.norm(grads_a)) > 1e-3
  np.testing.assert_allclose(float(loss_b), float(loss_a), rtol=1e-5, atol=1e-7)
  flat_a = dict(nnx.to_flat_state(grads_a))
  for path, g in nnx.to_flat_state(grads_b):
    np.testing.assert_allclose(np.asarray(g.get_value()), np.asarray(flat_a[path].get_value()),
                               rtol=1e-4, atol=1e-7, err_msg=f"{aggregation} {path}")


def test_drop_idle_groups_pads_and_keeps_one(model):
  cfg = objective.LossConfig(max_completion_len=16)
  full = _idle_batch(model)
  # One group with signal, padded to the mesh's 2 batch shards with a masked-out group.
  one = dataclasses.replace(full, adv=np.where(np.arange(4 * G) < G, full.adv, 0.0))
  small = shared_prefix.drop_idle_groups(one, G, cfg, multiple=8, group_multiple=2)
  assert small.prompt_tokens.shape[0] == 2
  assert small.mask[G:].sum() == 0 and not small.adv[G:].any()
  # Three groups with signal: a power of two is 4, the batch's own count.
  three = dataclasses.replace(full, adv=np.where(np.arange(4 * G) < 3 * G, 1.0, 0.0))
  assert shared_prefix.drop_idle_groups(three, G, cfg, multiple=8).prompt_tokens.shape[0] == 4
  # No signal at all: one masked-out group, so the optimiser still steps.
  flat = dataclasses.replace(full, adv=np.zeros_like(full.adv))
  none = shared_prefix.drop_idle_groups(flat, G, cfg, multiple=8)
  assert none.prompt_tokens.shape[0] == 1 and none.mask.sum() == 0
  # With a KL term every trained token counts: the batch comes back as it was.
  assert shared_prefix.drop_idle_groups(full, G, objective.LossConfig(beta=0.1), multiple=8) is full
  with pytest.raises(ValueError, match="12 rows do not split into 4 groups of 2"):
    shared_prefix.drop_idle_groups(full, 2, cfg)


@pytest.mark.slow
def test_drop_idle_groups_same_optimiser_steps(model):
  """Through the compiled update with momentum: a step with signal, then one without
  (whose zero gradient still moves the params by the momentum); the same params either
  way. (SGD, not Adam: Adam divides by the gradient's root mean square, so where a
  gradient is ~1e-7 its rounding, summed in another order, moves the step visibly.)"""
  graphdef, params = model
  mesh = sharding.make_mesh(1, 1, 1)
  optimizer = optax.sgd(learning_rate=0.5, momentum=0.9)
  cfg = objective.LossConfig(max_completion_len=16)
  full = _idle_batch(model)
  flat = dataclasses.replace(full, adv=np.zeros_like(full.adv))
  finals = []
  for compact in (False, True):
    m = nnx.merge(graphdef, jax.tree.map(lambda x: x.copy(), params))
    state = optim.init_state(m, optimizer, mesh)
    update = shared_prefix.update_step(graphdef, optimizer, cfg, mesh, state,
                                       shared_prefix.GroupedBatch.abstract(4, 4 * G))
    for batch in (full, flat):
      if compact:
        batch = shared_prefix.drop_idle_groups(batch, G, cfg, multiple=8)
      state, _ = update(state, batch)
    finals.append(state.params)
  moved = 0.0
  flat_a = dict(nnx.to_flat_state(finals[0]))
  for path, p in nnx.to_flat_state(finals[1]):
    a = np.asarray(flat_a[path].get_value())
    np.testing.assert_allclose(np.asarray(p.get_value()), a, rtol=1e-4, atol=1e-6,
                               err_msg=str(path))
    moved = max(moved, float(np.abs(a - np.asarray(dict(nnx.to_flat_state(params))[path]
                                                   .get_value())).max()))
  assert moved > 1e-3
