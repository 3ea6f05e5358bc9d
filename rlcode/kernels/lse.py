"""The exact merge of partial attentions by their log-sum-exp, the one copy of it.

Attention over a key set split into disjoint parts equals the parts' outputs
weighted by exp(lse_part - lse_whole). Callers: `kernels.merge` (shared
prefixes, KV in chunks) and the split-K decode kernel's final reduction.

Must not: know where the parts came from (any implementation's (out, lse) merges).
"""

from __future__ import annotations

import jax.numpy as jnp


def _merge(outs, lses):
  """outs: P arrays [..., D]; lses: P arrays [...] float32. Returns float32 (out, lse)."""
  lse_all = jnp.stack(lses)
  m = jnp.max(lse_all, axis=0)
  m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
  w = jnp.exp(lse_all - m_safe)
  denom = jnp.sum(w, axis=0)
  seen = denom > 0
  out = sum(wi[..., None] * o for wi, o in zip(w, outs))
  out = out / jnp.where(seen, denom, 1.0)[..., None]
  lse = jnp.where(seen, m_safe + jnp.log(jnp.where(seen, denom, 1.0)), -jnp.inf)
  return out, lse


def merge_axis(out, lse, axis: int):
  """Merges float32 parts stacked along `axis`: out [..., P, ..., D], lse without the D axis.

  Returns (out, lse) with the part axis removed. Parts with lse = -inf (no
  visible key) contribute nothing; a row that no part sees gives out 0 and
  lse -inf.
  """
  parts = range(lse.shape[axis])
  return _merge([jnp.take(out, i, axis=axis) for i in parts],
                [jnp.take(lse, i, axis=axis) for i in parts])


def merge(outs, lses):
  """Exact merge of partial attentions over disjoint key sets.

  outs: sequence of [B, T, H, D]; lses: sequence of [B, T, H]. Returns the merged
  (out in the first part's dtype, lse float32). Parts with lse = -inf (no
  visible key) contribute nothing.
  """
  if len(outs) != len(lses) or not outs:
    raise ValueError(f"merge: need as many outs as lses (at least one); got "
                     f"{len(outs)} and {len(lses)}")
  out, lse = _merge([o.astype(jnp.float32) for o in outs],
                    [l.astype(jnp.float32) for l in lses])
  return out.astype(outs[0].dtype), lse
