"""The update's switches on small meshes: a covering grid of loss aggregation x advantage
estimator x batch layout x staleness x mesh shape x objective x rollout correction x
per-token advantages x overlong shaping x MoE routing replay x dynamic sampling, each cell a
few update steps on fixed rollouts, run on one device and on an 8-device mesh. The losses
are finite and do not depend on the mesh.

A cell's steps are train.py's: behaviour log-probs from the policy version the cell's
staleness eta allows (max(0, k - eta) at step k, as the "oldest" sample_version), the
decoupled correction for stale rows or the cell's rollout correction of every row
(grpo.make_proximal_fn), then the update. The rollouts are random tokens with random
rewards: no sampling and no sandbox, so a cell costs its compilations and little else. To
keep that small, the model and the programs a cell does not change (behaviour and proximal
log-probs) are built once per mesh, and every program is compiled at LLVM's lowest
optimisation level (the same on both meshes). A cell with routing replay trains an MoE model
on a record of random experts (each token's k distinct ones), which the update replays; a
cell's overlong shaping (rlcode.rl.overlong, at L_max = the window) reads the completions of
the window's full length as truncated.

The grid is not the full product (thousands of cells, each compiled twice): six cells that
cover every pair of aggregation and advantage, of aggregation and layout (the repeated rows,
the shared prompt, packed completions), of advantage and layout, and of staleness and
layout, with each staleness, mesh shape, objective, correction, advantage shape, overlong
switch, routing replay (in the layouts that carry a record: repeated rows and the shared
prompt) and dynamic sampling in at least one cell. The first step (before any update) must
agree to float32 rounding; later steps to 1e-4: Adam turns rounding-sized differences in
near-zero gradients into parameter differences of up to the learning rate.
"""

import dataclasses
import functools
import types

import jax
import numpy as np
import pytest
from flax import nnx

from rlcode.parallel import sharding
from rlcode.rl import shared_prefix
from rlcode import optim
from rlcode.rl import advantages
from rlcode.rl import correction
from rlcode.rl import dynamic
from rlcode.rl import grpo
from rlcode.rl import objective
from rlcode.rl import overlong
from rlcode.rl import packing
from rlcode.rl import sequences
from rlcode.models import Decoder, ModelConfig

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                  num_heads=4, num_kv_heads=2, head_dim=8, max_seq_len=64,
                  attn_impl="reference")
MOE_CFG = dataclasses.replace(CFG, moe=dict(num_experts=4, top_k=2, intermediate_size=16))
PROMPTS, GROUP, WINDOW, STEPS = 4, 4, 8, 3
OVERLONG = {None: overlong.Overlong(WINDOW),
            "filter": overlong.Overlong(WINDOW, filter=True),
            "penalty": overlong.Overlong(WINDOW, buffer=4, factor=0.5)}

CELLS = [  # aggregation, advantage, layout, max_staleness, mesh (data, fsdp, tensor),
           # objective, rollout correction (mode, level) or None, per-token advantages,
           # overlong shaping (None, "filter", "penalty"), routing replay, sampling rounds
    ("seq_mean_token_mean", "grpo", "shared", 0, (1, 8, 1), "gspo", None, False, "penalty",
     True, 1),
    ("seq_mean_token_mean", "dr_grpo", "repeated", 1, (2, 2, 2), "cispo", None, False, None,
     True, 3),
    ("token_mean", "grpo", "repeated", 2, (4, 1, 2), "ppo", ("tis", "token"), False, "filter",
     False, 1),
    ("token_mean", "dr_grpo", "packed", 0, (1, 8, 1), "gspo_token", ("mis", "sequence"), False,
     "penalty", False, 3),
    ("seq_mean_token_sum_norm", "grpo", "packed", 2, (2, 2, 2), "cispo", None, True, "filter",
     False, 1),
    ("seq_mean_token_sum_norm", "dr_grpo", "shared", 1, (4, 1, 2), "ppo", ("tis", "sequence"),
     True, None, False, 1),
]
PACK_TOKENS = 2 * WINDOW  # two packs a group at most: min_packs keeps one shape


