"""The loss variants on small meshes: a covering grid of loss aggregation x advantage
estimator x shared prefix x staleness x mesh shape, each cell a few update steps on
fixed rollouts, run on one device and on an 8-device mesh. The losses are finite and
do not depend on the mesh.

A cell's steps are train.py's: behaviour log-probs from the policy version the cell's
staleness eta allows (max(0, k - eta) at step k, as the "oldest" sample_version), the
decoupled correction for stale rows (grpo.make_proximal_fn), then the update. The rollouts
are random tokens with random rewards: no sampling and no sandbox, so a cell costs its
compilations and little else. To keep that small, the model and the programs a cell
does not change (behaviour and proximal log-probs) are built once per mesh, and every
program is compiled at LLVM's lowest optimisation level (the same on both meshes).

The grid is not the full product (3 x 2 x 2 x 3 x 3 = 108 cells, each compiled twice,
would take most of an hour here): six cells that cover every pair of aggregation and
advantage, of aggregation and layout, of advantage and layout, and of staleness and
layout, with each staleness and each mesh shape in two cells. The first step (before
any update) must agree to float32 rounding; later steps to 1e-4: Adam turns
rounding-sized differences in near-zero gradients into parameter differences of up to
the learning rate.
"""

import functools

import jax
import numpy as np
import pytest
from flax import nnx

from rlcode.parallel import sharding
from rlcode.rl import shared_prefix
from rlcode import optim
from rlcode.rl import advantages
from rlcode.rl import correction
from rlcode.rl import grpo
from rlcode.rl import objective
from rlcode.rl import sequences
from rlcode.models import Decoder, ModelConfig

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                  num_heads=4, num_kv_heads=2, head_dim=8, max_seq_len=64,
                  attn_impl="reference")
PROMPTS, GROUP, WINDOW, STEPS = 4, 4, 8, 3

CELLS = [  # aggregation, advantage, shared prefix, max_staleness, mesh (data, fsdp, tensor)
    ("seq_mean_token_mean", "grpo", True, 0, (1, 8, 1)),
    ("seq_mean_token_mean", "dr_grpo", False, 1, (2, 2, 2)),
    ("token_mean", "grpo", False, 2, (4, 1, 2)),
    ("token_mean", "dr_grpo", True, 1, (1, 8, 1)),
    ("seq_mean_token_sum_norm", "grpo", True, 2, (2, 2, 2)),
    ("seq_mean_token_sum_norm", "dr_grpo", False, 0, (4, 1, 2)),
]


