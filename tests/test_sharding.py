"""One device versus a 2x2x2 mesh of fake CPU devices: same numbers, sharded storage."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from rlcode.rl import logprobs
from rlcode.parallel import sharding
from rlcode.models import Decoder, ModelConfig, load_hf
from rlcode.sampling import generate

TINY = os.path.join(os.path.dirname(__file__), "data", "qwen2_tiny")
CFG = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_layers=2,
                  num_heads=4, num_kv_heads=2, qkv_bias=True, max_seq_len=64)


def _forward_and_loss(model, tokens, mesh):
  graphdef, state = nnx.split(model)

  @jax.jit
  def run(state, tokens):
    with sharding.activate(mesh):
      logits = nnx.merge(graphdef, state)(tokens)
      return logits, logprobs.cross_entropy(logits[:, :-1], tokens[:, 1:])
  with sharding.activate(mesh):
    tokens = jax.device_put(tokens, sharding.logical_sharding(("batch", "length"), tokens.shape))
  return run(state, tokens)


@pytest.mark.slow
def test_eight_devices_match_one():
  assert jax.device_count() == 8
  one = sharding.make_mesh(1, 1, 1)
  eight = sharding.make_mesh(2, 2, 2)
  model = sharding.init_sharded(lambda: Decoder(CFG, rngs=nnx.Rngs(3)), one)
  tokens = jax.random.randint(jax.random.key(0), (8, 24), 0, CFG.vocab_size)
  logits1, loss1 = _forward_and_loss(model, tokens, one)
  model8 = sharding.shard_module(model, eight)
  logits8, loss8 = _forward_and_loss(model8, tokens, eight)
  assert len(logits8.sharding.device_set) == 8
  np.testing.assert_allclose(np.asarray(logits8), np.asarray(logits1), atol=1e-5, rtol=0)
  np.testing.assert_allclose(float(loss8), float(loss1), atol=1e-5, rtol=0)


def test_sharded_init_places_every_parameter_and_matches_one_device():
  mesh = sharding.make_mesh(2, 2, 2)
  model = sharding.init_sharded(lambda: Decoder(CFG, rngs=nnx.Rngs(3)), mesh)
  attn = model.layers[0].attn
  assert attn.qkv[...].sharding.spec == P("fsdp", "tensor", None, None)
  assert model.embed[...].sharding.spec == P("tensor", "fsdp")
  assert model.layers[0].mlp.down[...].sharding.spec == P("tensor", "fsdp")
  # No device holds a whole sharded parameter: each shard is a quarter of it.
  shard = attn.qkv[...].addressable_shards[0].data
  groups = CFG.num_heads // CFG.num_kv_heads + 2
  assert shard.shape == (CFG.hidden_size // 2, CFG.num_kv_heads // 2, groups, CFG.head_dim)
  # Sharding changes where numbers live, not the numbers (threefry is partitionable).
  plain = sharding.init_sharded(lambda: Decoder(CFG, rngs=nnx.Rngs(3)), sharding.make_mesh(1, 1, 1))
  for (path, a), (_, b) in zip(nnx.to_flat_state(nnx.state(model)),
                               nnx.to_flat_state(nnx.state(plain))):
    np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()),
                                  err_msg=str(path))


@pytest.mark.slow
def test_load_hf_lands_in_mesh_shardings():
  mesh = sharding.make_mesh(2, 2, 2)
  model, cfg = load_hf(TINY, mesh=mesh)
  gate_up = model.layers[1].mlp.gate_up[...]
  assert gate_up.sharding.spec == P("fsdp", None, "tensor")
  assert gate_up.addressable_shards[0].data.shape == (cfg.hidden_size // 2, 2,
                                                       cfg.intermediate_size // 2)
  ref, _ = load_hf(TINY)
  tokens = jnp.arange(64, dtype=jnp.int32).reshape(4, 16)
  logits, _ = _forward_and_loss(model, tokens, mesh)
  np.testing.assert_allclose(np.asarray(logits), np.asarray(ref(tokens)), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_generation_on_mesh_matches_one_device():
  model, _ = load_hf(TINY)
  mesh = sharding.make_mesh(4, 1, 2)
  model8, _ = load_hf(TINY, mesh=mesh)
  prompts = [[1, 2, 3], [7, 8, 9, 10, 11], [5]]
  a = generate(model, prompts, max_new_tokens=8, temperature=0.0)
  b = generate(model8, prompts, max_new_tokens=8, temperature=0.0, mesh=mesh)
  np.testing.assert_array_equal(a.tokens, b.tokens)


def test_indivisible_dimension_is_replicated_with_a_warning():
  mesh = sharding.make_mesh(1, 1, 4)
  with pytest.warns(UserWarning, match=r"kv_heads=2\) is not divisible"):
    spec = sharding.logical_to_spec(("embed", "kv_heads", "head_dim"), (64, 2, 16), mesh=mesh,
                                    what="k")
  assert spec == P(None, None, None)


def test_mesh_errors():
  with pytest.raises(ValueError, match="only 8 devices"):
    sharding.make_mesh(4, 4, 1)
  assert sharding.make_mesh(-1, 1, 2).shape == {"data": 4, "fsdp": 1, "expert": 1, "context": 1,
                                                 "tensor": 2}
  with pytest.raises(KeyError, match="no sharding rule"):
    sharding.logical_to_spec(("embed", "nonsense"))
