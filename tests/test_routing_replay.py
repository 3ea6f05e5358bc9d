"""MoE routing replay: the update reuses the experts the sampler chose for each token.

Without a replay the MoE forward is today's; replaying the model's own choices gives its
logits exactly (gradients up to summation order); after the router changes so that some
tokens' top-k flip, replay keeps the recorded experts, weighted by the new router's
probabilities at them (against a numpy reference of the layer); the sampler's record
replayed in a GRPO update recomputes the behaviour log-probabilities at the sampling
weights, in both batch layouts.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rlcode import optim
from rlcode.models import Decoder, ModelConfig, moe
from rlcode.parallel import sharding
from rlcode.rl import grpo, objective, sequences, shared_prefix
from rlcode.sampling import generate

CFG = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=24, num_layers=3,
                  num_heads=2, num_kv_heads=1, max_seq_len=64,
                  moe=dict(num_experts=6, top_k=2, intermediate_size=8, dense_layers=(1,)))
MOE_LAYERS = 2  # layers 0 and 2


def _tokens(shape=(3, 12), seed=0):
  return jnp.asarray(np.random.default_rng(seed).integers(1, 64, shape), jnp.int32)


def _model(cfg=CFG, seed=0):
  return Decoder(cfg, rngs=nnx.Rngs(seed))


@functools.partial(jax.jit, static_argnums=0)
def _run(graphdef, params, tokens, experts):
  weights = jax.random.normal(jax.random.key(9), (*tokens.shape, 64))

  def loss(params):
    with moe.collect_experts() as box:
      logits = nnx.merge(graphdef, params)(tokens, experts=experts)
    return jnp.sum(logits * weights), (logits, box[0])
  (_, (logits, chosen)), grads = jax.value_and_grad(loss, has_aux=True)(params)
  return logits, chosen, jax.tree.leaves(grads)


def _forward(model, tokens, experts=None):
  """(logits, recorded experts [B, T, moe layers, k], gradient of a scalar of the logits)."""
  graphdef, params = nnx.split(model, nnx.Param)
  return _run(graphdef, params, tokens, experts)


@pytest.mark.parametrize("variant", [dict(), dict(scan_layers=True, remat="full")])
def test_own_replay_equals_routing(variant):
  """(b): a replay of the model's own choices, or one marked all unrecorded (-1), gives
  the routed forward's logits exactly and its gradients up to float32 summation order
  (another program). (a), no replay = the forward before replay existed, bit for bit,
  was checked once against the parent commit (logits and every gradient, both paths);
  here the routed layer is checked against numpy (`test_routed_layer_against_numpy`)."""
  model = _model(CFG.replace(**variant) if variant else CFG)
  tokens = _tokens()
  logits, chosen, grads = _forward(model, tokens)
  assert chosen.shape == (3, 12, MOE_LAYERS, 2) and chosen.dtype == jnp.int32
  for experts in (chosen, jnp.full_like(chosen, -1)):
    got_logits, got_chosen, got_grads = _forward(model, tokens, experts)
    np.testing.assert_array_equal(got_logits, logits)
    np.testing.assert_array_equal(got_chosen, chosen)
    for a, b in zip(got_grads, grads):
      err = np.linalg.norm(np.asarray(a) - b) / max(np.linalg.norm(b), 1e-30)
      assert err <= 1e-6, err


def _numpy_moe(layer, x, ids, norm):
  """The layer's routed output for tokens x [N, E] and experts ids [N, k], by hand."""
  x = np.asarray(x, np.float64)
  logits = x @ np.asarray(layer.router[...], np.float64)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  w = np.take_along_axis(p, ids, -1)
  if norm:
    w = w / w.sum(-1, keepdims=True)
  gu = np.asarray(layer.experts_gate_up[...], np.float64)
  down = np.asarray(layer.experts_down[...], np.float64)
  out = np.zeros_like(x)
  for n in range(x.shape[0]):
    for j, e in enumerate(ids[n]):
      h = np.einsum("d,dgf->gf", x[n], gu[e])
      gate = h[0] / (1 + np.exp(-h[0]))
      out[n] += w[n, j] * (gate * h[1]) @ down[e]
  return out