@functools.lru_cache(maxsize=None)
def _rollouts(seed, rounds=1):
  """STEPS batches of random prompts and completions (varied lengths) with random 0/1
  rewards (a group is flat, all 0, four times in ten), and a record of each token's
  experts (MOE_CFG's one layer, k distinct of its experts). With rounds > 1, DAPO's
  dynamic sampling (rlcode.rl.dynamic.fill_with_signal, the loops' rule) draws up to that
  many rounds a step and keeps the groups whose rewards differ."""
  rng = np.random.default_rng(seed)
  routes = np.random.default_rng(seed + 1)
  moe_ = MOE_CFG.moe
  record = lambda n: np.argsort(routes.uniform(size=(n, 1, moe_.num_experts)), -1)[
      ..., :moe_.top_k].astype(np.int32)

  def one_round(_):  # a completion's item: (prompt, its record, completion, record, reward)
    items = []
    for _ in range(PROMPTS):
      prompt = list(rng.integers(3, 64, rng.integers(4, 10)))
      prompt_record = record(len(prompt))
      for _ in range(GROUP):
        completion = list(rng.integers(3, 64, rng.integers(1, WINDOW + 1)))
        items.append((prompt, prompt_record, completion, record(len(completion)),
                      float(rng.uniform() < 0.2)))
    return items

  out = []
  for _ in range(STEPS):
    items, _, rounds_run = dynamic.fill_with_signal(one_round, GROUP, PROMPTS, rounds,
                                                    reward=lambda item: item[4])
    firsts = items[::GROUP]
    out.append(([it[0] for it in firsts], [it[2] for it in items],
                np.array([it[4] for it in items], np.float32),
                ([it[1] for it in firsts], [it[3] for it in items]), rounds_run))
  return out


