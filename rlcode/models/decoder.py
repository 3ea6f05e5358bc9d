"""A Qwen2/Llama-family decoder in Flax NNX.

RMSNorm, RoPE, grouped-query attention with optional q/k/v biases, SwiGLU,
tied or untied embeddings, separate parameter and compute dtypes. Attention
goes through `kernels.attention`, so the model never builds a mask itself.

Every parameter names its logical axes (`axes` metadata); rlcode.sharding maps
them to the mesh. Projection kernels keep heads as their own axis ([E, H, D]
rather than [E, H*D]) so that tensor parallelism splits whole heads.

The model is functional about its KV cache: `hidden` takes and returns a
`KVCache` pytree instead of mutating state, so one jitted decode loop can carry
it. This module must not know about sampling, losses or checkpoints on disk.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from rlcode import kernels
from rlcode.parallel import sharding
from rlcode.models import rope as rope_lib
from rlcode.models.config import ModelConfig
from rlcode.models.nsa import NSAAttention, NSACache

_INIT_STD = 0.02  # Hugging Face's initializer_range for Qwen2 and Llama


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


NONCAUSAL = kernels.AttentionSpec(causal=False)
# Up to this many queries per prefix, prefix attention runs as decoding.
DECODE_QUERIES = 64


def rope_frequencies(cfg: ModelConfig) -> jax.Array:
  return rope_lib.frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)


def dense(x: jax.Array, w: jax.Array, contract: int = 1) -> jax.Array:
  """Contracts the last `contract` dims of x with the first of w, as one 2-D matmul.

  XLA:CPU runs a [N, K] x [K, M] matmul 2-3x faster than the same contraction
  written as an einsum over [B, T, ...] operands, and on accelerators the
  reshapes are free.
  """
  k = math.prod(w.shape[:contract])
  lead, tail = x.shape[:x.ndim - contract], w.shape[contract:]
  y = x.reshape(-1, k) @ w.reshape(k, -1)
  return y.reshape(*lead, *tail)


def _param(rngs: nnx.Rngs, shape, axes, dtype, std=_INIT_STD) -> nnx.Param:
  return nnx.Param(std * jax.random.normal(rngs.params(), shape, dtype), axes=axes)


class RMSNorm(nnx.Module):

  def __init__(self, dim: int, eps: float, cfg: ModelConfig):
    self.eps = eps
    self.dtype = cfg.jnp_dtype
    self.scale = nnx.Param(jnp.ones((dim,), cfg.jnp_param_dtype), axes=(None,))

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return self.scale[...].astype(self.dtype) * y.astype(self.dtype)


class Attention(nnx.Module):
  """Grouped-query self-attention with RoPE.

  The q, k and v projections are one parameter `qkv` [E, K, G + 2, D], grouped
  by KV head: for KV head k, slots 0..G-1 are its G query heads (query head
  k * G + g, the Hugging Face order), slot G its key and slot G + 1 its value.
  One matmul computes all three, and tensor parallelism over kv_heads keeps
  each group's queries with their key and value.
  """

  def __init__(self, cfg: ModelConfig, spec: kernels.AttentionSpec, *, rngs: nnx.Rngs):
    e, h, k, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    g = h // k
    pd = cfg.jnp_param_dtype
    self.cfg, self.spec = cfg, spec
    self.qkv = _param(rngs, (e, k, g + 2, d), ("embed", "kv_heads", None, "head_dim"), pd)
    self.o = _param(rngs, (h, d, e), ("heads", "head_dim", "embed"), pd)
    if cfg.qkv_bias:
      self.qkv_bias = nnx.Param(jnp.zeros((k, g + 2, d), pd), axes=("kv_heads", None, "head_dim"))

  def project_qkv(self, x_btd, rope):
    cfg = self.cfg
    dt = cfg.jnp_dtype
    g = cfg.num_heads // cfg.num_kv_heads
    qkv = dense(x_btd, self.qkv[...].astype(dt))  # [B, T, K, G + 2, D]
    if cfg.qkv_bias:
      qkv = qkv + self.qkv_bias[...].astype(dt)
    b, t = x_btd.shape[:2]
    q = qkv[:, :, :, :g].reshape(b, t, cfg.num_heads, cfg.head_dim)
    q = sharding.constrain(rope_lib.apply(q, rope), ("batch", "length", "heads", "head_dim"))
    k = sharding.constrain(rope_lib.apply(qkv[:, :, :, g], rope),
                           ("batch", "length", "kv_heads", "head_dim"))
    v = sharding.constrain(qkv[:, :, :, g + 1], ("batch", "length", "kv_heads", "head_dim"))
    return q, k, v

  def output(self, attn_bthd):
    y = dense(attn_bthd, self.o[...].astype(self.cfg.jnp_dtype), contract=2)
    return sharding.constrain(y, ("batch", "length", "embed"))

  def __call__(self, x_btd, rope, *, cache_kv=None, cache_lengths=None, prefix_kv=None,
               segment_ids=None):
    """Self-attention over x, or (with a cache) over the cache plus x; with a
    prefix, also over the row's shared prefix. segment_ids [B, T] mark the
    packed documents of a document layer.

    Returns the output and the layer's keys/values: those of x alone
    [B, T, K, D] without a cache (the prefill's), the updated cache otherwise.
    The prefix (k, v, lengths) is read, never written.
    """
    q, k, v = self.project_qkv(x_btd, rope)
    impl = self.cfg.attn_impl
    if cache_kv is None:
      # A document layer given no segment ids sees one document: plain causal.
      spec = (kernels.DENSE_CAUSAL if self.spec.kind == "document" and segment_ids is None
              else self.spec)
      own = kernels.attention(q, k, v, spec, impl=impl, segment_ids=segment_ids,
                              return_lse=prefix_kv is not None)
      new_kv = (k, v)
    else:
      k_cache, v_cache = cache_kv
      write = jax.vmap(lambda c, x, i: jax.lax.dynamic_update_slice(c, x, (0, i, 0)))
      new_kv = (write(k_cache, k.swapaxes(1, 2).astype(k_cache.dtype), cache_lengths),
                write(v_cache, v.swapaxes(1, 2).astype(v_cache.dtype), cache_lengths))
      own = kernels.decode_attention(q, *new_kv, cache_lengths + q.shape[1], spec=self.spec,
                                     impl=impl, return_lse=prefix_kv is not None,
                                     kv_head_major=True)
    if prefix_kv is None:
      return self.output(own), new_kv
    own_start = jnp.zeros((q.shape[0],), jnp.int32) if cache_lengths is None else cache_lengths
    out, _ = kernels.merge(*zip(own, self._prefix_attention(q, own_start, *prefix_kv)))
    return self.output(out), new_kv

  def _prefix_attention(self, q_nthd, own_start_n, k_pre, v_pre, lengths_p, head_major):
    """Attention of each row's queries over its group's prefix (Hydragen).

    Dense layers: the G rows of a group are one block of G*T queries against
    the one stored copy of their prefix: every query sees the whole prefix (it
    precedes them all), so the block is non-causal and the prefix is never
    repeated. A block of a few queries (decoding) goes through the decode
    kernel. Sliding layers see only the prefix's last window-1 keys, which
    each row takes for itself (a window, not the prompt); own_start_n [N] is
    how many of the row's own tokens precede its first query (its cache).
    """
    n, t, h, d = q_nthd.shape
    p = lengths_p.shape[0]
    impl = self.cfg.attn_impl
    if self.spec.kind == "sliding":
      return self._prefix_window(q_nthd, own_start_n, k_pre, v_pre, lengths_p, head_major)
    if self.spec.kind not in ("dense", "document") or not self.spec.causal:
      raise NotImplementedError(f"a shared prefix is not implemented for {self.spec}")
    q = q_nthd.reshape(p, (n // p) * t, h, d)
    if head_major or (n // p) * t <= DECODE_QUERIES:
      out, lse = kernels.decode_attention(
          q, k_pre, v_pre, lengths_p, spec=NONCAUSAL, impl=impl, return_lse=True,
          q_offset=lengths_p, kv_head_major=head_major)
    else:
      out, lse = kernels.attention(q, k_pre, v_pre, NONCAUSAL, impl=impl,
                                   kv_lengths=lengths_p, return_lse=True)
    return out.reshape(n, t, h, d), lse.reshape(n, t, h)

  def _prefix_window(self, q_nthd, own_start_n, k_pre, v_pre, lengths_p, head_major):
    n, t, h, _ = q_nthd.shape
    p = lengths_p.shape[0]
    seq_axis = 2 if head_major else 1
    take = min(self.spec.window - 1, k_pre.shape[seq_axis])
    if take == 0:  # a window of one token never reaches back into the prefix
      return jnp.zeros_like(q_nthd), jnp.full((n, t, h), -jnp.inf, jnp.float32)
    start = jnp.maximum(lengths_p - take, 0)
    cut = jax.vmap(lambda x, s: jax.lax.dynamic_slice_in_dim(x, s, take, seq_axis - 1))
    k_tail, v_tail = cut(k_pre, start), cut(v_pre, start)
    if head_major:
      k_tail, v_tail = k_tail.swapaxes(1, 2), v_tail.swapaxes(1, 2)
    rows = lambda x: jnp.repeat(x, n // p, axis=0)
    # Row r's first query follows its prefix and its own earlier tokens.
    offset = rows(lengths_p - start) + own_start_n
    return kernels.attention(q_nthd, rows(k_tail), rows(v_tail), self.spec,
                             impl=self.cfg.attn_impl, q_offset=offset,
                             kv_lengths=rows(lengths_p - start), return_lse=True)


class MLP(nnx.Module):
  """SwiGLU: down(silu(gate(x)) * up(x)), gate and up as one parameter [E, 2, F]."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    e, f, pd = cfg.hidden_size, cfg.intermediate_size, cfg.jnp_param_dtype
    self.dtype = cfg.jnp_dtype
    self.gate_up = _param(rngs, (e, 2, f), ("embed", None, "mlp"), pd)
    self.down = _param(rngs, (f, e), ("mlp", "embed"), pd)

  def __call__(self, x_btd):
    dt = self.dtype
    gu = dense(x_btd, self.gate_up[...].astype(dt))
    h = sharding.constrain(jax.nn.silu(gu[..., 0, :]) * gu[..., 1, :], ("batch", "length", "mlp"))
    return sharding.constrain(dense(h, self.down[...].astype(dt)),
                              ("batch", "length", "embed"))


def attention_spec(cfg: ModelConfig, kind: str) -> kernels.AttentionSpec:
  if kind == "sliding":
    return kernels.AttentionSpec(kind="sliding", window=cfg.sliding_window)
  return kernels.AttentionSpec(kind=kind)


class Block(nnx.Module):
  """Pre-norm attention and SwiGLU with residuals; the attention is of the layer's kind."""

  def __init__(self, cfg: ModelConfig, kind: str, *, rngs: nnx.Rngs):
    self.kind = kind
    self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg)
    if kind == "nsa":
      self.attn = NSAAttention(
          hidden_size=cfg.hidden_size, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
          head_dim=cfg.head_dim, nsa=cfg.nsa, qkv_bias=cfg.qkv_bias,
          param_dtype=cfg.jnp_param_dtype, dtype=cfg.jnp_dtype, impl=cfg.attn_impl, rngs=rngs)
    else:
      self.attn = Attention(cfg, attention_spec(cfg, kind), rngs=rngs)
    self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, x, rope, *, segment_ids=None, cache_kv=None,
               cache_lengths=None, prefix_kv=None):
    h = self.attn_norm(x)
    if self.kind == "nsa":
      if prefix_kv is not None:
        raise NotImplementedError("NSA layers do not take a shared prefix (a prompt's "
                                  "compressed tokens and selection are per row); sample "
                                  "NSA models with share_prompt=False")
      if cache_kv is None:
        a, state = self.attn(h, rope)
      else:
        a, state = self.attn.decode(h, rope, cache_kv[0], cache_lengths)
      kv = (state, None)
    else:
      a, kv = self.attn(h, rope, cache_kv=cache_kv, cache_lengths=cache_lengths,
                        prefix_kv=prefix_kv,
                        segment_ids=segment_ids if self.kind == "document" else None)
    x = x + a
    return x + self.mlp(self.mlp_norm(x)), kv