def test_routed_layer_against_numpy():
  """(a): without a replay the layer routes each token to its top k (numpy reference)."""
  layer = moe.MoE(CFG, rngs=nnx.Rngs(1))
  x = jnp.asarray(np.random.default_rng(2).normal(size=(2, 10, 16)), jnp.float32)
  out, aux = layer(x)
  logits = np.asarray(x).reshape(20, 16) @ np.asarray(layer.router[...])
  top = np.argsort(-logits, -1)[:, :2]
  np.testing.assert_array_equal(np.sort(np.asarray(aux["experts"]).reshape(20, 2), -1),
                                np.sort(top, -1))
  want = _numpy_moe(layer, np.asarray(x).reshape(20, 16), top, CFG.moe.norm_topk_prob)
  np.testing.assert_allclose(np.asarray(out).reshape(20, 16), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("norm", [True, False])
def test_replay_after_a_flip_keeps_the_old_experts(norm):
  """(c) at the layer: after the router moves, re-routing picks other experts for some
  tokens; replay uses the recorded ones with the new router's weights (numpy reference),
  and the router still gets a gradient through them."""
  cfg = CFG.replace(moe=dataclasses.replace(CFG.moe, norm_topk_prob=norm))
  layer = moe.MoE(cfg, rngs=nnx.Rngs(1))
  x = jnp.asarray(np.random.default_rng(2).normal(size=(2, 10, 16)), jnp.float32)
  _, aux = layer(x)
  old = np.asarray(aux["experts"])
  layer.router[...] = layer.router[...] + 0.5 * jax.random.normal(jax.random.key(3), (16, 6))
  routed, aux_new = layer(x)
  flipped = np.any(np.sort(np.asarray(aux_new["experts"]), -1) != np.sort(old, -1), -1)
  assert flipped.sum() >= 3, flipped.sum()
  replayed, aux_replay = layer(x, jnp.asarray(old))
  np.testing.assert_array_equal(aux_replay["experts"], old)
  want = _numpy_moe(layer, np.asarray(x).reshape(20, 16), old.reshape(20, 2), norm)
  np.testing.assert_allclose(np.asarray(replayed).reshape(20, 16), want, rtol=1e-5, atol=1e-6)
  assert not np.allclose(np.asarray(replayed)[flipped], np.asarray(routed)[flipped])
  np.testing.assert_array_equal(np.asarray(replayed)[~flipped], np.asarray(routed)[~flipped])

  graphdef, params = nnx.split(layer, nnx.Param)
  grad = jax.grad(lambda p: jnp.sum(nnx.merge(graphdef, p)(x, jnp.asarray(old))[0] ** 2))(params)
  assert np.abs(np.asarray(grad["router"][...])).sum() > 0


def test_replay_in_the_model_after_a_flip():
  """(c) in the decoder: with the weights changed, the replayed forward's MoE layers use
  the recorded experts (what it records back), its logits differ from re-routing, and a
  replayed forward of the old weights gives the old logits."""
  model = _model()
  tokens = _tokens()
  logits_old, chosen_old, _ = _forward(model, tokens)
  graphdef, params = nnx.split(model, nnx.Param)
  key = iter(jax.random.split(jax.random.key(4), 8))
  params = jax.tree.map(lambda a: a + 0.5 * jax.random.normal(next(key), a.shape)
                        if a.shape[-1] == 6 else a, params)  # the routers
  moved = nnx.merge(graphdef, params)
  logits_routed, chosen_new, _ = _forward(moved, tokens)
  assert np.any(np.asarray(chosen_new) != np.asarray(chosen_old))
  logits_replay, chosen_replay, _ = _forward(moved, tokens, chosen_old)
  np.testing.assert_array_equal(chosen_replay, chosen_old)
  assert not np.allclose(logits_replay, logits_routed)


def _recorded_by_a_forward(model, prompts, gen):
  """The experts a recording forward of each row's prompt + completion chooses (per
  prompt, per row's completion), at the sampling weights."""
  completions, index = gen.completions(), gen.prompt_index
  batch = sequences.sequence_batch(prompts, completions, index, pad_id=0,
                                   old_logp=list(gen.logprobs), window=16, multiple=16)

  @jax.jit
  def record(tokens):
    with moe.collect_experts() as box:
      model.hidden(tokens)
    return box[0]
  full = np.asarray(record(jnp.asarray(batch.tokens)))
  plens = [len(prompts[p]) for p in index]
  prompt_experts = [full[list(index).index(p), :len(prompts[p])] for p in range(len(prompts))]
  completion_experts = [full[i, plens[i]:plens[i] + len(c)] for i, c in enumerate(completions)]
  return prompt_experts, completion_experts


def _sampled(model, prompts, group, **kwargs):
  """The sampler's tokens, log-probs and recorded experts (per prompt, per completion)."""
  gen = generate(model, prompts, max_new_tokens=10, temperature=1.0, group_size=group,
                 seed=3, stop_tokens=(2,), experts=True, **kwargs)
  completions = gen.completions()
  return gen, completions, gen.prompt_experts, [gen.experts[i] for i in range(len(completions))]


@pytest.mark.parametrize("pages", [None, 6])
def test_the_engine_records_the_experts_a_forward_chooses(pages):
  """The engine's record (prefill chunks, decode steps; with 6 pages of 16, rows are
  preempted and recomputed) equals a full forward's choices at every token it processed;
  a row's last token, never fed back, is -1, as is every position past it."""
  model = _model(seed=2)
  prompts = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [3]]
  gen, completions, pe, ce = _sampled(model, prompts, 2, num_pages=pages)
  assert gen.experts.shape == (6, 10, MOE_LAYERS, 2)
  want_pe, want_ce = _recorded_by_a_forward(model, prompts, gen)
  for got, want in zip(pe, want_pe):
    np.testing.assert_array_equal(got, want)
  for i, completion in enumerate(completions):
    n = len(completion)
    np.testing.assert_array_equal(ce[i][:n - 1], want_ce[i][:n - 1])
    assert np.all(ce[i][n - 1:] == -1)
  # Recording changes no sample.
  plain = generate(model, prompts, max_new_tokens=10, temperature=1.0, group_size=2, seed=3,
                   stop_tokens=(2,), num_pages=pages)
  np.testing.assert_array_equal(plain.tokens, gen.tokens)
  assert plain.experts is None and plain.prompt_experts is None


