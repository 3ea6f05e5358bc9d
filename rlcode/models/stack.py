"""The decoder's layer stack: scanned or looped, each block rematerialised or not.

Scanned layers (`ModelConfig.scan_layers`): the blocks' parameters are stacked on a
leading `layers` axis, so the training forward and backward, the reward model and the
prefill trace one block and `jax.lax.scan` it; compile time and program size stop
growing with depth. Layers of several kinds (sliding among dense, NSA among dense) scan
by their period: with kinds repeating every p layers, `layers` holds p stacks (stack j
holds layers j, j + p, j + 2p, ...) and one scan step runs p blocks, one of each kind. A
pattern that does not repeat within the depth has period L: nothing is scanned, which is
the looped model.

Decoding with a KV cache runs the blocks one by one on slices of the stacks: each layer's
cache is updated in place, which a scan over stacked caches would copy every token (the
sampler takes `Decoder.looped()` for the same reason, once per weight refresh).

Rematerialisation (`ModelConfig.remat`) wraps each block in `jax.checkpoint` under a
policy; it changes what the backward pass recomputes, never a value, and costs nothing
where nothing is differentiated (sampling):
  none     keep every activation the backward pass needs;
  full     keep nothing but each block's input (its output is the next one's input):
           the backward pass recomputes the block's forward;
  dots     keep the outputs of the matmuls without batch dimensions (the projections
           and the MLP, as 2-D matmuls), recompute attention and the elementwise parts;
  offload  as dots, with the kept outputs in pinned host memory (the backend must have
           a pinned_host memory kind: GPU, TPU and CPU do).
"""

from __future__ import annotations

import collections.abc

import jax
import jax.numpy as jnp
from flax import nnx

from rlcode.models import lora as lora_lib
from rlcode.models import moe as moe_lib
from rlcode.models.blocks import Block

REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "offload": jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host"),
}


def period(kinds: tuple) -> int:
  """The smallest p dividing len(kinds) with kinds[i] == kinds[i % p]."""
  n = len(kinds)
  return next(p for p in range(1, n + 1)
              if n % p == 0 and all(kinds[i] == kinds[i % p] for i in range(n)))


def make_stacks(cfg, rngs: nnx.Rngs, adapter_rngs: nnx.Rngs | None = None) -> list[Block]:
  """The period's stacks of blocks, initialised exactly as the looped model's layers (the
  same draws in the same order), each parameter with a leading `layers` axis."""
  kinds = cfg.block_kinds
  p = period(kinds)
  blocks = [Block(cfg, kind, rngs=rngs, adapter_rngs=adapter_rngs, moe=moe)
            for kind, moe in kinds]
  stacks = []
  for j in range(p):
    members = blocks[j::p]
    graphdef, first = nnx.split(members[0])
    states = [first] + [nnx.state(b) for b in members[1:]]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
    stack = nnx.merge(graphdef, stacked)
    for _, var in nnx.iter_graph(stack):
      if isinstance(var, nnx.Variable):
        var.set_metadata(axes=("layers", *var.get_metadata()["axes"]))
    stacks.append(stack)
  return stacks


def layer_slice(stack: Block, m: int) -> Block:
  """Layer m of a stack, as a plain block (its parameters sliced)."""
  graphdef, state = nnx.split(stack)
  return nnx.merge(graphdef, jax.tree.map(lambda a: a[m], state))


def _apply(graphdef, state, x, rope, segment_ids, cache_kv, cache_lengths, prefix_kv,
           experts=None):
  block = nnx.merge(graphdef, state)
  return block(x, rope, segment_ids=segment_ids, cache_kv=cache_kv,
               cache_lengths=cache_lengths, prefix_kv=prefix_kv, experts=experts)


