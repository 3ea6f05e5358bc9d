"""Asynchronous rollouts: the capacity rule, the decoupled loss, weight sync to a split mesh,
and whole runs (eta = 0 against the synchronous loop, a split mesh, stale rollouts)."""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import tiny_runs
from rlcode.rl import algorithm, async_rollouts, shared_prefix
from rlcode.parallel import distributed, sharding
from rlcode import rewards
from rlcode import optim
from rlcode.rl import advantages
from rlcode.rl import correction
from rlcode.rl import grpo
from rlcode.rl import objective
from rlcode.rl import rollout
from rlcode.rl import sequences
from rlcode.train import grpo_loop
from rlcode.data.stream import TaskStream
from rlcode.data import sources
from rlcode.models import Decoder, ModelConfig
from rlcode.models.build import build_model

# --------------------------------------------------------------------------- the thread and queue


def _drive(max_staleness, policy, steps, start=0, train_seconds=0.0, sample_seconds=0.0):
  """Runs the trainer's side of the loop; returns what produce saw and the published
  version at each call."""
  store = async_rollouts.WeightStore(max_staleness, policy)
  published = [start]
  seen = []

  def produce(index, version, weights):
    seen.append((index, version, weights, published[-1]))
    time.sleep(sample_seconds)
    return index * 10

  store.publish(start, f"w{start}")
  with async_rollouts.AsyncRollouts(produce, store, start=start, stop=start + steps) as ro:
    for step in range(start, start + steps):
      got, _ = ro.next()
      assert (got.index, got.value) == (step, step * 10)
      time.sleep(train_seconds)
      published.append(step + 1)
      store.publish(step + 1, f"w{step + 1}")
  return seen


def test_eta0_samples_each_step_with_the_weights_of_the_update_before_it():
  seen = _drive(0, "latest", steps=6)
  assert [(i, v, w) for i, v, w, _ in seen] == [(i, i, f"w{i}") for i in range(6)]


@pytest.mark.parametrize("policy", async_rollouts.POLICIES)
def test_capacity_rule_bounds_the_lag(policy):
  # A fast sampler and a slow trainer: the sampler runs ahead as far as eta allows.
  seen = _drive(2, policy, steps=8, train_seconds=0.03)
  for index, version, weights, newest in seen:
    assert index - 2 <= version <= newest and weights == f"w{version}"
  assert max(i - v for i, v, _, _ in seen) == 2


def test_oldest_policy_lags_by_exactly_eta_whatever_the_timing():
  slow_trainer = _drive(2, "oldest", steps=7, start=3, train_seconds=0.02)
  slow_sampler = _drive(2, "oldest", steps=7, start=3, sample_seconds=0.02)
  want = [(k, max(3, k - 2)) for k in range(3, 10)]
  assert [(i, v) for i, v, _, _ in slow_trainer] == want
  assert [(i, v) for i, v, _, _ in slow_sampler] == want


def test_latest_policy_takes_the_newest_version():
  # A slow sampler: by the time it starts a step, the trainer has published more.
  seen = _drive(3, "latest", steps=6, sample_seconds=0.03)
  assert all(v == newest for _, v, _, newest in seen)


def test_a_sampler_error_is_raised_by_next():
  store = async_rollouts.WeightStore(1)
  store.publish(0, "w0")

  def produce(index, version, weights):
    raise KeyError(f"reward broke at {index}")

  with async_rollouts.AsyncRollouts(produce, store, start=0, stop=3) as ro:
    with pytest.raises(KeyError, match="reward broke at 0"):
      ro.next()


def test_close_stops_a_sampler_waiting_for_weights():
  store = async_rollouts.WeightStore(0)
  store.publish(0, "w0")
  calls = []
  ro = async_rollouts.AsyncRollouts(lambda i, v, w: calls.append(i), store, start=0, stop=5)
  ro.next()  # step 0; step 1 waits for version 1, which never comes
  start = time.perf_counter()
  ro.close()
  assert time.perf_counter() - start < 5 and calls == [0]
  assert not any(t.name == "rlcode-sampler" for t in threading.enumerate())


def test_versions_are_published_in_order():
  store = async_rollouts.WeightStore(1)
  store.publish(3, "w3")
  with pytest.raises(ValueError, match="after version 3"):
    store.publish(3, "again")
  with pytest.raises(ValueError, match="sample_version"):
    async_rollouts.WeightStore(1, "newest")


# --------------------------------------------------------------------------- the decoupled loss

CFG = ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                  num_kv_heads=1, head_dim=16, max_seq_len=64, attn_impl="reference")


def test_policy_loss_weights_each_token():
  rng = np.random.default_rng(0)
  logp, old = rng.normal(-1, 0.3, (2, 3, 5)).astype(np.float32)
  weight = rng.uniform(0.2, 2.0, (3, 5)).astype(np.float32)
  mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], np.float32)
  adv = np.array([1.0, -0.5, 2.0], np.float32)
  cfg = objective.LossConfig(aggregation="token_mean", max_completion_len=5)
  loss, _ = objective.policy_loss(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv),
                             jnp.asarray(mask), cfg, weight_nt=jnp.asarray(weight))
  expect = []
  for i in range(3):
    for t in range(5):
      if mask[i, t]:
        r = np.exp(logp[i, t] - old[i, t])
        c = min(max(r, 0.8), 1.2)
        expect.append(-weight[i, t] * min(r * adv[i], c * adv[i]))
  np.testing.assert_allclose(float(loss), np.mean(expect), rtol=1e-6)


