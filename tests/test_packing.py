"""Packed batches give the shared layout's log-probs, loss and gradients (rlcode.rl.packing)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import tiny_runs
from rlcode import cli, kernels, optim
from rlcode.kernels.flash import reference
from rlcode.models import Decoder, ModelConfig
from rlcode.parallel import sharding
from rlcode.rl import grpo, objective, packing, sequences, shared_prefix
from rlcode.train import grpo_loop

CFG = ModelConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_layers=2,
                  num_heads=4, num_kv_heads=2, qkv_bias=True, max_seq_len=256)
G, PAD, W = 4, 0, 24


def _data(seed, groups=4):
  """Prompts of several lengths and completions of heavy-tailed lengths (some empty)."""
  rng = np.random.default_rng(seed)
  prompts = [rng.integers(1, 40, int(n)).tolist() for n in rng.integers(3, 14, groups)]
  lengths = np.minimum(np.exp(rng.normal(1.5, 1.0, groups * G)).astype(int), W)
  lengths[1] = 0
  completions = [rng.integers(1, 40, int(n)).tolist() for n in lengths]
  old = [(-rng.random(W) * 2).astype(np.float32) for _ in completions]
  ref = [(-rng.random(W) * 2).astype(np.float32) for _ in completions]
  adv = rng.normal(size=len(completions)).astype(np.float32)
  return prompts, completions, old, ref, adv


def _batches(data, pack_tokens, shared=True):
  """(the padded batch, the packed one): the shared layout's, or the repeated rows'."""
  prompts, completions, old, ref, adv = data
  if shared:
    padded = shared_prefix.grouped_batch(prompts, completions, pad_id=PAD, completion_len=W,
                                         old_logp=old, adv=adv)
    padded.ref_logp = shared_prefix.grouped_batch(prompts, completions, pad_id=PAD,
                                                  completion_len=W, old_logp=ref).old_logp
  else:
    index = np.repeat(np.arange(len(prompts)), G)
    padded = sequences.sequence_batch(prompts, completions, index, pad_id=PAD, old_logp=old,
                                      adv=adv, window=W)
    padded.ref_logp = sequences.sequence_batch(prompts, completions, index, pad_id=PAD,
                                               old_logp=ref, window=W).old_logp
  packed = packing.packed_batch(prompts, completions, pad_id=PAD, completion_len=W,
                                pack_tokens=pack_tokens, old_logp=old, adv=adv, shared=shared)
  packed.ref_logp = padded.ref_logp
  return padded, packed


LAYOUT_FN = {True: shared_prefix.logprob_fn(1.0),
             False: lambda model, batch: sequences.sequence_logprobs(model, batch, 1.0)}


def _close(a, b):
  """Relative error ||a - b|| / ||b|| (Frobenius) at most 1e-5, as tests/test_fit.py's."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  assert np.linalg.norm(a - b) <= 1e-5 * max(np.linalg.norm(b), 1e-30)


def _model(seed=0, cfg=CFG):
  return nnx.split(Decoder(cfg, rngs=nnx.Rngs(seed)))


def test_first_fit_packs_by_decreasing_length():
  assert packing.first_fit([3, 7, 0, 5, 2], 8) == [[1], [3, 0], [4]]
  assert packing.first_fit([0, 0], 4) == []
  with pytest.raises(ValueError, match="a sequence of 5 tokens does not fit in a pack of 4"):
    packing.first_fit([5], 4)


def test_packed_attention_is_causal_within_each_segment_only():
  """kernels.PACKED against a mask written out here, in every implementation on CPU."""
  rng = np.random.default_rng(0)
  b, t, h, d = 2, 40, 4, 8
  q, k, v = (jnp.asarray(rng.normal(size=(b, t, h if i == 0 else 2, d)), jnp.float32)
             for i in range(3))
  seg = np.sort(rng.integers(0, 5, (b, t)), axis=1).astype(np.int32)
  i = np.arange(t)
  allowed = (i[None, None, :] <= i[None, :, None]) & (seg[:, :, None] == seg[:, None, :])
  want = reference.masked_attention(q, k, v, jnp.asarray(allowed))[0]
  spec = kernels.AttentionSpec(kind="packed", block_q=16, block_k=8)
  for impl in ("reference", "xla", "pallas_interpret"):
    got = kernels.attention(q, k, v, spec, impl=impl, segment_ids=jnp.asarray(seg))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=impl)


@pytest.mark.parametrize("pack_tokens, shared", [(24, True), (96, True), (40, False)])
def test_packed_logprobs_equal_the_padded_layouts(pack_tokens, shared):
  """Every completion token's log-prob and entropy, with packs of several budgets (one
  completion a pack at 24; several at 96), after the shared prompt or each after its own
  prompt copy (against the repeated rows)."""
  graphdef, params = _model()
  grouped, packed = _batches(_data(1), pack_tokens, shared)
  model = nnx.merge(graphdef, params)
  want, want_h = LAYOUT_FN[shared](model, grouped)
  got, got_h = packing.packed_logprobs(model, packed, 1.0)
  m = np.asarray(grouped.mask) > 0
  np.testing.assert_allclose(np.asarray(got)[m], np.asarray(want)[m], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(got_h)[m], np.asarray(want_h)[m], rtol=1e-5, atol=1e-5)
  assert packing.padding(packed)["update_computed_tokens"] < \
      packing.padding(grouped)["update_computed_tokens"] or pack_tokens == 96