def block_call(cfg, block: Block, x, rope, *, segment_ids=None, cache_kv=None,
               cache_lengths=None, prefix_kv=None, experts=None):
  """One block, rematerialised under cfg.remat when nothing is cached (a forward to be
  differentiated); returns (x, kv, aux) as Block does. experts [B, T, k]: an MoE
  layer's replayed choice (rlcode.models.moe.route)."""
  policy = REMAT_POLICIES[cfg.remat]
  if policy is None or cache_kv is not None:
    return block(x, rope, segment_ids=segment_ids, cache_kv=cache_kv,
                 cache_lengths=cache_lengths, prefix_kv=prefix_kv, experts=experts)
  graphdef, state = nnx.split(block)
  # The prefix's layout flag is static: it goes by closure, the arrays as arguments.
  head_major = None if prefix_kv is None else prefix_kv[3]
  arrays = None if prefix_kv is None else prefix_kv[:3]

  def apply(state, x, rope, segment_ids, arrays, experts):
    prefix = None if arrays is None else (*arrays, head_major)
    return _apply(graphdef, state, x, rope, segment_ids, None, None, prefix, experts)
  return jax.checkpoint(apply, policy=policy)(state, x, rope, segment_ids, arrays, experts)


def scan_stacks(cfg, stacks: list[Block], x, rope, *, segment_ids=None, prefix=None,
                experts=None):
  """The forward without a cache through scanned stacks: (x, per-layer kvs, per-layer
  router statistics).

  `prefix` is a Prefix (per-layer tuples): each scan step reads its layers' parts,
  stacked once outside the scan. The kvs come back as a per-layer sequence (LayerKVs),
  as the looped forward returns them. `experts` [B, T, moe layers, k]: the MoE layers
  replay them (rlcode.models.moe.layer_replay), each step reading its layers' parts.
  """
  p, n = len(stacks), cfg.num_layers // len(stacks)
  split = [nnx.split(stack) for stack in stacks]
  prefix_xs = None
  if prefix is not None:
    prefix_xs = [(jnp.stack(prefix.k[j::p]), jnp.stack(prefix.v[j::p])) for j in range(p)]
  experts_xs = None
  if experts is not None:
    # Stack j's layers are all MoE or all dense (the period counts the MLP's kind).
    replay = [moe_lib.layer_replay(cfg, experts, i) for i in range(cfg.num_layers)]
    experts_xs = [None if replay[j] is None else jnp.stack(replay[j::p]) for j in range(p)]

  def body(x, xs):
    states, prefix_m, experts_m, m = xs
    kvs, auxes = [], []
    for j, (graphdef, _) in enumerate(split):
      prefix_kv = (None if prefix_m is None else
                   (*prefix_m[j], prefix.lengths, prefix.head_major))
      with lora_lib.in_layer(m * p + j):
        x, kv, aux = block_call(cfg, nnx.merge(graphdef, states[j]), x, rope,
                                segment_ids=segment_ids, prefix_kv=prefix_kv,
                                experts=None if experts_m is None else experts_m[j])
      kvs.append(kv)
      auxes.append(aux)
    return x, (kvs, auxes)

  xs = ([state for _, state in split], prefix_xs, experts_xs,
        jnp.arange(n, dtype=jnp.int32))
  x, (kvs, auxes) = jax.lax.scan(body, x, xs)
  # Each stack's statistics [n, ...] back to one per layer, in layer order.
  per_layer = [jax.tree.map(lambda a, m=i // p: a[m], auxes[i % p])
               for i in range(cfg.num_layers)]
  return x, LayerKVs(kvs, cfg.num_layers), per_layer


class LayerKVs(collections.abc.Sequence):
  """A scan's stacked keys and values as a per-layer sequence: layer i's are sliced out
  when read, so a caller that drops them (training) adds nothing per layer."""

  def __init__(self, stacked: list, num_layers: int):
    self._stacked, self._n = stacked, num_layers

  def __len__(self) -> int:
    return self._n

  def __getitem__(self, i):
    if isinstance(i, slice):
      return [self[j] for j in range(*i.indices(self._n))]
    if not -self._n <= i < self._n:
      raise IndexError(i)
    i %= self._n
    p = len(self._stacked)
    return jax.tree.map(lambda a: a[i // p], self._stacked[i % p])


def looped_state(cfg, stacks_state) -> dict:
  """{layer index: that layer's state} of a scanned model's `layers` state."""
  p = len(stacks_state)
  return {i: jax.tree.map(lambda a, m=i // p: a[m], stacks_state[i % p])
          for i in range(cfg.num_layers)}