def test_proximal_fn_recomputes_stale_rows_only():
  mesh = sharding.make_mesh(1, 1, 1)
  model = sharding.init_sharded(lambda: Decoder(CFG, rngs=nnx.Rngs(0)), mesh)
  graphdef, params = nnx.split(model, nnx.Param)
  rng = np.random.default_rng(1)
  batch = sequences.sequence_batch([list(rng.integers(3, 32, 7)) for _ in range(2)],
                                 [list(rng.integers(3, 32, n)) for n in (5, 3, 6, 1)],
                                 [0, 0, 1, 1], pad_id=0)
  prox = np.asarray(jax.jit(lambda p, b: sequences.sequence_logprobs(nnx.merge(graphdef, p), b, 1.0)
                            [0])(params, batch))
  # Behaviour log-probs some way off the proximal ones: a few weights pass the cap of 1.5.
  behav = (prox + rng.normal(0, 0.6, prox.shape)).astype(np.float32) * batch.mask
  batch.old_logp = behav
  stale = np.array([True, False, True, False])
  fn = grpo.make_proximal_fn(graphdef, mesh, 1.0, correction.Correction.decoupled(1.5), rows=4)
  old, weight, mask, metrics = jax.device_get(fn(params, batch, stale))
  np.testing.assert_array_equal(mask, batch.mask)  # truncation masks nothing
  valid = batch.mask > 0
  raw = np.exp(prox - behav)
  want_w = np.where(stale[:, None] & valid, np.minimum(raw, 1.5), 1.0)
  np.testing.assert_allclose(weight[valid], want_w[valid], rtol=1e-5)
  np.testing.assert_array_equal(weight[~stale], 1.0)
  np.testing.assert_allclose(old[stale][valid[stale]], prox[stale][valid[stale]], rtol=1e-6)
  np.testing.assert_array_equal(old[~stale], behav[~stale])  # fresh rows: untouched
  truncated = (raw > 1.5) & stale[:, None] & valid
  assert truncated.any()
  np.testing.assert_allclose(metrics["iw_clip_frac"], truncated[valid].mean(), rtol=1e-6)
  np.testing.assert_allclose(metrics["iw_mean"], want_w[valid].mean(), rtol=1e-5)
  with pytest.raises(ValueError, match="max_importance_weight"):
    correction.Correction.decoupled(0.5)


# --------------------------------------------------------------------------- weight sync


def test_sampler_weights_equal_trainer_weights_after_a_sync():
  mesh, sampler_mesh = distributed.meshes({"data": 1, "fsdp": 4, "tensor": 1, "context": 1}, "data=2,tensor=2")
  assert not set(mesh.devices.flat) & set(sampler_mesh.devices.flat)
  cfg = CFG.replace(num_heads=4, num_kv_heads=2)
  model = sharding.init_sharded(lambda: Decoder(cfg, rngs=nnx.Rngs(0)), mesh)
  _, params = nnx.split(model, nnx.Param)
  sync = async_rollouts.WeightSync(mesh, sampler_mesh, params)
  copy, seconds = sync(params)
  assert seconds >= 0
  want = sharding.state_shardings(params, sampler_mesh)
  for x, y, s in zip(jax.tree.leaves(params), jax.tree.leaves(copy), jax.tree.leaves(want)):
    assert y.sharding == s and y.devices() <= set(sampler_mesh.devices.flat)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
  # Sampling on the trainer's own devices gets a copy in the trainer's layout, in
  # buffers of its own: the trainer donates its params to the next update.
  same, _ = async_rollouts.WeightSync(mesh, mesh, params)(params)
  buffers = lambda x: {s.data.unsafe_buffer_pointer() for s in x.addressable_shards}
  for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(same)):
    assert y.sharding == x.sharding and not buffers(x) & buffers(y)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))


def test_a_sampler_mesh_that_does_not_fit_is_one_clear_error():
  with pytest.raises(ValueError, match="need 4 \\+ 8 devices"):
    distributed.meshes({"data": 1, "fsdp": 4, "tensor": 1, "context": 1}, "tensor=8")
  with pytest.raises(ValueError, match="config.sampler_mesh"):
    distributed.meshes({"data": 1, "fsdp": 4, "tensor": 1, "context": 1}, "pipeline=2")


# --------------------------------------------------------------------------- whole runs


