"""The features that make real models fit equal the plain path (float32, 8 CPU devices).

Rematerialisation (each policy), scanned layers, chunked log-probs and context
parallelism (context = 2 and 4) against the plain forward and backward of the model, for
dense, sliding, document and NSA layers; micro-batches (1, 2, 4), and all of them
together, through the GRPO update itself (one SGD step at learning rate 1, so the change
of the parameters is the gradient), with and without the shared prompt. "Equal" is a
relative error ||a - b|| / ||b|| of at most 1e-5 for every array. LoRA: zero-initialised adapters change no
logit, merged and unmerged adapters sample the same tokens, only adapters train.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rlcode import optim
from rlcode.kernels.spec import NSAConfig
from rlcode.models import Decoder, ModelConfig, lora
from rlcode.parallel import sharding
from rlcode.rl import grpo, objective, sequences, shared_prefix
from rlcode.sampling import generate, static_generate

BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=4, num_heads=4,
            num_kv_heads=2, attn_impl="xla", max_seq_len=256)
NSA = NSAConfig(block_cmp=8, stride_cmp=4, block_sel=8, num_sel=3, num_local=1, window=8,
                compress_hidden=16)
# Every kind of layer in one model, twice (a scan of two steps over the period of four).
KINDS = dict(num_layers=8, attention_pattern=("dense", "sliding", "document", "nsa"),
             sliding_window=6, nsa=NSA)
RTOL = 1e-5
T = 32


def _close(a, b, what=""):
  """Relative error ||a - b|| / ||b|| (Frobenius) at most RTOL."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  err = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)
  assert err <= RTOL, (what, err)


def _flat(model_or_state) -> dict:
  """{path: array} of a model's (or an nnx.State's) params."""
  state = model_or_state if isinstance(model_or_state, nnx.State) else nnx.state(
      model_or_state, nnx.Param)
  return {"/".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(state)}


def _as_looped(cfg, grads: nnx.State) -> dict:
  """Gradients of a scanned model in the looped layout (sliced like the params)."""
  model = nnx.merge(nnx.graphdef(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))),
                    grads)
  return _flat(model.looped())


def _model_loss_and_grads(cfg, mesh=None):
  """The loss sum(logits * w) over packed documents (the document layers see them; the
  others attend causally across) and its gradients."""
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, 64, (4, T)), jnp.int32)
  seg = jnp.asarray(np.repeat([[0] * 9 + [1] * 13 + [2] * 10], 4, 0), jnp.int32)
  weights = jnp.asarray(rng.normal(size=(4, T, 64)), jnp.float32)
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  if mesh is not None:
    params = jax.device_put(params, sharding.state_shardings(params, mesh))

  def loss(params):
    m = nnx.merge(graphdef, params)
    return jnp.sum(m(tokens, segment_ids=seg) * weights) / tokens.size

  def run(params):
    if mesh is None:
      return jax.value_and_grad(loss)(params)
    with sharding.activate(mesh):
      return jax.value_and_grad(loss)(params)

  fn = jax.jit(run)
  value, grads = fn(params)
  return value, grads, fn, params


_PLAIN = {}


def _plain(num_layers=KINDS["num_layers"]):
  if num_layers not in _PLAIN:
    value, grads, _, _ = _model_loss_and_grads(ModelConfig(**BASE | KINDS | dict(
        num_layers=num_layers)))
    _PLAIN[num_layers] = (value, _flat(grads))
  return _PLAIN[num_layers]


