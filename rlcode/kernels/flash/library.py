"""Masked attention through the library: `jax.nn.dot_product_attention`.

On GPU, impl="cudnn" calls it with implementation="cudnn" where it computes
our mask (`kernels.dispatch.cudnn_gap` says where). The tests run the same
arguments with implementation="xla" on CPU against our reference, so the GPU
path differs from the tested one only in that string. The mapping (jax
0.10.2's semantics):
  layouts: ours are its BTNH / BSKH, grouped-query included;
  dense causal: is_causal=True, query i on keys j <= i (top-left, hence the
    query placement `cudnn_gap` requires);
  sliding window w: is_causal=True and local_window_size=(w - 1, 0), keys
    i - w < j <= i (the diagonal included; cuDNN's sliding_window_length w);
  kv_lengths: key_value_seq_lengths (int32), keys j >= length masked.
A row that sees no key (only possible with padding or T > S) gets out 0, as
in every implementation here; the library gives an average of values there.

Must not: be chosen where it cannot return what the caller needs (the lse).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlcode.kernels.spec import AttentionSpec


def _sees_a_key(spec: AttentionSpec, b: int, t: int, s: int, kv_lengths):
  """[B, T] True where query i has a visible key (query i sits on key i)."""
  kv_len = jnp.full((b,), s, jnp.int32) if kv_lengths is None else jnp.minimum(
      jnp.asarray(kv_lengths, jnp.int32), s)
  pos = jnp.arange(t, dtype=jnp.int32)[None, :]
  hi = jnp.minimum(kv_len[:, None], pos + 1) if spec.causal else kv_len[:, None]
  lo = jnp.maximum(pos - spec.window + 1, 0) if spec.kind == "sliding" else 0
  return hi > lo


def attention(q, k, v, spec: AttentionSpec, *, implementation: str, kv_lengths=None,
              scale=None):
  """`kernels.attention` for impl="cudnn" (implementation="cudnn"); returns out only.

  q [B, T, H, D], k/v [B, S, K, D]; spec dense or sliding; queries placed from
  key 0 when causal. implementation: "cudnn", or "xla" (the tests, on CPU).
  """
  if spec.kind not in ("dense", "sliding"):
    raise ValueError(f"library attention: spec.kind={spec.kind!r}; expected 'dense' or "
                     "'sliding'")
  b, t, _, d = q.shape
  s = k.shape[1]
  window = (spec.window - 1, 0) if spec.kind == "sliding" else None
  lengths = None if kv_lengths is None else jnp.asarray(kv_lengths, jnp.int32)
  out = jax.nn.dot_product_attention(
      q, k, v, scale=d ** -0.5 if scale is None else float(scale), is_causal=spec.causal,
      key_value_seq_lengths=lengths, local_window_size=window, implementation=implementation)
  return jnp.where(_sees_a_key(spec, b, t, s, kv_lengths)[:, :, None, None], out, 0)
