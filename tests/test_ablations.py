"""The update's switches on small meshes: a covering grid of loss aggregation x advantage
estimator x batch layout x staleness x mesh shape x objective x rollout correction x
per-token advantages, each cell a few update steps on fixed rollouts, run on one device
and on an 8-device mesh. The losses are finite and do not depend on the mesh.

A cell's steps are train.py's: behaviour log-probs from the policy version the cell's
staleness eta allows (max(0, k - eta) at step k, as the "oldest" sample_version), the
decoupled correction for stale rows or the cell's rollout correction of every row
(grpo.make_proximal_fn), then the update. The rollouts are random tokens with random
rewards: no sampling and no sandbox, so a cell costs its compilations and little else. To
keep that small, the model and the programs a cell does not change (behaviour and
proximal log-probs) are built once per mesh, and every program is compiled at LLVM's
lowest optimisation level (the same on both meshes).

The grid is not the full product (thousands of cells, each compiled twice): six cells
that cover every pair of aggregation and advantage, of aggregation and layout (the
repeated rows, the shared prompt, packed completions), of advantage and layout, and of
staleness and layout, with each staleness, mesh shape, objective, correction and
advantage shape in at least one cell. The first step (before any update) must agree to
float32 rounding; later steps to 1e-4: Adam turns rounding-sized differences in near-zero
gradients into parameter differences of up to the learning rate.
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
from rlcode.rl import packing
from rlcode.rl import sequences
from rlcode.models import Decoder, ModelConfig

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                  num_heads=4, num_kv_heads=2, head_dim=8, max_seq_len=64,
                  attn_impl="reference")
PROMPTS, GROUP, WINDOW, STEPS = 4, 4, 8, 3

CELLS = [  # aggregation, advantage, layout, max_staleness, mesh (data, fsdp, tensor),
           # objective, rollout correction (mode, level) or None, per-token advantages
    ("seq_mean_token_mean", "grpo", "shared", 0, (1, 8, 1), "gspo", None, False),
    ("seq_mean_token_mean", "dr_grpo", "repeated", 1, (2, 2, 2), "cispo", None, False),
    ("token_mean", "grpo", "repeated", 2, (4, 1, 2), "ppo", ("tis", "token"), False),
    ("token_mean", "dr_grpo", "packed", 0, (1, 8, 1), "gspo_token", ("mis", "sequence"), False),
    ("seq_mean_token_sum_norm", "grpo", "packed", 2, (2, 2, 2), "cispo", None, True),
    ("seq_mean_token_sum_norm", "dr_grpo", "shared", 1, (4, 1, 2), "ppo", ("tis", "sequence"),
     True),
]
PACK_TOKENS = 2 * WINDOW  # two packs a group at most: min_packs keeps one shape


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


def _batch(prompts, completions, adv, layout, per_token=False):
  if per_token:  # on-policy distillation's form: one advantage a token
    adv = adv[:, None] + np.linspace(-0.5, 0.5, WINDOW, dtype=np.float32)[None, :]
  if layout == "shared":
    return shared_prefix.grouped_batch(prompts, completions, pad_id=0, completion_len=WINDOW,
                                       adv=adv)
  if layout == "packed":
    return packing.packed_batch(prompts, completions, pad_id=0, completion_len=WINDOW,
                                pack_tokens=PACK_TOKENS, adv=adv, min_packs=GROUP // 2)
  return sequences.sequence_batch(prompts, completions, np.repeat(np.arange(PROMPTS), GROUP),
                                pad_id=0, adv=adv, window=WINDOW)


LOGPROB_FNS = {"repeated": None, "shared": shared_prefix.logprob_fn(1.0),
               "packed": packing.logprob_fn(1.0)}


FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
OPTIMIZER = optim.OptimizerConfig(learning_rate=0.01, warmup_steps=1, decay_steps=10)


@functools.lru_cache(maxsize=None)
def _start(mesh_shape):
  """(mesh, graphdef, initial train state) of the model on a mesh of this shape."""
  mesh = sharding.make_mesh(*mesh_shape)
  model = sharding.init_sharded(lambda: Decoder(CFG, rngs=nnx.Rngs(0)), mesh)
  graphdef, _ = nnx.split(model, nnx.Param)
  return mesh, graphdef, optim.init_state(model, optim.make_optimizer(OPTIMIZER), mesh)


def _example(layout, per_token=False):
  rows = PROMPTS * GROUP
  example = {"shared": lambda: shared_prefix.GroupedBatch.abstract(PROMPTS, rows),
             "packed": lambda: packing.PackedBatch.abstract(PROMPTS, rows),
             "repeated": lambda: sequences.SequenceBatch.abstract(rows)}[layout]()
  if per_token:
    example.adv = jax.ShapeDtypeStruct((rows, 1), np.float32)
  return example


@functools.lru_cache(maxsize=None)
def _log_probs(layout, mesh_shape, fix, per_token):
  """The behaviour and proximal programs of a layout and correction on a mesh, compiled
  once."""
  mesh, graphdef, state = _start(mesh_shape)
  fn = LOGPROB_FNS[layout]
  rows = PROMPTS * GROUP
  batch = _placed(_rollouts(7)[0], "grpo", layout, mesh, per_token)
  stale = jax.device_put(np.ones(rows, bool), optim.batch_shardings(
      mesh, jax.ShapeDtypeStruct((rows,), bool)))
  behaviour = grpo.make_logprob_fn(graphdef, mesh, 1.0, fn, rows)
  proximal = grpo.make_proximal_fn(graphdef, mesh, 1.0, fix, rows, fn)
  return (behaviour.lower(state.params, batch).compile(FAST),
          proximal.lower(state.params, batch, stale).compile(FAST), stale)


def _placed(rollout_, advantage, layout, mesh, per_token=False):
  prompts, completions, rewards = rollout_
  batch = _batch(prompts, completions, advantages.group_advantages(rewards, GROUP, advantage),
                 layout, per_token)
  return jax.device_put(batch, optim.batch_shardings(mesh, _example(layout, per_token)))


def _run(aggregation, advantage, layout, eta, mesh_shape, objective_name, rollout_fix,
         per_token):
  """The cell's per-step metrics on a mesh of the given shape."""
  mesh, graphdef, start = _start(mesh_shape)
  state = jax.tree.map(lambda x: x.copy(), start)  # the update donates it
  fix = (correction.Correction.decoupled(2.0) if rollout_fix is None else
         correction.Correction(*rollout_fix, cap=2.0, low=0.5, every_row=True))
  behaviour, proximal, stale = _log_probs(layout, mesh_shape, fix, per_token)
  cfg = objective.LossConfig(aggregation=aggregation, max_completion_len=WINDOW,
                             clip_eps_low=0.2, clip_eps_high=0.28, objective=objective_name)
  batches = [_placed(r, advantage, layout, mesh, per_token) for r in _rollouts(7)]
  update = grpo.make_update_step(
      graphdef, optim.make_optimizer(OPTIMIZER), cfg, mesh, state,
      _example(layout, per_token), logprob_fn=LOGPROB_FNS[layout],
  ).lower(state, batches[0]).compile(FAST)
  versions = [jax.tree.map(lambda x: x.copy(), state.params)]
  out = []
  for step, batch in enumerate(batches):
    sampled_with = max(0, step - eta)
    batch.old_logp = behaviour(versions[sampled_with], batch) * batch.mask
    metrics = {}
    if sampled_with < step or fix.every_row:
      batch.old_logp, batch.weight, batch.mask, metrics = proximal(state.params, batch, stale)
    state, m = update(state, batch)
    out.append({**jax.device_get(m), **jax.device_get(metrics)})
    versions.append(jax.tree.map(lambda x: x.copy(), state.params))
  return out