def test_a_dense_model_records_nothing():
  dense = _model(dataclasses.replace(CFG, moe=None))
  gen = generate(dense, [[3, 4, 5]], max_new_tokens=4, group_size=2, experts=True)
  assert gen.experts is None and gen.prompt_experts is None


@pytest.mark.parametrize("layout", ["repeated", "shared"])
def test_update_with_routing_replay_recomputes_the_behaviour_logprobs(layout):
  """(e): a GRPO step with rl.routing_replay: the update's recomputed log-probs at the
  sampling weights equal the sampler's (ratio 1, and make_logprob_fn within 1e-5)."""
  model = _model(seed=2)
  prompts = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [3]]
  group = 2
  gen, completions, pe, ce = _sampled(model, prompts, group)
  adv = np.random.default_rng(0).normal(size=len(completions)).astype(np.float32)
  old = list(gen.logprobs)
  if layout == "shared":
    batch = shared_prefix.grouped_batch(prompts, completions, pad_id=0, completion_len=16,
                                        old_logp=old, adv=adv, prompt_experts=pe,
                                        completion_experts=ce, prompt_multiple=16)
    fn = shared_prefix.logprob_fn(1.0)
  else:
    batch = sequences.sequence_batch(prompts, completions, gen.prompt_index, pad_id=0,
                                     old_logp=old, adv=adv, window=16, multiple=16,
                                     prompt_experts=pe, completion_experts=ce)
    fn = None
  mesh = sharding.make_mesh()
  graphdef, _ = nnx.split(model, nnx.Param)
  state = optim.init_state(model, optax.sgd(0.1), mesh)
  batch_sh = optim.batch_shardings(mesh, batch)
  logp = grpo.make_logprob_fn(graphdef, mesh, 1.0, fn)(state.params,
                                                       jax.device_put(batch, batch_sh))
  mask = np.asarray(batch.mask) > 0
  np.testing.assert_allclose(np.asarray(logp)[mask], np.asarray(batch.old_logp)[mask],
                             rtol=1e-5, atol=1e-5)
  cfg = objective.LossConfig(max_completion_len=16, routing_replay=True)
  update = grpo.make_update_step(graphdef, optax.sgd(0.1), cfg, mesh, state,
                                 jax.tree.map(np.asarray, batch), logprob_fn=fn)
  state, metrics = update(state, jax.device_put(batch, batch_sh))
  assert int(metrics["skipped"]) == 0
  np.testing.assert_allclose(float(metrics["ratio"]), 1.0, atol=1e-5)
  assert float(metrics["clip_frac"]) == 0.0


def test_routing_replay_needs_a_record():
  model = _model()
  batch = sequences.sequence_batch([[3, 4]], [[5, 6]], [0], pad_id=0, old_logp=[np.zeros(2)],
                                   adv=[1.0], window=16, multiple=16)
  with pytest.raises(ValueError, match="routing_replay"):
    grpo.with_routing(batch, True)
  assert grpo.with_routing(batch, False).experts is None
  del model


def _moe_job(tmp_path, *overrides):
  import tiny_runs
  from rlcode.config import loader
  raw = loader.read_config_file(tiny_runs.CONFIG)
  with raw.unlocked():
    raw.model.arch.moe = dict(num_experts=4, top_k=2, intermediate_size=16)
  return loader.resolve(raw, [*tiny_runs.TINY, f"--config.workdir={tmp_path}", *overrides])


@pytest.mark.slow
def test_a_grpo_run_trains_on_the_samplers_experts(tmp_path):
  """rl.routing_replay=true through the GRPO loop: the rollouts record the experts and the
  update replays them (it refuses a batch without a record, so a run that did not record
  them fails). The shared-prompt layout; the update of both layouts replays a record in
  test_update_with_routing_replay_recomputes_the_behaviour_logprobs."""
  from rlcode.train import grpo_loop
  import tiny_runs
  rows = grpo_loop.train(_moe_job(tmp_path, "--config.rl.routing_replay=true"))
  steps = tiny_runs.steps(rows)
  assert [r["step"] for r in steps] == [1, 2]
  assert all(np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"]) for r in steps)


def test_routing_replay_of_a_dense_model_is_one_line(tmp_path, capsys):
  from rlcode import cli
  import tiny_runs
  code = cli.main(["train", "--config", tiny_runs.CONFIG, *tiny_runs.TINY,
                   f"--config.workdir={tmp_path}", "--config.rl.routing_replay=true"])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(err) == 1 and "no MoE layers" in err[0]
