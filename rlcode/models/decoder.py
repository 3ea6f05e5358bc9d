"""The decoder in Flax NNX: Qwen2/3 (and their MoE), Llama, Mistral, Gemma 3, OLMo 2, Phi-3.

RMSNorm, RoPE, grouped-query attention with optional q/k/v biases and q/k norms, a gated
MLP or a mixture of experts, tied or untied embeddings, separate parameter and compute
dtypes (the blocks: rlcode.models.blocks; the families' switches: rlcode.models.config). Attention goes through `kernels.attention`, so the model never
builds a mask itself. The layers are looped or scanned, and rematerialised or not
(rlcode.models.stack); the projections may carry LoRA adapters (rlcode.models.lora).

The model is functional about its KV cache: `hidden` takes and returns a
`KVCache` pytree instead of mutating state, so one jitted decode loop can carry
it. This module must not know about sampling, losses or checkpoints on disk.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from rlcode.models import lora as lora_lib
from rlcode.models import stack as stack_lib
from rlcode.models import moe as moe_lib
from rlcode.models.blocks import (DECODE_QUERIES, NONCAUSAL, Block, Packed, RMSNorm, _param,
                                  dense, rope_frequencies, rope_tables)
from rlcode.models.config import ModelConfig
from rlcode.models.nsa import NSACache
from rlcode.models.paged import PagedCache
from rlcode.parallel import sharding

__all__ = ["DECODE_QUERIES", "NONCAUSAL", "Decoder", "KVCache", "Prefix", "dense",
           "document_positions", "rope_frequencies"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
  """Per-layer key/value caches and the number of valid positions per row.

  k[i], v[i]: [B, K, S, D] for layer i, head-major (each head's keys are
  contiguous, the layout decode attention reads without a transpose);
  positions >= lengths[b] are free. An NSA layer keeps its own state instead:
  k[i] is its `NSACache` and v[i] is None.
  """

  k: tuple[jax.Array | NSACache, ...]
  v: tuple[jax.Array | None, ...]
  lengths: jax.Array

  @classmethod
  def zeros(cls, cfg: ModelConfig, batch: int, size: int, dtype=None) -> KVCache:
    shape = (batch, cfg.num_kv_heads, size, cfg.head_dim)
    dtype = dtype or cfg.jnp_dtype
    ks, vs = [], []
    for kind in cfg.layer_kinds:
      if kind == "nsa":
        ks.append(NSACache.zeros(cfg.nsa, batch, cfg.num_kv_heads, cfg.head_dim, size, dtype))
        vs.append(None)
      else:
        ks.append(jnp.zeros(shape, dtype))
        vs.append(jnp.zeros(shape, dtype))
    return cls(k=tuple(ks), v=tuple(vs), lengths=jnp.zeros((batch,), jnp.int32))

  @classmethod
  def from_prefill(cls, kvs, lengths, size: int) -> KVCache:
    """A cache of `size` positions holding a prefill's per-layer (k, v) [B, T, K, D]
    (an NSA layer's (NSACache, None))."""
    def place(x_btkd):
      if isinstance(x_btkd, NSACache):
        return x_btkd.padded(size)
      if x_btkd is None:
        return None
      x = x_btkd.swapaxes(1, 2)
      return jnp.pad(x, ((0, 0), (0, 0), (0, size - x.shape[2]), (0, 0)))
    return cls(k=tuple(place(k) for k, _ in kvs), v=tuple(place(v) for _, v in kvs),
               lengths=lengths)

  @property
  def size(self) -> int:
    first = self.k[0]
    return first.size if isinstance(first, NSACache) else first.shape[2]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Prefix:
  """Keys/values of prefixes that groups of rows share (a GRPO group's prompt,
  a set of cached documents).

  k[i], v[i]: [P, S, K, D] for layer i ([P, K, S, D] when head_major, the
  layout decoding reads without a transpose); lengths [P] valid positions.
  With N rows of tokens, row r continues prefix r // (N // P): each of P
  prefixes is shared by G = N / P consecutive rows, and is stored (and read)
  once.
  """

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  lengths: jax.Array
  head_major: bool = dataclasses.field(default=False, metadata=dict(static=True))
  # The arrays live in host memory; each layer's part is brought to the device
  # while the layer before it computes (see Decoder.hidden).
  on_host: bool = dataclasses.field(default=False, metadata=dict(static=True))

  @property
  def num(self) -> int:
    return self.lengths.shape[0]


class Decoder(nnx.Module):
  """The policy. `model(tokens_bt)` returns float32 logits [B, T, V].

  `layers` holds one block per layer, or with cfg.scan_layers the period's stacks of
  blocks (rlcode.models.stack); either way `hidden` computes the same thing.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    pd = cfg.jnp_base_dtype
    adapters = lora_lib.adapter_rngs(rngs) if cfg.lora is not None else None
    self.embed = _param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), pd)
    if cfg.scan_layers:
      self.layers = nnx.List(stack_lib.make_stacks(cfg, rngs, adapters))
    else:
      self.layers = nnx.List([Block(cfg, kind, rngs=rngs, adapter_rngs=adapters, moe=moe)
                              for kind, moe in cfg.block_kinds])
    self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg)
    if not cfg.tie_embeddings:
      self.lm_head = _param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), pd)

  def _check_tokens(self, tokens_bt, positions_bt):
    if tokens_bt.ndim != 2:
      raise ValueError(f"tokens must be [B, T] int32, got shape {tokens_bt.shape}")
    if not jnp.issubdtype(tokens_bt.dtype, jnp.integer):
      raise ValueError(f"tokens must be integers, got {tokens_bt.dtype}")
    if positions_bt is not None and positions_bt.shape != tokens_bt.shape:
      raise ValueError(f"positions {positions_bt.shape} must match tokens {tokens_bt.shape}")

  def blocks(self) -> list[Block]:
    """One block per layer (slices of the stacks when scanned)."""
    if not self.cfg.scan_layers:
      return list(self.layers)
    p = len(self.layers)
    return [stack_lib.layer_slice(self.layers[i % p], i // p) for i in range(self.cfg.num_layers)]

  def hidden(self, tokens_bt, positions_bt=None, *, cache: KVCache | PagedCache | None = None,
             prefix: Prefix | None = None, segment_ids=None, experts=None):
    """Final hidden states [B, T, E] and the keys/values.

    Without a cache: causal self-attention over the tokens; returns the
    per-layer (k, v) of the tokens, [B, T, K, D] each (what a prefill stores).
    With a cache: the tokens continue each row at cache.lengths; returns the
    updated cache. A PagedCache (rlcode.models.paged) is written and read through its
    page table; its rows advance by their valid tokens.
    With a prefix: every row also attends to its group's prefix, which comes
    before the row (and before its cache); positions then start after it.
    With segment_ids [B, T] (packed documents, non-decreasing, the last one
    the query): document layers attend within documents and from the query
    to everything; positions restart per document or continue
    (cfg.document_positions). With segment_ids a blocks.Packed (sequences packed
    into rows, rlcode.rl.packing): every layer attends within a token's own
    sequence, at the positions given; a prefix is then seen by every sequence of its rows.
    With experts [B, T, moe layers, top_k] int32: routing replay, each MoE layer uses
    the experts recorded for each token (rlcode.models.moe.route; a token with an id
    of -1 is routed). Each MoE layer's choice comes back through moe.collect_experts.
    """
    self._check_tokens(tokens_bt, positions_bt)
    b, t = tokens_bt.shape
    if prefix is not None and b % prefix.num:
      raise ValueError(f"{b} rows do not split into groups over {prefix.num} prefixes")
    packed = isinstance(segment_ids, Packed)
    if segment_ids is not None and (cache is not None or (prefix is not None and not packed)):
      raise ValueError("segment_ids are for full packed sequences, not with a cache or "
                       "(except Packed ones) a prefix")
    if positions_bt is None:
      if packed:
        raise ValueError("Packed segments need their positions (positions_bt)")
      start = jnp.zeros((b,), jnp.int32) if cache is None else cache.lengths
      if prefix is not None:
        start = start + jnp.repeat(prefix.lengths, b // prefix.num)
      positions_bt = start[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
      if segment_ids is not None and self.cfg.document_positions == "restart":
        positions_bt = document_positions(segment_ids)
    x = jnp.take(self.embed[...], tokens_bt, axis=0).astype(self.cfg.jnp_dtype)
    if self.cfg.scale_embeddings:  # Gemma: sqrt(E), rounded to the compute dtype
      x = x * jnp.asarray(self.cfg.hidden_size ** 0.5, x.dtype)
    x = sharding.constrain(x, ("batch", "length", "embed"))
    rope = rope_tables(self.cfg, positions_bt)
    if self.cfg.scan_layers and cache is None and not (prefix is not None and prefix.on_host):
      x, kvs, auxes = stack_lib.scan_stacks(self.cfg, list(self.layers), x, rope,
                                            segment_ids=segment_ids, prefix=prefix,
                                            experts=experts)
      moe_lib.record(self.cfg, auxes)
      return self.final_norm(x), kvs
    kvs, auxes = [], []
    layers = self.blocks()
    upcoming = None if prefix is None else self._prefix_layer(prefix, 0)
    for i, layer in enumerate(layers):
      if cache is None:
        cache_kv = None
      elif isinstance(cache, PagedCache):
        cache_kv = cache.layer(i)
      else:
        cache_kv = (cache.k[i], cache.v[i])
      prefix_kv = upcoming
      if prefix is not None and i + 1 < len(layers):
        # Issued before layer i runs, so a host prefix's next layer is in flight
        # while this one computes.
        upcoming = self._prefix_layer(prefix, i + 1)
      with lora_lib.in_layer(i):
        x, kv, aux = stack_lib.block_call(
            self.cfg, layer, x, rope, segment_ids=segment_ids, cache_kv=cache_kv,
            prefix_kv=prefix_kv, cache_lengths=None if cache is None else cache.lengths,
            experts=moe_lib.layer_replay(self.cfg, experts, i))
      kvs.append(kv)
      auxes.append(aux)
    moe_lib.record(self.cfg, auxes)
    h = self.final_norm(x)
    if cache is None:
      return h, kvs
    if isinstance(cache, PagedCache):
      return h, cache.with_layers(kvs)
    return h, KVCache(k=tuple(k for k, _ in kvs), v=tuple(v for _, v in kvs),
                      lengths=cache.lengths + t)

  @staticmethod
  def _prefix_layer(prefix: Prefix, i: int):
    k, v = prefix.k[i], prefix.v[i]
    if prefix.on_host:
      k, v = jax.device_put(k, jax.memory.Space.Device), jax.device_put(v, jax.memory.Space.Device)
    return k, v, prefix.lengths, prefix.head_major

  def output_weight(self) -> jax.Array:
    """[E, V]: the output projection (the embedding table transposed when tied)."""
    return self.embed[...].T if self.cfg.tie_embeddings else self.lm_head[...]

  def logits(self, h_btd) -> jax.Array:
    logits = dense(h_btd, self.output_weight().astype(self.cfg.jnp_dtype))
    return sharding.constrain(logits.astype(jnp.float32), ("batch", "length", "vocab"))

  def __call__(self, tokens_bt, positions_bt=None, segment_ids=None, experts=None) -> jax.Array:
    h, _ = self.hidden(tokens_bt, positions_bt, segment_ids=segment_ids, experts=experts)
    return self.logits(h)

  def looped(self) -> Decoder:
    """This model with one block per layer (itself when not scanned). The parameters are
    sliced out of the stacks (a copy; inside jit, once per call)."""
    if not self.cfg.scan_layers:
      return self
    graphdef, state = nnx.split(self)
    plain = _looped_graphdef(self.cfg)
    flat = dict(nnx.to_flat_state(state))
    values = []
    p = len(self.layers)
    for path, var in flat.items():
      if path[0] != "layers":
        values.append((path, var))
        continue
      j, rest = path[1], path[2:]
      axes = var.get_metadata()["axes"][1:]
      for m in range(self.cfg.num_layers // p):
        values.append((("layers", m * p + j, *rest),
                       var.replace(var.get_value()[m], axes=axes)))
    return nnx.merge(plain, nnx.from_flat_state(values))

  def merged(self) -> Decoder:
    """This model, looped, with its LoRA adapters folded into the base weights (a model
    without adapters: for a merged export, and what samplers decode with)."""
    model = self.looped()
    if self.cfg.lora is None:
      return model
    graphdef, state = nnx.split(model)
    model = nnx.merge(graphdef, jax.tree.map(lambda a: a, state))  # not the caller's arrays
    for block in model.layers:
      block.merge_lora()
    return _with_cfg(model, self.cfg.replace(
        lora=None, scan_layers=False,
        param_dtype=self.cfg.lora.base_dtype or self.cfg.param_dtype))

  def for_sampling(self) -> Decoder:
    """What a sampler decodes with: looped (each layer's KV cache updated in place, where
    a scan over stacked caches would copy it every token), LoRA adapters folded in (one
    matmul per projection instead of three a token; experiments/speed/fit_costs.py measures
    the two), no rematerialisation (nothing there is differentiated)."""
    model = self.merged()
    if model.cfg.remat != "none":
      model = _with_cfg(nnx.merge(*nnx.split(model)), model.cfg.replace(remat="none"))
    return model


def _with_cfg(model: Decoder, cfg: ModelConfig) -> Decoder:
  """`model` (a fresh module object) with `cfg` on it and on every block that holds one."""
  for _, node in nnx.iter_graph(model):
    if isinstance(node, nnx.Module) and isinstance(getattr(node, "cfg", None), ModelConfig):
      node.cfg = cfg
  return model


_GRAPHDEFS: dict = {}


def _looped_graphdef(cfg: ModelConfig):
  """The graph of the looped model of `cfg` (abstract: nothing allocated), cached."""
  plain = cfg.replace(scan_layers=False)
  if plain not in _GRAPHDEFS:
    _GRAPHDEFS[plain] = nnx.split(nnx.eval_shape(lambda: Decoder(plain, rngs=nnx.Rngs(0))))[0]
  return _GRAPHDEFS[plain]


def document_positions(segment_ids_bt: jax.Array) -> jax.Array:
  """Positions counted from 0 at the start of each (contiguous) segment."""
  t = segment_ids_bt.shape[1]
  idx = jnp.arange(t, dtype=jnp.int32)[None, :]
  starts = jnp.concatenate([jnp.ones_like(segment_ids_bt[:, :1], bool),
                            segment_ids_bt[:, 1:] != segment_ids_bt[:, :-1]], axis=1)
  return idx - jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)
