"""The exact merge of partial attentions by their log-sum-exp, and the online softmax's
step, the one copy of each.

Attention over a key set split into disjoint parts equals the parts' outputs
weighted by exp(lse_part - lse_whole). Callers: `kernels.merge` (shared
prefixes, KV in chunks) and the split-K decode kernel's final reduction; the blockwise
XLA paths (flash and paged) take `online_step` and `online_finish`.

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


def online_step(m, l, acc, scores, v, product: str):
  """One tile of an online softmax: the running max m, sum l and weighted values acc after
  `scores` (-inf where masked) and their values `v`, combined by einsum `product`
  (scores, v -> acc's shape). A row with nothing visible yet keeps max -inf; it is shifted
  by 0, so exp gives 0, not NaN."""
  m_new = jnp.maximum(m, jnp.max(scores, axis=-1))
  m_use = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
  p = jnp.exp(scores - m_use[..., None])
  alpha = jnp.exp(m - m_use)
  return (m_new, alpha * l + jnp.sum(p, axis=-1),
          alpha[..., None] * acc + jnp.einsum(product, p, v))


def online_finish(m, l, acc):
  """The output and log-sum-exp of an online softmax (0 and -inf where nothing was seen)."""
  seen = l > 0
  l_use = jnp.where(seen, l, 1.0)
  return acc / l_use[..., None], jnp.where(seen, m + jnp.log(l_use), -jnp.inf)

