"""Native Sparse Attention as a model layer (DeepSeek, arXiv 2502.11089).

`NSAAttention` owns its parameters: the query projection; independent keys and
values for each branch (one fused projection split three ways: compressed,
selected, sliding); the compression MLPs phi_k, phi_v (an MLP over a flattened
block of l keys plus a learnable intra-block position embedding -> one
compressed key / value); the sigmoid gates (a linear map of the input to three
gates per head); the output projection. The attention itself is
`kernels.nsa.nsa_attention`, so this file never builds a mask.

Every parameter names its logical axes in `axes` metadata, which is how the
project shards parameters. `__call__` runs a full sequence (training, prefill)
and also returns the layer's cache; `decode` takes one token per row against
that cache (`NSACache`: the three branches' keys and values, and the
compressed tokens, each compressed once, when its block of l keys completes).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from rlcode.kernels import nsa as nsa_kernels
from rlcode.kernels.spec import NSAConfig
from rlcode.models import rope as rope_lib

_INIT_STD = 0.02


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class NSACache:
  """One NSA layer's decoding state, head-major.

  kv: [B, K, 3, 2, S, D], per branch (compressed, selected, sliding) its keys
    and values at every position (selected and sliding keys rotated; the
    compressed branch's raw keys, from which later compressed tokens are made).
  cmp: [B, K, 2, NC, D], compressed keys and values; token c covers positions
    [c*d, c*d + l) and is valid once the cache holds its last position.
  S is a multiple of block_sel and NC = cfg.num_compressed(S).
  """

  kv: jax.Array
  cmp: jax.Array
  cfg: NSAConfig = dataclasses.field(metadata=dict(static=True))

  @staticmethod
  def capacity(cfg: NSAConfig, size: int) -> int:
    """Cache positions for `size` tokens: rounded up to whole selection blocks."""
    return cfg.num_blocks(size) * cfg.block_sel

  @classmethod
  def zeros(cls, cfg: NSAConfig, batch: int, num_kv_heads: int, head_dim: int, size: int,
            dtype) -> NSACache:
    s = cls.capacity(cfg, size)
    return cls(kv=jnp.zeros((batch, num_kv_heads, 3, 2, s, head_dim), dtype),
               cmp=jnp.zeros((batch, num_kv_heads, 2, cfg.num_compressed(s), head_dim), dtype),
               cfg=cfg)

  def padded(self, size: int) -> NSACache:
    """This (prefill) cache with room for `size` tokens."""
    s = self.capacity(self.cfg, size)
    nc = self.cfg.num_compressed(s)
    pad = lambda x, axis, n: jnp.pad(x, [(0, n - x.shape[axis]) if a == axis else (0, 0)
                                         for a in range(x.ndim)])
    return NSACache(kv=pad(self.kv, 4, s), cmp=pad(self.cmp, 3, nc), cfg=self.cfg)

  def repeat(self, n: int) -> NSACache:
    """Each row n times (a prompt's cache for each of its n samples)."""
    return NSACache(kv=jnp.repeat(self.kv, n, axis=0), cmp=jnp.repeat(self.cmp, n, axis=0),
                    cfg=self.cfg)

  @property
  def size(self) -> int:
    return self.kv.shape[4]


def _param(rngs: nnx.Rngs, shape, axes, dtype, std=_INIT_STD) -> nnx.Param:
  return nnx.Param(std * jax.random.normal(rngs.params(), shape, dtype), axes=axes)


def _zeros(shape, axes, dtype) -> nnx.Param:
  return nnx.Param(jnp.zeros(shape, dtype), axes=axes)


class NSAAttention(nnx.Module):
  """Grouped-query NSA self-attention with RoPE on q and the selected/sliding keys.

  Compressed keys carry no RoPE: their position information is the learned
  intra-block embedding of the compression MLP.
  """

  def __init__(self, *, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
               nsa: NSAConfig, qkv_bias: bool, param_dtype, dtype,
               impl: str, rngs: nnx.Rngs):
    if num_kv_heads < 1 or num_heads % num_kv_heads:
      raise ValueError(f"NSAAttention: num_heads={num_heads} must be a multiple of "
                       f"num_kv_heads={num_kv_heads}")
    if head_dim % 2:
      raise ValueError(f"NSAAttention: head_dim={head_dim} must be even (RoPE)")
    if not isinstance(nsa, NSAConfig):
      raise TypeError(f"NSAAttention: nsa must be an NSAConfig, got {type(nsa).__name__}")
    e, h, k, d = hidden_size, num_heads, num_kv_heads, head_dim
    l, m = nsa.block_cmp, nsa.compress_hidden
    pd = param_dtype
    self.cfg, self.impl, self.dtype = nsa, impl, dtype
    self.qkv_bias = qkv_bias
    self.q = _param(rngs, (e, h, d), ("embed", "heads", "head_dim"), pd)
    # [E, branch (compressed, selected, sliding), k|v, K, D]
    self.kv = _param(rngs, (e, 3, 2, k, d), ("embed", None, None, "kv_heads", "head_dim"), pd)
    if qkv_bias:
      self.q_bias = _zeros((h, d), ("heads", "head_dim"), pd)
      self.kv_bias = _zeros((3, 2, k, d), (None, None, "kv_heads", "head_dim"), pd)
    # Compression MLPs, index 0 for keys and 1 for values, shared by the KV heads.
    self.cmp_pos = _param(rngs, (2, l, d), (None, None, "head_dim"), pd)
    self.cmp_w1 = _param(rngs, (2, l, d, m), (None, None, "head_dim", "mlp"), pd,
                         std=(l * d) ** -0.5)
    self.cmp_b1 = _zeros((2, m), (None, "mlp"), pd)
    self.cmp_w2 = _param(rngs, (2, m, d), (None, "mlp", "head_dim"), pd, std=m ** -0.5)
    self.cmp_b2 = _zeros((2, d), (None, "head_dim"), pd)
    self.gate = _param(rngs, (e, h, 3), ("embed", "heads", None), pd)
    self.gate_bias = _zeros((h, 3), ("heads", None), pd)
    self.o = _param(rngs, (h, d, e), ("heads", "head_dim", "embed"), pd)

  def _compress(self, x_btkd: jax.Array, which: int) -> jax.Array:
    """phi: [B, T, K, D] -> [B, nc, K, D], one vector per block of l keys (stride d)."""
    dt = self.dtype
    blocks = nsa_kernels.compression_windows(x_btkd, self.cfg)  # [B, nc, l, K, D]
    blocks = blocks + self.cmp_pos[which].astype(dt)[None, None, :, None, :]
    hidden = jnp.einsum("bclkd,ldm->bckm", blocks, self.cmp_w1[which].astype(dt))
    hidden = jax.nn.gelu(hidden + self.cmp_b1[which].astype(dt))
    out = jnp.einsum("bckm,md->bckd", hidden, self.cmp_w2[which].astype(dt))
    return out + self.cmp_b2[which].astype(dt)

  def _project(self, x_btd: jax.Array, rope):
    """Rotated queries [B, T, H, D]; the branches' keys and values [B, T, 3, 2, K, D]
    (selected and sliding keys rotated); the gates [B, T, H, 3].

    rope: the decoder's (cos, sin) table [B, T, 1, D] (rlcode.models.rope.table),
    computed once per forward and shared by every layer.
    """
    if x_btd.ndim != 3 or rope[0].shape[:2] != x_btd.shape[:2]:
      raise ValueError(f"NSAAttention: x must be [B, T, E] and the RoPE table [B, T, 1, D]; "
                       f"got x{x_btd.shape} table{rope[0].shape}")
    dt = self.dtype
    x = x_btd.astype(dt)
    q = jnp.einsum("bte,ehd->bthd", x, self.q[...].astype(dt))
    kv = jnp.einsum("bte,ecjkd->btcjkd", x, self.kv[...].astype(dt))
    if self.qkv_bias:
      q = q + self.q_bias[...].astype(dt)
      kv = kv + self.kv_bias[...].astype(dt)
    q = rope_lib.apply(q, rope)
    kv = kv.at[:, :, 1, 0].set(rope_lib.apply(kv[:, :, 1, 0], rope))
    kv = kv.at[:, :, 2, 0].set(rope_lib.apply(kv[:, :, 2, 0], rope))
    gates = jax.nn.sigmoid(jnp.einsum("bte,ehc->bthc", x, self.gate[...].astype(dt))
                           + self.gate_bias[...].astype(dt))
    return q, kv, gates

  def _output(self, out_bthd: jax.Array) -> jax.Array:
    return jnp.einsum("bthd,hde->bte", out_bthd, self.o[...].astype(self.dtype))

  def __call__(self, x_btd: jax.Array, rope):
    """x [B, T, E] and its RoPE table -> ([B, T, E], NSACache of the T tokens)."""
    q, kv, gates = self._project(x_btd, rope)
    k_cmp = self._compress(kv[:, :, 0, 0], 0)
    v_cmp = self._compress(kv[:, :, 0, 1], 1)
    out = nsa_kernels.nsa_attention(q, (k_cmp, v_cmp), (kv[:, :, 1, 0], kv[:, :, 1, 1]),
                                    (kv[:, :, 2, 0], kv[:, :, 2, 1]), gates, self.cfg,
                                    impl=self.impl)
    cache = NSACache(kv=kv.transpose(0, 4, 2, 3, 1, 5),
                     cmp=jnp.stack([k_cmp, v_cmp], axis=2).transpose(0, 3, 2, 1, 4),
                     cfg=self.cfg)
    return self._output(out), cache

  def decode(self, x_btd: jax.Array, rope, cache: NSACache,
             lengths_b: jax.Array):
    """One new token per row: x [B, 1, E] continues each row at lengths_b.

    Writes the token's keys and values into the cache, compresses the block
    that the token completes (if it completes one), and attends as the full
    forward would at that position. Returns ([B, 1, E], the updated cache).
    """
    if x_btd.shape[1] != 1:
      raise NotImplementedError(f"NSAAttention.decode: one token per row per call, got "
                                f"{x_btd.shape[1]}")
    cfg = self.cfg
    q, kv, gates = self._project(x_btd, rope)
    write = jax.vmap(lambda c, u, i: jax.lax.dynamic_update_slice(c, u, (0, 0, 0, i, 0)))
    kv_cache = write(cache.kv, kv.transpose(0, 4, 2, 3, 1, 5).astype(cache.kv.dtype),
                     lengths_b)
    held = lengths_b + 1  # tokens in the cache, the new one included
    cmp = cache.cmp
    nc = cmp.shape[3]
    if nc:
      # Token c = (held - l) / d is complete exactly when held - l is a multiple of d.
      l, d = cfg.block_cmp, cfg.stride_cmp
      ready = (held >= l) & ((held - l) % d == 0)
      start = jnp.maximum(held - l, 0)
      window = jax.vmap(lambda c, s: jax.lax.dynamic_slice_in_dim(c, s, l, axis=2))(
          kv_cache[:, :, 0], start)  # [B, K, 2, l, D]
      window = window.transpose(0, 3, 1, 2, 4)  # [B, l, K, 2, D]
      new = jnp.stack([self._compress(window[..., 0, :], 0),
                       self._compress(window[..., 1, :], 1)], axis=2)  # [B, 1, 2, K, D]
      new = new.transpose(0, 3, 2, 1, 4).astype(cmp.dtype)  # [B, K, 2, 1, D]
      slot = jnp.clip((held - l) // d, 0, nc - 1)
      old = jax.vmap(lambda c, i: jax.lax.dynamic_slice_in_dim(c, i, 1, axis=2))(cmp, slot)
      new = jnp.where(ready[:, None, None, None, None], new, old)
      cmp = jax.vmap(lambda c, u, i: jax.lax.dynamic_update_slice(c, u, (0, 0, i, 0)))(
          cmp, new, slot)
      num_cmp = jnp.where(held >= l, (held - l) // d + 1, 0)
    else:
      num_cmp = jnp.zeros_like(held)
    out = nsa_kernels.nsa_decode(
        q, (cmp[:, :, 0], cmp[:, :, 1]), num_cmp, (kv_cache[:, :, 1, 0], kv_cache[:, :, 1, 1]),
        (kv_cache[:, :, 2, 0], kv_cache[:, :, 2, 1]), held, gates, cfg, impl=self.impl)
    return self._output(out), NSACache(kv=kv_cache, cmp=cmp, cfg=cfg)