def _synchronous_loop(config):
  """The loop before rlcode.async_rollouts, step for step: sample with the current params,
  score, advantages, batch, update. The truth a run at eta = 0 must equal exactly."""
  rl = config.rl
  mesh = sharding.mesh_from_config(config.mesh)
  model, tokenizer = build_model(config.model, mesh, config.seed)
  tasks, _ = rollout.fit_tasks(sources.load(config.data, config.data.train_split), tokenizer,
                               split="train", max_seq_len=model.cfg.max_seq_len,
                               max_new_tokens=rl.max_new_tokens, drop_too_long=False)
  graphdef, _ = nnx.split(model, nnx.Param)
  optimizer = optim.make_optimizer(optim.OptimizerConfig.from_config(config.optimizer))
  state = optim.init_state(model, optimizer, mesh)
  n = rl.prompts_per_step * rl.group_size
  update = shared_prefix.update_step(graphdef, optimizer,
                                     algorithm.loss(rl, rl.max_new_tokens), mesh,
                                     state, shared_prefix.GroupedBatch.abstract(
                                         rl.prompts_per_step, n))
  stream = TaskStream(tasks, rl.prompts_per_step, config.seed)
  rows = []
  for step in range(config.train.steps):
    ro = rollout.sample(nnx.merge(graphdef, state.params), tokenizer, stream.next(),
                        group_size=rl.group_size, max_new_tokens=rl.max_new_tokens,
                        temperature=rl.temperature, seed=config.seed * 1_000_003 + step,
                        mesh=mesh)
    reward = rollout.score(ro, dict(config.rewards), rewards.options(config.reward_options))
    adv = advantages.group_advantages(reward.scores, rl.group_size, rl.advantage)
    batch = shared_prefix.rl_batch(ro, adv, tokenizer.pad_id, rl.max_new_tokens)
    for _ in range(rl.num_passes):
      state, m = update(state, batch)
    rows.append({**{k: float(v) for k, v in jax.device_get(m).items()},
                 "reward_mean": float(reward.scores.mean()),
                 "completion_len": float(ro.generation.lengths.mean()),
                 "trained_len": float(ro.loss_lengths.mean())})
  return rows


@pytest.fixture(scope="module")
def eta0(tmp_path_factory):
  return tiny_runs.steps(grpo_loop.train(tiny_runs.config(tmp_path_factory.mktemp("eta0"))))


@pytest.mark.slow
def test_eta0_is_the_synchronous_loop_exactly(eta0, tmp_path):
  want = _synchronous_loop(tiny_runs.config(tmp_path))
  assert len(eta0) == len(want) == 2
  assert any(r["grad_norm"] > 0 for r in want)  # the policy moved: the runs can differ
  for got, ref in zip(eta0, want):
    assert {k: got[k] for k in ref} == ref
    assert got["staleness/0"] == 32 and got["iw_clip_frac"] == 0 and got["iw_mean"] == 1


@pytest.mark.slow
def test_split_mesh_logs_the_same_losses_as_one_mesh(eta0, tmp_path):
  rows = grpo_loop.train(tiny_runs.config(tmp_path, "--config.mesh.fsdp=4",
                                      "--config.sampler_mesh=data=2,tensor=2"))
  split = tiny_runs.steps(rows)
  for got, one in zip(split, eta0):
    assert got["reward_mean"] == one["reward_mean"]
    for key in ("loss", "pg_loss", "entropy", "grad_norm", "ratio"):
      assert abs(got[key] - one[key]) < 1e-5, key
  assert all(r["sync_seconds"] > 0 for r in rows if "loss" in r)


@pytest.mark.slow
def test_stale_rollouts_are_corrected(eta0, tmp_path):
  rows = tiny_runs.steps(grpo_loop.train(tiny_runs.config(
      tmp_path, "--config.rl.max_staleness=1", "--config.rl.sample_version=oldest")))
  assert [(r["staleness/0"], r["staleness/1"]) for r in rows] == [(32, 0), (0, 32)]
  assert rows[0] == {**eta0[0], "staleness/1": 0}  # step 1 is on-policy either way
  second = rows[1]
  assert np.isfinite(second["loss"]) and 0 <= second["iw_clip_frac"] <= 1
  assert second["iw_mean"] != 1.0 and 0 < second["iw_mean"] <= 2.0


@pytest.mark.slow
def test_partial_rollouts_train_on_groups_whose_tokens_are_at_most_eta_old(tmp_path):
  """rl.rollouts=partial, eta = 1, 3 steps: each step trains 4 groups that finished on
  engines that never stopped (the first to finish), every row's oldest token at most one
  version behind the trainer; stale rows get the importance correction."""
  rows = tiny_runs.steps(grpo_loop.train(tiny_runs.config(
      tmp_path, "--config.rl.max_staleness=1", "--config.rl.rollouts=partial",
      "--config.train.steps=3", "--config.train.checkpoint_every=3")))
  assert len(rows) == 3
  for r in rows:
    assert r["staleness/0"] + r["staleness/1"] == 32 and np.isfinite(r["loss"])
    assert 0 <= r["iw_clip_frac"] <= 1
  assert rows[0]["staleness/0"] == 32  # nothing was published before the first update
  assert sum(r["staleness/1"] for r in rows[1:]) > 0  # later groups straddle updates


def test_partial_rollouts_need_a_staleness_bound(tmp_path):
  with pytest.raises(ValueError, match="rl.rollouts=partial needs rl.max_staleness >= 1"):
    grpo_loop.train(tiny_runs.config(tmp_path, "--config.rl.rollouts=partial"))
