"""Native Sparse Attention as a model layer (DeepSeek, arXiv 2502.11089).

`NSAAttention` owns its parameters: the query projection; independent keys and
values for each branch (one fused projection split three ways: compressed,
selected, sliding); the compression MLPs phi_k, phi_v (an MLP over a flattened
block of l keys plus a learnable intra-block position embedding -> one
compressed key / value); the sigmoid gates (a linear map of the input to three
gates per head); the output projection. The attention itself is
`kernels.nsa.nsa_attention`, so this file never builds a mask.

Every parameter names its logical axes in `axes` metadata, which is how the
project shards parameters. Training-mode forward only (the full sequence);
there is no NSA decode path here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from kernels import nsa as nsa_kernels
from kernels.spec import NSAConfig
from rlcode.models import rope as rope_lib

_INIT_STD = 0.02


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
               nsa: NSAConfig, qkv_bias: bool, rope_theta: float, param_dtype, dtype,
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
    self.cfg, self.impl, self.dtype, self.rope_theta = nsa, impl, dtype, rope_theta
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

  def __call__(self, x_btd: jax.Array, positions_bt: jax.Array) -> jax.Array:
    """x [B, T, E], positions [B, T] (RoPE positions) -> [B, T, E]."""
    if x_btd.ndim != 3 or positions_bt.shape != x_btd.shape[:2]:
      raise ValueError(f"NSAAttention: x must be [B, T, E] and positions [B, T]; got "
                       f"x{x_btd.shape} positions{positions_bt.shape}")
    dt = self.dtype
    x = x_btd.astype(dt)
    q = jnp.einsum("bte,ehd->bthd", x, self.q[...].astype(dt))
    kv = jnp.einsum("bte,ecjkd->btcjkd", x, self.kv[...].astype(dt))
    if self.qkv_bias:
      q = q + self.q_bias[...].astype(dt)
      kv = kv + self.kv_bias[...].astype(dt)
    table = rope_lib.table(positions_bt, rope_lib.frequencies(q.shape[-1], self.rope_theta))
    q = rope_lib.apply(q, table)
    k_cmp = self._compress(kv[:, :, 0, 0], 0)
    v_cmp = self._compress(kv[:, :, 0, 1], 1)
    k_sel = rope_lib.apply(kv[:, :, 1, 0], table)
    k_win = rope_lib.apply(kv[:, :, 2, 0], table)
    gates = jax.nn.sigmoid(jnp.einsum("bte,ehc->bthc", x, self.gate[...].astype(dt))
                           + self.gate_bias[...].astype(dt))
    out = nsa_kernels.nsa_attention(q, (k_cmp, v_cmp), (k_sel, kv[:, :, 1, 1]),
                                    (k_win, kv[:, :, 2, 1]), gates, self.cfg, impl=self.impl)
    return jnp.einsum("bthd,hde->bte", out, self.o[...].astype(dt))