@pytest.mark.slow
@pytest.mark.parametrize("aggregation,advantage,layout,eta,mesh_shape,objective_name,"
                         "rollout_fix,per_token", CELLS)
def test_loss_is_finite_and_mesh_independent(aggregation, advantage, layout, eta, mesh_shape,
                                             objective_name, rollout_fix, per_token):
  cell = (aggregation, advantage, layout, eta)
  switches = (objective_name, rollout_fix, per_token)
  one = _run(*cell, (1, 1, 1), *switches)
  many = _run(*cell, mesh_shape, *switches)
  assert all(np.isfinite(r["loss"]) and not r["skipped"] for r in one + many)
  assert one[0]["grad_norm"] > 0
  if eta:
    assert one[-1]["iw_mean"] != 1.0
  if rollout_fix:
    assert "mismatch_kl" in one[-1]
  assert [sorted(r) for r in one] == [sorted(r) for r in many]
  for key in one[0]:
    np.testing.assert_allclose(many[0][key], one[0][key], rtol=2e-5, atol=1e-6, err_msg=key)
  for a, b in zip(one[1:], many[1:]):
    for key in ("loss", "pg_loss", *(("iw_mean", "iw_clip_frac") if eta else ())):
      assert abs(a[key] - b[key]) < 1e-4, (key, a[key], b[key])


def test_the_grid_covers_every_switch():
  """Each layout, objective, correction mode and level, staleness, mesh and advantage shape
  is in some cell, and each pair of aggregation x advantage, aggregation x layout,
  advantage x layout and staleness x layout where the grid's six cells can hold them."""
  column = lambda i: {c[i] for c in CELLS}
  assert column(2) == {"repeated", "shared", "packed"}
  assert column(3) == {0, 1, 2}
  assert column(5) == set(objective.OBJECTIVES)
  assert {m for m, _ in filter(None, column(6))} == set(correction.MODES)
  assert {lv for _, lv in filter(None, column(6))} == set(correction.LEVELS)
  assert column(7) == {False, True}
  pairs = lambda i, j: {(c[i], c[j]) for c in CELLS}
  assert len(pairs(0, 1)) == 6 and len(pairs(0, 2)) == 6 and len(pairs(1, 2)) == 6
  assert len(pairs(3, 2)) == 6