# The remat policies on one period of the four kinds (a scan needs two).
VARIANTS = {
    "remat_full": dict(remat="full", num_layers=4),
    "remat_dots": dict(remat="dots", num_layers=4),
    "remat_offload": dict(remat="offload", num_layers=4),
    "scan_remat_full": dict(scan_layers=True, remat="full"),
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_model_gradients_equal_the_plain_path(variant):
  cfg = ModelConfig(**BASE | KINDS | VARIANTS[variant])
  value, grads, _, _ = _model_loss_and_grads(cfg)
  plain_value, plain_grads = _plain(cfg.num_layers)
  _close(value, plain_value, "loss")
  got = _as_looped(cfg, grads) if cfg.scan_layers else _flat(grads)
  assert got.keys() == plain_grads.keys()
  for name in plain_grads:
    _close(got[name], plain_grads[name], name)


@pytest.mark.slow
@pytest.mark.parametrize("context, fsdp", [(4, 2)])
def test_context_parallel_gradients_equal_one_device(context, fsdp):
  cfg = ModelConfig(**BASE | KINDS)
  mesh = sharding.make_mesh(fsdp=fsdp, context=context)
  value, grads, fn, params = _model_loss_and_grads(cfg, mesh)
  plain_value, plain_grads = _plain()
  _close(value, plain_value, "loss")
  got = _flat(grads)
  for name in plain_grads:
    _close(got[name], plain_grads[name], name)
  # The sequence really is split: attention runs per shard on all-gathered keys, and
  # hidden states live as [4 / fsdp, T / context, 32] pieces.
  hlo = fn.lower(params).compile().as_text()
  assert "all-gather" in hlo and f"f32[{4 // fsdp},{T // context},32]" in hlo


def test_scanned_model_keeps_one_block_in_its_program():
  """Compile size does not grow with depth: the scanned forward's jaxpr holds one block."""
  count = {}
  for layers in (2, 8):
    cfg = ModelConfig(**{**BASE, "num_layers": layers}, scan_layers=True)
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    tokens = jnp.zeros((2, 16), jnp.int32)
    jaxpr = jax.make_jaxpr(lambda p: nnx.merge(graphdef, p)(tokens))(params)
    count[layers] = _equations(jaxpr.jaxpr)
  assert count[8] == count[2]


def _equations(jaxpr) -> int:
  """Equations of a jaxpr and of the jaxprs inside it (a scan's body counted once)."""
  total = 0
  for eqn in jaxpr.eqns:
    total += 1
    for value in eqn.params.values():
      inner = getattr(value, "jaxpr", value)
      if hasattr(inner, "eqns"):
        total += _equations(inner)
  return total


# --------------------------------------------------------------- the GRPO update

def _rollout_like(seed, prompts=4, group=4):
  rng = np.random.default_rng(seed)
  p = [rng.integers(1, 64, int(n)).tolist() for n in rng.integers(5, 20, prompts)]
  c = [rng.integers(1, 64, int(rng.integers(1, 13))).tolist() for _ in range(prompts * group)]
  old = [(-rng.random(16) * 2).astype(np.float32) for _ in c]
  ref = [(-rng.random(16) * 2).astype(np.float32) for _ in c]
  adv = rng.normal(size=len(c)).astype(np.float32)
  return p, c, old, ref, adv


def _batch(layout, prompts, completions, old, ref, adv, group=4):
  if layout == "shared":
    batch = shared_prefix.grouped_batch(prompts, completions, pad_id=0, completion_len=16,
                                        old_logp=old, adv=adv)
    batch.ref_logp = shared_prefix.grouped_batch(prompts, completions, pad_id=0,
                                                 completion_len=16, old_logp=ref).old_logp
    return batch
  index = np.repeat(np.arange(len(prompts)), group)
  batch = sequences.sequence_batch(prompts, completions, index, pad_id=0, old_logp=old,
                                   adv=adv, window=16)
  batch.ref_logp = sequences.sequence_batch(prompts, completions, index, pad_id=0,
                                            old_logp=ref, window=16).old_logp
  return batch


def _update_delta(cfg, layout, aggregation, mesh_kw, micro_rows=None, beta=0.04):
  """(loss, {param: its change}) of one GRPO update at SGD learning rate 1."""
  mesh = sharding.make_mesh(**mesh_kw)
  model = sharding.init_sharded(lambda: Decoder(cfg, rngs=nnx.Rngs(0)), mesh)
  graphdef, params = nnx.split(model, nnx.Param)
  loss_cfg = objective.LossConfig(aggregation=aggregation, beta=beta, max_completion_len=16)
  batch = _batch(layout, *_rollout_like(1))
  trainable = lora.trainable(cfg)
  state = optim.init_state(model, optax.sgd(1.0), mesh, trainable)
  looped = lambda params: _flat(nnx.merge(graphdef, params).looped())
  before = {k: np.asarray(v) for k, v in looped(state.params).items()}
  logprob_fn = shared_prefix.logprob_fn(1.0) if layout == "shared" else None
  update = grpo.make_update_step(graphdef, optax.sgd(1.0), loss_cfg, mesh, state,
                                 jax.tree.map(np.asarray, batch), logprob_fn=logprob_fn,
                                 micro_batch_rows=micro_rows, trainable=trainable)
  batch = jax.device_put(batch, optim.batch_shardings(mesh, batch))
  state, metrics = update(state, batch)
  after = looped(state.params)
  return metrics, {k: np.asarray(after[k]) - before[k] for k in after}


UPDATE_PLAIN = {}


def _update_plain(layout, aggregation):
  key = (layout, aggregation)
  if key not in UPDATE_PLAIN:
    UPDATE_PLAIN[key] = _update_delta(ModelConfig(**BASE), layout, aggregation, {})
  return UPDATE_PLAIN[key]


UPDATE_VARIANTS = {
    "micro_4_fsdp_2": (dict(), dict(fsdp=2), 4),
    "context_4_fsdp_2": (dict(), dict(context=4, fsdp=2), None),
    "all_together": (dict(remat="dots", scan_layers=True, logits_chunk=7),
                     dict(context=2, fsdp=2), 8),
}


# Each variant in the shared layout, both layouts with everything together.
UPDATE_CASES = [("shared", "micro_4_fsdp_2"), ("shared", "context_4_fsdp_2"),
                ("shared", "all_together"), ("repeated", "all_together")]


@pytest.mark.slow
@pytest.mark.parametrize("layout, variant", UPDATE_CASES)
def test_update_equals_the_plain_update(layout, variant):
  model_kw, mesh_kw, micro_rows = UPDATE_VARIANTS[variant]
  aggregation = "token_mean" if variant.startswith("micro") else "seq_mean_token_mean"
  cfg = ModelConfig(**BASE, **model_kw)
  metrics, delta = _update_delta(cfg, layout, aggregation, mesh_kw, micro_rows)
  plain_metrics, plain_delta = _update_plain(layout, aggregation)
  for key in ("loss", "pg_loss", "kl", "entropy", "ratio", "clip_frac", "grad_norm"):
    _close(metrics[key], plain_metrics[key], key)
  for name in plain_delta:
    _close(delta[name], plain_delta[name], name)


@pytest.mark.slow
@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean"])
def test_micro_batches_keep_the_other_aggregations(aggregation):
  metrics, delta = _update_delta(ModelConfig(**BASE), "shared", aggregation, {}, 4)
  plain_metrics, plain_delta = _update_plain("shared", aggregation)
  _close(metrics["loss"], plain_metrics["loss"], "loss")
  for name in plain_delta:
    _close(delta[name], plain_delta[name], name)


def test_chunked_logprobs_never_hold_the_whole_logits():
  """No [rows, window, vocab] float32 array in the compiled forward and backward."""
  found = {}
  for chunk in (None, 4):
    cfg = ModelConfig(**{**BASE, "vocab_size": 320}, logits_chunk=chunk)
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    batch = _batch("repeated", *_rollout_like(2))

    def loss(params):
      logp, entropy = sequences.sequence_logprobs(nnx.merge(graphdef, params), batch, 1.0)
      return jnp.sum(logp * batch.mask) + jnp.sum(entropy * batch.mask)
    hlo = jax.jit(jax.grad(loss)).lower(params).compile().as_text()
    found[chunk] = bool(re.search(r"f32\[16,16,320\]", hlo))
  assert found == {None: True, 4: False}


# --------------------------------------------------------------- LoRA

def _tokens():
  return jnp.asarray(np.random.default_rng(0).integers(0, 64, (4, T)), jnp.int32)


def test_zero_initialised_adapters_change_no_logit():
  tokens = _tokens()
  base = Decoder(ModelConfig(**BASE), rngs=nnx.Rngs(0))
  adapted = Decoder(ModelConfig(**BASE, lora=dict(rank=4)), rngs=nnx.Rngs(0))
  # The base weights are drawn first and alike; the adapters' A are random, B zero.
  for name, value in _flat(base).items():
    np.testing.assert_array_equal(np.asarray(value), np.asarray(_flat(adapted)[name]))
  np.testing.assert_array_equal(np.asarray(base(tokens)), np.asarray(adapted(tokens)))


def _trained_adapters(cfg):
  """A LoRA model whose B are no longer zero."""
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  rng = np.random.default_rng(3)
  flat = [(p, v.replace(jnp.asarray(rng.normal(size=v.get_value().shape) * 0.3,
                                    v.get_value().dtype))
           if isinstance(v, lora.LoRAParam) and p[-1] == "b" else v)
          for p, v in nnx.to_flat_state(state)]
  return nnx.merge(graphdef, nnx.from_flat_state(flat))


@pytest.mark.slow
@pytest.mark.parametrize("scan", [False, True])
def test_merged_and_unmerged_adapters_sample_the_same_tokens(scan):
  cfg = ModelConfig(**BASE, lora=dict(rank=4, alpha=8.0), scan_layers=scan)
  model = _trained_adapters(cfg)
  tokens = _tokens()
  merged = model.merged()
  assert merged.cfg.lora is None and not merged.cfg.scan_layers
  _close(merged(tokens), model(tokens), "logits")
  assert float(jnp.abs(model(tokens) - Decoder(ModelConfig(**BASE), rngs=nnx.Rngs(0))(
      tokens)).max()) > 1e-2  # the adapters do something
  prompts = [[5, 6, 7, 8], [9, 10, 11]]
  kw = dict(max_new_tokens=10, group_size=2, seed=4, temperature=1.0)
  a = generate(merged, prompts, **kw)  # plain matmuls on folded weights
  b = _unmerged_generate(model, prompts, **kw)  # the low-rank matmuls every token
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def _unmerged_generate(model, prompts, **kw):
  """generate() with the adapters applied at every token instead of folded in."""
  looped = model.looped()
  looped.for_sampling = lambda: looped
  return generate(looped, prompts, **kw)


@pytest.mark.slow
def test_lora_update_trains_the_adapters_alone():
  cfg = ModelConfig(**BASE, lora=dict(rank=4, base_dtype="bfloat16"))
  _, delta = _update_delta(cfg, "shared", "seq_mean_token_mean", {}, None)
  moved = {k for k, d in delta.items() if np.abs(d).max() > 0}
  assert moved and all("lora_" in k for k in moved), sorted(moved)[:4]
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  dtypes = {k: v.dtype for k, v in _flat(model).items()}
  assert all((v == jnp.float32) == ("lora_" in k) for k, v in dtypes.items())


def test_lora_optimizer_state_covers_the_adapters_only():
  cfg = ModelConfig(**BASE, lora=dict(rank=4))
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  state = optim.init_state(model, optax.adam(1e-3), sharding.make_mesh(), lora.trainable(cfg))
  adapters = sum(v.size for k, v in _flat(model).items() if "lora_" in k)
  moments = sum(x.size for x in jax.tree.leaves(state.opt_state) if x.ndim)
  assert moments == 2 * adapters


@pytest.mark.slow
def test_peft_adapter_round_trip(tmp_path):
  from rlcode.models import peft
  cfg = ModelConfig(**BASE, lora=dict(rank=4, alpha=8.0, targets=("q", "v", "o", "down")))
  model = _trained_adapters(cfg)
  peft.save_peft(model, str(tmp_path / "adapter"), base_model="tiny")
  assert peft.read_peft_config(str(tmp_path / "adapter")) == dataclasses.replace(
      cfg.lora, dropout=0.0)
  tokens = _tokens()
  for scan in (False, True):
    # The same base; other adapters (B zero, A drawn again) until the file's are loaded.
    fresh = Decoder(cfg.replace(scan_layers=scan), rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(fresh)
    state = jax.tree.map(lambda x: x * 0.5, state)
    state = nnx.merge_state(nnx.split_state(state, lora.LoRAParam, ...)[0],
                            nnx.split_state(nnx.state(fresh), lora.LoRAParam, ...)[1])
    fresh = nnx.merge(graphdef, state)
    assert float(jnp.abs(fresh(tokens) - model(tokens)).max()) > 1e-3
    loaded = peft.load_peft(fresh, str(tmp_path / "adapter"))
    _close(loaded(tokens), model(tokens), f"logits (scan={scan})")


@pytest.mark.slow
def test_offloaded_optimizer_state_gives_the_same_update():
  """Adam's state in pinned host memory, brought in by the update: the same two steps."""
  mesh = sharding.make_mesh(fsdp=2)
  cfg = ModelConfig(**BASE)
  batch = _batch("shared", *_rollout_like(5))
  loss_cfg = objective.LossConfig(max_completion_len=16)
  runs = {}
  for offload in (False, True):
    model = sharding.init_sharded(lambda: Decoder(cfg, rngs=nnx.Rngs(0)), mesh)
    graphdef, _ = nnx.split(model, nnx.Param)
    tx = optax.adam(1e-2)
    state = optim.init_state(model, tx, mesh, offload=offload)
    kinds = {x.sharding.memory_kind for x in jax.tree.leaves(state.opt_state)}
    assert kinds == ({"pinned_host"} if offload else {"device"})
    update = grpo.make_update_step(graphdef, tx, loss_cfg, mesh, state,
                                   jax.tree.map(np.asarray, batch),
                                   logprob_fn=shared_prefix.logprob_fn(1.0), offload=offload)
    placed = jax.device_put(batch, optim.batch_shardings(mesh, batch))
    for _ in range(2):
      state, metrics = update(state, placed)
    assert {x.sharding.memory_kind for x in jax.tree.leaves(state.opt_state)} == kinds
    runs[offload] = _flat(state.params)
  for name in runs[False]:
    _close(runs[True][name], runs[False][name], name)


@pytest.mark.slow
@pytest.mark.parametrize("share_prompt", [True, False, None])
def test_sampling_on_a_context_parallel_mesh_gives_the_same_tokens(share_prompt):
  """The static loop's prefill of the prompts split over context = 2 (and its decode loop
  reading a KV cache split the same way), and the engine (None: one engine per shard of
  the mesh), sample what one device samples."""
  model = Decoder(ModelConfig(**BASE), rngs=nnx.Rngs(0))
  prompts = [list(range(1, 30)), list(range(5, 37))]
  kw = dict(max_new_tokens=8, group_size=2, seed=3, temperature=1.0)
  sample = (generate if share_prompt is None
            else functools.partial(static_generate, share_prompt=share_prompt))
  one = sample(model, prompts, **kw)
  mesh = sharding.make_mesh(fsdp=2, context=2)
  split = sample(sharding.shard_module(model, mesh), prompts, mesh=mesh, **kw)
  np.testing.assert_array_equal(one.tokens, split.tokens)
  np.testing.assert_allclose(one.logprobs, split.logprobs, atol=1e-5)