class Decoder(nnx.Module):
  """The policy. `model(tokens_bt)` returns float32 logits [B, T, V]."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    pd = cfg.jnp_param_dtype
    self.embed = _param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), pd)
    self.layers = nnx.List([Block(cfg, kind, rngs=rngs) for kind in cfg.layer_kinds])
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

  def hidden(self, tokens_bt, positions_bt=None, *, cache: KVCache | None = None,
             prefix: Prefix | None = None, segment_ids=None):
    """Final hidden states [B, T, E] and the keys/values.

    Without a cache: causal self-attention over the tokens; returns the
    per-layer (k, v) of the tokens, [B, T, K, D] each (what a prefill stores).
    With a cache: the tokens continue each row at cache.lengths; returns the
    updated cache.
    With a prefix: every row also attends to its group's prefix, which comes
    before the row (and before its cache); positions then start after it.
    With segment_ids [B, T] (packed documents, non-decreasing, the last one
    the query): document layers attend within documents and from the query
    to everything; positions restart per document or continue
    (cfg.document_positions).
    """
    self._check_tokens(tokens_bt, positions_bt)
    b, t = tokens_bt.shape
    if prefix is not None and b % prefix.num:
      raise ValueError(f"{b} rows do not split into groups over {prefix.num} prefixes")
    if segment_ids is not None and (cache is not None or prefix is not None):
      raise ValueError("segment_ids are for full packed sequences, not with a cache or prefix")
    if positions_bt is None:
      start = jnp.zeros((b,), jnp.int32) if cache is None else cache.lengths
      if prefix is not None:
        start = start + jnp.repeat(prefix.lengths, b // prefix.num)
      positions_bt = start[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
      if segment_ids is not None and self.cfg.document_positions == "restart":
        positions_bt = document_positions(segment_ids)
    x = jnp.take(self.embed[...], tokens_bt, axis=0).astype(self.cfg.jnp_dtype)
    x = sharding.constrain(x, ("batch", "length", "embed"))
    rope = rope_lib.table(positions_bt, rope_frequencies(self.cfg))
    kvs = []
    upcoming = None if prefix is None else self._prefix_layer(prefix, 0)
    for i, layer in enumerate(self.layers):
      cache_kv = None if cache is None else (cache.k[i], cache.v[i])
      prefix_kv = upcoming
      if prefix is not None and i + 1 < len(self.layers):
        # Issued before layer i runs, so a host prefix's next layer is in flight
        # while this one computes.
        upcoming = self._prefix_layer(prefix, i + 1)
      x, kv = layer(x, rope, segment_ids=segment_ids, cache_kv=cache_kv,
                    prefix_kv=prefix_kv, cache_lengths=None if cache is None else cache.lengths)
      kvs.append(kv)
    h = self.final_norm(x)
    if cache is None:
      return h, kvs
    return h, KVCache(k=tuple(k for k, _ in kvs), v=tuple(v for _, v in kvs),
                      lengths=cache.lengths + t)

  @staticmethod
  def _prefix_layer(prefix: Prefix, i: int):
    k, v = prefix.k[i], prefix.v[i]
    if prefix.on_host:
      k, v = jax.device_put(k, jax.memory.Space.Device), jax.device_put(v, jax.memory.Space.Device)
    return k, v, prefix.lengths, prefix.head_major

  def logits(self, h_btd) -> jax.Array:
    dt = self.cfg.jnp_dtype
    w = self.embed[...].T if self.cfg.tie_embeddings else self.lm_head[...]
    logits = dense(h_btd, w.astype(dt))
    return sharding.constrain(logits.astype(jnp.float32), ("batch", "length", "vocab"))

  def __call__(self, tokens_bt, positions_bt=None, segment_ids=None) -> jax.Array:
    h, _ = self.hidden(tokens_bt, positions_bt, segment_ids=segment_ids)
    return self.logits(h)


def document_positions(segment_ids_bt: jax.Array) -> jax.Array:
  """Positions counted from 0 at the start of each (contiguous) segment."""
  t = segment_ids_bt.shape[1]
  idx = jnp.arange(t, dtype=jnp.int32)[None, :]
  starts = jnp.concatenate([jnp.ones_like(segment_ids_bt[:, :1], bool),
                            segment_ids_bt[:, 1:] != segment_ids_bt[:, :-1]], axis=1)
  return idx - jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)