def _batch(prompts, completions, adv, layout, per_token=False, experts=None):
  if per_token:  # on-policy distillation's form: one advantage a token
    adv = adv[:, None] + np.linspace(-0.5, 0.5, WINDOW, dtype=np.float32)[None, :]
  record = {} if experts is None else dict(prompt_experts=experts[0],
                                            completion_experts=experts[1])
  if layout == "shared":
    return shared_prefix.grouped_batch(prompts, completions, pad_id=0, completion_len=WINDOW,
                                       adv=adv, **record)
  if layout == "packed":
    assert experts is None, "packed batches carry no record"
    return packing.packed_batch(prompts, completions, pad_id=0, completion_len=WINDOW,
                                pack_tokens=PACK_TOKENS, adv=adv, min_packs=GROUP // 2)
  return sequences.sequence_batch(prompts, completions, np.repeat(np.arange(PROMPTS), GROUP),
                                  pad_id=0, adv=adv, window=WINDOW, **record)


LOGPROB_FNS = {"repeated": None, "shared": shared_prefix.logprob_fn(1.0),
               "packed": packing.logprob_fn(1.0)}


FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
OPTIMIZER = optim.OptimizerConfig(learning_rate=0.01, warmup_steps=1, decay_steps=10)


@functools.lru_cache(maxsize=None)
def _start(mesh_shape, replay=False):
  """(mesh, graphdef, initial train state) of the model (MoE with replay) on a mesh of
  this shape."""
  mesh = sharding.make_mesh(*mesh_shape)
  cfg = MOE_CFG if replay else CFG
  model = sharding.init_sharded(lambda: Decoder(cfg, rngs=nnx.Rngs(0)), mesh)
  graphdef, _ = nnx.split(model, nnx.Param)
  return mesh, graphdef, optim.init_state(model, optim.make_optimizer(OPTIMIZER), mesh)


def _example(layout, per_token=False, replay=False):
  rows = PROMPTS * GROUP
  record = (1, MOE_CFG.moe.top_k) if replay else None
  example = {"shared": lambda: shared_prefix.GroupedBatch.abstract(PROMPTS, rows, record),
             "packed": lambda: packing.PackedBatch.abstract(PROMPTS, rows),
             "repeated": lambda: sequences.SequenceBatch.abstract(rows, record)}[layout]()
  if per_token:
    example.adv = jax.ShapeDtypeStruct((rows, 1), np.float32)
  return example


@functools.lru_cache(maxsize=None)
def _log_probs(layout, mesh_shape, fix, per_token, replay):
  """The behaviour and proximal programs of a layout and correction on a mesh, compiled
  once."""
  mesh, graphdef, state = _start(mesh_shape, replay)
  fn = LOGPROB_FNS[layout]
  rows = PROMPTS * GROUP
  batch, _ = _placed(_rollouts(7)[0], "grpo", layout, mesh, per_token, None, replay)
  stale = jax.device_put(np.ones(rows, bool), optim.batch_shardings(
      mesh, jax.ShapeDtypeStruct((rows,), bool)))
  behaviour = grpo.make_logprob_fn(graphdef, mesh, 1.0, fn, rows)
  proximal = grpo.make_proximal_fn(graphdef, mesh, 1.0, fix, rows, fn)
  return (behaviour.lower(state.params, batch).compile(FAST),
          proximal.lower(state.params, batch, stale).compile(FAST), stale)


def _placed(rollout_, advantage, layout, mesh, per_token=False, shaping=None, replay=False):
  """(the step's batch on the mesh, its overlong shaping's effect: rows filtered and the
  mean penalty) of a rollout, its rewards shaped as the GRPO loop shapes them."""
  prompts, completions, rewards, experts, rounds_run = rollout_
  lengths = np.array([len(c) for c in completions], np.int32)
  ro = types.SimpleNamespace(generation=types.SimpleNamespace(
      finished=lengths < WINDOW, lengths=lengths), loss_lengths=lengths.copy())
  shaping = OVERLONG[shaping]
  rewards = shaping.apply(ro, rewards)
  batch = _batch(prompts, completions, advantages.group_advantages(rewards, GROUP, advantage),
                 layout, per_token, experts if replay else None)
  batch.mask = batch.mask * (ro.loss_lengths > 0)[:, None]  # the filter trains no token
  effect = {"filtered": int((ro.loss_lengths == 0).sum()),
            "penalty": float(shaping.penalty(lengths).mean()), "rounds": rounds_run,
            "flat_groups": int((np.ptp(rewards.reshape(-1, GROUP), axis=1) == 0).sum())}
  return (jax.device_put(batch, optim.batch_shardings(mesh, _example(layout, per_token,
                                                                     replay))), effect)


def _run(aggregation, advantage, layout, eta, mesh_shape, objective_name, rollout_fix,
         per_token, shaping, replay, rounds):
  """The cell's per-step metrics on a mesh of the given shape."""
  mesh, graphdef, start = _start(mesh_shape, replay)
  state = jax.tree.map(lambda x: x.copy(), start)  # the update donates it
  fix = (correction.Correction.decoupled(2.0) if rollout_fix is None else
         correction.Correction(*rollout_fix, cap=2.0, low=0.5, every_row=True))
  behaviour, proximal, stale = _log_probs(layout, mesh_shape, fix, per_token, replay)
  cfg = objective.LossConfig(aggregation=aggregation, max_completion_len=WINDOW,
                             clip_eps_low=0.2, clip_eps_high=0.28, objective=objective_name,
                             routing_replay=replay)
  placed = [_placed(r, advantage, layout, mesh, per_token, shaping, replay)
            for r in _rollouts(7, rounds)]
  update = grpo.make_update_step(
      graphdef, optim.make_optimizer(OPTIMIZER), cfg, mesh, state,
      _example(layout, per_token, replay), logprob_fn=LOGPROB_FNS[layout],
  ).lower(state, placed[0][0]).compile(FAST)
  versions = [jax.tree.map(lambda x: x.copy(), state.params)]
  out = []
  for step, (batch, effect) in enumerate(placed):
    sampled_with = max(0, step - eta)
    batch.old_logp = behaviour(versions[sampled_with], batch) * batch.mask
    metrics = {}
    if sampled_with < step or fix.every_row:
      batch.old_logp, batch.weight, batch.mask, metrics = proximal(state.params, batch, stale)
    state, m = update(state, batch)
    out.append({**jax.device_get(m), **jax.device_get(metrics), **effect})
    versions.append(jax.tree.map(lambda x: x.copy(), state.params))
  return out


@pytest.mark.slow
@pytest.mark.parametrize("aggregation,advantage,layout,eta,mesh_shape,objective_name,"
                         "rollout_fix,per_token,shaping,replay,rounds", CELLS)
def test_loss_is_finite_and_mesh_independent(aggregation, advantage, layout, eta, mesh_shape,
                                             objective_name, rollout_fix, per_token, shaping,
                                             replay, rounds):
  cell = (aggregation, advantage, layout, eta)
  switches = (objective_name, rollout_fix, per_token, shaping, replay, rounds)
  one = _run(*cell, (1, 1, 1), *switches)
  many = _run(*cell, mesh_shape, *switches)
  assert all(np.isfinite(r["loss"]) and not r["skipped"] for r in one + many)
  assert one[0]["grad_norm"] > 0
  if eta:
    assert one[-1]["iw_mean"] != 1.0
  if rollout_fix:
    assert "mismatch_kl" in one[-1]
  if shaping == "filter":  # some completions filled the window: they train no token
    assert sum(r["filtered"] for r in one) > 0
  if shaping == "penalty":
    assert min(r["penalty"] for r in one) < 0
  # Dynamic sampling ran more rounds where a round left flat groups, and kept none flat
  # unless it ran out of rounds; one round is the groups as they came.
  assert all(r["flat_groups"] == 0 or r["rounds"] == rounds for r in one)
  assert max(r["rounds"] for r in one) > 1 if rounds > 1 else all(
      r["rounds"] == 1 for r in one)
  assert [sorted(r) for r in one] == [sorted(r) for r in many]
  for key in one[0]:
    np.testing.assert_allclose(many[0][key], one[0][key], rtol=2e-5, atol=1e-6, err_msg=key)
  for a, b in zip(one[1:], many[1:]):
    for key in ("loss", "pg_loss", *(("iw_mean", "iw_clip_frac") if eta else ())):
      assert abs(a[key] - b[key]) < 1e-4, (key, a[key], b[key])


def test_the_grid_covers_every_switch():
  """Each layout, objective, correction mode and level, staleness, mesh, advantage shape,
  overlong switch, routing replay (in each layout with a record) and sampling rounds is in
  some cell, and each pair of aggregation x advantage, aggregation x layout, advantage x
  layout and staleness x layout where the grid's six cells can hold them."""
  column = lambda i: {c[i] for c in CELLS}
  assert column(2) == {"repeated", "shared", "packed"}
  assert column(3) == {0, 1, 2}
  assert column(5) == set(objective.OBJECTIVES)
  assert {m for m, _ in filter(None, column(6))} == set(correction.MODES)
  assert {lv for _, lv in filter(None, column(6))} == set(correction.LEVELS)
  assert column(7) == {False, True}
  assert column(8) == set(OVERLONG)
  assert {c[2] for c in CELLS if c[9]} == {"repeated", "shared"}
  assert column(10) == {1, 3}
  pairs = lambda i, j: {(c[i], c[j]) for c in CELLS}
  assert len(pairs(0, 1)) == 6 and len(pairs(0, 2)) == 6 and len(pairs(1, 2)) == 6
  assert len(pairs(3, 2)) == 6