def _loss_and_grads(graphdef, params, batch, logprob_fn, cfg):
  def loss(p):
    logp, _ = logprob_fn(nnx.merge(graphdef, p), batch)
    return objective.policy_loss(logp, batch.old_logp, batch.adv, batch.mask, cfg,
                                 ref_logp_nt=batch.ref_logp)[0]
  return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize("objective_name, shared", [("ppo", True), ("gspo", False)])
def test_packed_loss_and_gradients_equal_the_padded_layouts(objective_name, shared):
  graphdef, params = _model(1)
  grouped, packed = _batches(_data(2), 40, shared)
  cfg = objective.LossConfig(aggregation="seq_mean_token_mean", beta=0.05, clip_eps_low=0.2,
                             clip_eps_high=0.28, max_completion_len=W,
                             objective=objective_name)
  want = _loss_and_grads(graphdef, params, grouped, LAYOUT_FN[shared], cfg)
  got = _loss_and_grads(graphdef, params, packed, packing.logprob_fn(1.0), cfg)
  np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
  for g, w in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1])):
    _close(g, w)


def _update(seed, batch, mesh, logprob_fn, **options):
  """The parameters' change and the metrics of one update at SGD learning rate 1."""
  model = sharding.init_sharded(lambda: Decoder(CFG, rngs=nnx.Rngs(seed)), mesh)
  graphdef, _ = nnx.split(model, nnx.Param)
  state = optim.init_state(model, optax.sgd(1.0), mesh)
  before = jax.tree.map(np.asarray, state.params)
  cfg = objective.LossConfig(aggregation="token_mean", beta=0.04, max_completion_len=W)
  step = grpo.make_update_step(graphdef, optax.sgd(1.0), cfg, mesh, state,
                               jax.tree.map(np.asarray, batch), logprob_fn=logprob_fn,
                               **options)
  state, metrics = step(state, jax.device_put(batch, optim.batch_shardings(mesh, batch)))
  return jax.tree.map(lambda a, b: np.asarray(a) - b, state.params, before), metrics


@pytest.mark.parametrize("shared", [True, False])
def test_packed_update_on_micro_batches_by_tokens_and_a_mesh_equals_one_pass(shared):
  """The jitted update on a data x fsdp mesh of the fake devices (tests/conftest.py makes
  8), in micro-batches cut by tokens, equals the padded layout's single pass on one device."""
  grouped, packed = _batches(_data(3, groups=8), 40, shared)
  want, want_m = _update(2, grouped, sharding.make_mesh(), LAYOUT_FN[shared])
  budget = packed.computed_tokens() // 4
  assert packing.micro_count(packed, budget, 4) == 2  # 8 groups: 2 runs of 4, one a device
  got, got_m = _update(2, packed, sharding.make_mesh(data=2, fsdp=2), packing.logprob_fn(1.0),
                       micro_batches=lambda b: packing.micro_count(b, budget, 4))
  np.testing.assert_allclose(got_m["loss"], want_m["loss"], rtol=1e-5)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    _close(g, w)


def test_packing_refuses_layers_it_cannot_mask():
  graphdef, params = _model(cfg=CFG.replace(attention_pattern=("sliding",), sliding_window=8))
  _, packed = _batches(_data(4), 40)
  with pytest.raises(NotImplementedError, match="dense attention layers"):
    packing.packed_logprobs(nnx.merge(graphdef, params), packed, 1.0)


@pytest.mark.slow
@pytest.mark.parametrize("shared", [True, False])
def test_the_grpo_loop_trains_packed_batches_as_it_trains_padded_ones(tmp_path, shared):
  """Two tiny GRPO steps with rl.pack_tokens and micro-batches by tokens, with and without
  the shared prompt: the first step (the same rollouts from the same weights) has the
  padded run's loss and gradient norm;
  both log their padding (these random completions mostly run to the budget: packing has
  little to save here; tests above measure it on heavy-tailed lengths)."""
  run = lambda name, *flags: tiny_runs.steps(grpo_loop.train(tiny_runs.config(
      tmp_path / name, *flags)))
  layout = f"--config.rl.shared_prefix={str(shared).lower()}"
  padded = run("padded", layout)
  packed = run("packed", layout, f"--config.rl.pack_tokens={24 if shared else 96}",
               "--config.rl.micro_batch_tokens=64")
  assert len(packed) == 2 and all(np.isfinite(r["loss"]) and not r["skipped"] for r in packed)
  for key in ("loss", "grad_norm", "pg_loss", "entropy"):
    np.testing.assert_allclose(packed[0][key], padded[0][key], rtol=1e-5, atol=1e-7,
                               err_msg=key)
  assert packed[0]["completion_len"] == padded[0]["completion_len"]
  for p, q in zip(packed, padded):
    assert 0 <= p["update_padding_frac"] <= q["update_padding_frac"] < 1
    assert p["update_computed_tokens"] <= q["update_computed_tokens"]


@pytest.mark.parametrize("flags, needle", [
    (["--config.rl.pack_tokens=8"], "rl.pack_tokens=8 is less than rl.max_new_tokens=40"),
    (["--config.rl.micro_batch_tokens=64"], "rl.micro_batch_tokens cuts packed batches"),
    (["--config.rl.pack_tokens=64", "--config.rl.micro_batch_tokens=64",
      "--config.rl.micro_batch_rows=16"], "set one of them"),
])
def test_bad_packing_settings_are_one_line(capsys, flags, needle):
  assert cli.main(["config", "show", tiny_runs.CONFIG, *flags]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and needle in err, err