def _rollouts(seed):
  """STEPS batches of random prompts and completions (varied lengths) with random rewards."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(STEPS):
    prompts = [list(rng.integers(3, 64, rng.integers(4, 10))) for _ in range(PROMPTS)]
    completions = [list(rng.integers(3, 64, rng.integers(1, WINDOW + 1)))
                   for _ in range(PROMPTS * GROUP)]
    out.append((prompts, completions, rng.uniform(0, 1, PROMPTS * GROUP).astype(np.float32)))
  return out


def _batch(prompts, completions, adv, shared):
  if shared:
    return shared_prefix.grouped_batch(prompts, completions, pad_id=0, completion_len=WINDOW,
                                       adv=adv)
  return sequences.sequence_batch(prompts, completions, np.repeat(np.arange(PROMPTS), GROUP),
                                pad_id=0, adv=adv, window=WINDOW)


FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
OPTIMIZER = optim.OptimizerConfig(learning_rate=0.01, warmup_steps=1, decay_steps=10)


@functools.lru_cache(maxsize=None)
def _start(mesh_shape):
  """(mesh, graphdef, initial train state) of the model on a mesh of this shape."""
  mesh = sharding.make_mesh(*mesh_shape)
  model = sharding.init_sharded(lambda: Decoder(CFG, rngs=nnx.Rngs(0)), mesh)
  graphdef, _ = nnx.split(model, nnx.Param)
  return mesh, graphdef, optim.init_state(model, optim.make_optimizer(OPTIMIZER), mesh)


def _example(shared):
  rows = PROMPTS * GROUP
  return (shared_prefix.GroupedBatch.abstract(PROMPTS, rows) if shared
          else sequences.SequenceBatch.abstract(rows))


@functools.lru_cache(maxsize=None)
def _log_probs(shared, mesh_shape):
  """The behaviour and proximal programs of a layout on a mesh, compiled once."""
  mesh, graphdef, state = _start(mesh_shape)
  fn = shared_prefix.logprob_fn(1.0) if shared else None
  rows = PROMPTS * GROUP
  batch = _placed(_rollouts(7)[0], "grpo", shared, mesh)
  stale = jax.device_put(np.ones(rows, bool), optim.batch_shardings(mesh, _example(shared)).adv)
  behaviour = grpo.make_logprob_fn(graphdef, mesh, 1.0, fn, rows)
  proximal = grpo.make_proximal_fn(graphdef, mesh, 1.0, correction.Correction.decoupled(2.0),
                                   rows, fn)
  return (behaviour.lower(state.params, batch).compile(FAST),
          proximal.lower(state.params, batch, stale).compile(FAST), stale)


def _placed(rollout_, advantage, shared, mesh):
  prompts, completions, rewards = rollout_
  batch = _batch(prompts, completions, advantages.group_advantages(rewards, GROUP, advantage), shared)
  return jax.device_put(batch, optim.batch_shardings(mesh, _example(shared)))


def _run(aggregation, advantage, shared, eta, mesh_shape):
  """The cell's per-step metrics on a mesh of the given shape."""
  mesh, graphdef, start = _start(mesh_shape)
  state = jax.tree.map(lambda x: x.copy(), start)  # the update donates it
  behaviour, proximal, stale = _log_probs(shared, mesh_shape)
  cfg = objective.LossConfig(aggregation=aggregation, max_completion_len=WINDOW,
                        clip_eps_low=0.2, clip_eps_high=0.28)
  batches = [_placed(r, advantage, shared, mesh) for r in _rollouts(7)]
  update = grpo.make_update_step(
      graphdef, optim.make_optimizer(OPTIMIZER), cfg, mesh, state, _example(shared),
      logprob_fn=shared_prefix.logprob_fn(1.0) if shared else None,
  ).lower(state, batches[0]).compile(FAST)
  versions = [jax.tree.map(lambda x: x.copy(), state.params)]
  out = []
  for step, batch in enumerate(batches):
    sampled_with = max(0, step - eta)
    batch.old_logp = behaviour(versions[sampled_with], batch) * batch.mask
    metrics = {}
    if sampled_with < step:
      batch.old_logp, batch.weight, batch.mask, metrics = proximal(state.params, batch, stale)
    state, m = update(state, batch)
    out.append({**jax.device_get(m), **jax.device_get(metrics)})
    versions.append(jax.tree.map(lambda x: x.copy(), state.params))
  return out


@pytest.mark.slow
@pytest.mark.parametrize("aggregation,advantage,shared,eta,mesh_shape", CELLS)
def test_loss_is_finite_and_mesh_independent(aggregation, advantage, shared, eta, mesh_shape):
  one = _run(aggregation, advantage, shared, eta, (1, 1, 1))
  many = _run(aggregation, advantage, shared, eta, mesh_shape)
  assert all(np.isfinite(r["loss"]) and not r["skipped"] for r in one + many)
  assert one[0]["grad_norm"] > 0
  if eta:
    assert one[-1]["iw_mean"] != 1.0
  assert [sorted(r) for r in one] == [sorted(r) for r in many]
  for key in one[0]:
    np.testing.assert_allclose(many[0][key], one[0][key], rtol=2e-5, atol=1e-6, err_msg=key)
  for a, b in zip(one[1:], many[1:]):
    for key in ("loss", "pg_loss", *(("iw_mean", "iw_clip_frac") if eta else ())):
      assert abs(a[key] - b[key]) < 1e-4, (key, a[key], b[key])
