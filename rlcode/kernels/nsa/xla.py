"""NSA in plain XLA: compression windows, block selection, the selected branch blockwise.

Selection (eqs. 8-10 and top-n, `select_blocks`) runs here for every
implementation: top-k is `jax.lax.top_k`, outside any kernel. The selected
branch's blockwise version (`selected`, the CPU default) gathers each query
tile's n blocks of l' keys and runs a softmax over them; its backward
recomputes the probabilities from the saved log-sum-exp and scatter-adds dK/dV
into the gathered blocks. The compressed and sliding branches are masked
attention (`kernels.flash`) with compressed key positions and a window.

Must not: build [T, T] or [T, T/l'] arrays; own parameters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from rlcode.kernels import tiling, vjp
from rlcode.kernels.spec import NSAConfig

F32 = jnp.float32

# Query tiles of the blockwise XLA passes (and key tiles of the compressed
# branch), measured on CPU at T=8192: the scoring pass holds [tile, nc]
# probabilities and the selected branch gathers n*l' keys per query, so both
# want small tiles whose data stays in cache.
XLA_TILES = {"compressed": (128, 128), "select": 32, "selected": 4}


def compressed_positions(cfg: NSAConfig, nc: int) -> jax.Array:
  """Position of the last key of each compressed token [nc]: i*d + l - 1."""
  return jnp.arange(nc, dtype=jnp.int32) * cfg.stride_cmp + cfg.block_cmp - 1


def compression_windows(x, cfg: NSAConfig):
  """The key blocks that compressed tokens summarise: [B, nc, l, K, D] from x [B, T, K, D]."""
  nc = cfg.num_compressed(x.shape[1])
  starts = jnp.arange(nc) * cfg.stride_cmp
  gather = starts[:, None] + jnp.arange(cfg.block_cmp)[None, :]  # [nc, l]
  return x[:, gather]


def _eq9(p_cmp, cfg: NSAConfig, nsel: int):
  """Eq. 9 on the last axis: p_slc[j] = sum_{m<l'/d, n<l/d} p_cmp[(l'/d) j - m - n]."""
  ratio, span = cfg.block_sel // cfg.stride_cmp, cfg.block_cmp // cfg.stride_cmp
  nc = p_cmp.shape[-1]
  smax = ratio + span - 2
  right = max(0, ratio * (nsel - 1) + 1 - nc)
  padded = jnp.pad(p_cmp, [(0, 0)] * (p_cmp.ndim - 1) + [(smax, right)])
  out = jnp.zeros(p_cmp.shape[:-1] + (nsel,), p_cmp.dtype)
  for shift in range(smax + 1):
    count = sum(1 for m in range(ratio) for n in range(span) if m + n == shift)
    start = smax - shift
    taken = lax.slice_in_dim(padded, start, start + ratio * (nsel - 1) + 1, stride=ratio,
                             axis=p_cmp.ndim - 1)
    out = out + count * taken
  return out


def _top_blocks(q, kc, lse, pos, ends, cfg: NSAConfig, nsel: int, top: int):
  """Top-`top` selection blocks of queries at positions `pos`: int32 [B, K, Tq, top].

  q [B, K, G, Tq, D] float32, already scaled; kc [B, K, nc, D] float32
  compressed keys; lse [B, K, G, Tq] of the compressed branch; pos [B or 1,
  Tq]; ends [nc] the last position each compressed token covers.
  """
  visible = (ends <= pos[..., None])[:, None, None]  # [B|1, 1, 1, Tq, nc]
  logits = jnp.einsum("bkgqd,bkcd->bkgqc", q, kc)
  lse = jnp.where(jnp.isfinite(lse), lse, 0.0)
  probs = jnp.where(visible, jnp.exp(logits - lse[..., None]), 0.0).sum(axis=2)
  scores = _eq9(probs, cfg, nsel)  # [B, K, Tq, nsel]
  own = (pos // cfg.block_sel)[:, None, :, None]
  blk = jnp.arange(nsel)
  forced = (blk == 0) | ((blk <= own) & (blk > own - cfg.num_local))
  scores = jnp.where(forced, jnp.inf, scores)
  scores = jnp.where(blk > own, -jnp.inf, scores)
  values, idx = lax.top_k(scores, top)
  return jnp.where(values == -jnp.inf, -1, idx).astype(jnp.int32)


def select_blocks(q, k_cmp, lse_cmp, cfg: NSAConfig, *, scale=None) -> jax.Array:
  """Top-n selection blocks per query and KV group: int32 [B, T, K, n].

  Scores (eqs. 8-10): the compressed attention probabilities (recomputed
  from q, k_cmp and the compressed branch's lse [B, T, H]) summed over the
  query heads of each KV group and mapped onto selection blocks by eq. 9.
  The first block and the `num_local` blocks ending at the query's own block
  are always selected; blocks after the query's are never. Indices are sorted
  by score (always-on blocks first); -1 fills slots when fewer than n blocks
  exist. Runs tile by tile over the queries (memory O(T * nc / T_tiles)),
  with `jax.lax.top_k`. No gradient flows through the indices.
  """
  b, t, h, d = q.shape
  nc, kh = k_cmp.shape[1], k_cmp.shape[2]
  g = h // kh
  scale = d ** -0.5 if scale is None else float(scale)
  nsel = cfg.num_blocks(t)
  top = min(cfg.num_sel, nsel)
  bq = min(cfg.block_q or XLA_TILES["select"], tiling.round_up(t, 8))
  tp = tiling.round_up(t, bq)
  q = lax.stop_gradient(q)
  qh = tiling.pad_axis(q, 1, tp).reshape(b, tp, kh, g, d).transpose(0, 2, 3, 1, 4)
  kc = lax.stop_gradient(k_cmp).astype(F32).transpose(0, 2, 1, 3)  # [B, K, nc, D]
  lse = tiling.pad_axis(lax.stop_gradient(lse_cmp), 1, tp).reshape(b, tp, kh, g)
  lse = lse.transpose(0, 2, 3, 1)  # [B, K, G, Tp]
  ends = compressed_positions(cfg, nc)

  def tile(i):
    qi = lax.dynamic_slice_in_dim(qh, i * bq, bq, axis=3).astype(F32) * scale
    lse_i = lax.dynamic_slice_in_dim(lse, i * bq, bq, axis=3)
    pos = (i * bq + jnp.arange(bq))[None, :]
    return _top_blocks(qi, kc, lse_i, pos, ends, cfg, nsel, top)

  idx = lax.map(tile, jnp.arange(tp // bq))  # [nq, B, K, bq, top]
  idx = jnp.moveaxis(idx, 0, 2).reshape(b, kh, tp, top)[:, :, :t].transpose(0, 2, 1, 3)
  if top < cfg.num_sel:
    idx = jnp.pad(idx, [(0, 0)] * 3 + [(0, cfg.num_sel - top)], constant_values=-1)
  return idx


def _selected_layout(q, k, v, idx, block: int, bq: int):
  """Padded views: q [B, K, Tp, G, D], KV blocks [B, K, nb, l', 2D] (k | v), idx [B, K, Tp, n].

  K and V are gathered together: one gather of 2D-wide rows instead of two.
  """
  b, t, h, d = q.shape
  s, kh = k.shape[1], k.shape[2]
  g = h // kh
  tp = tiling.round_up(t, bq)
  nb = tiling.cdiv(s, block)
  qh = tiling.pad_axis(q, 1, tp).reshape(b, tp, kh, g, d).transpose(0, 2, 1, 3, 4)
  kv = jnp.concatenate([k, v.astype(k.dtype)], axis=-1)
  kvb = tiling.pad_axis(kv, 1, nb * block).reshape(b, nb, block, kh, 2 * d)
  ix = jnp.pad(idx, [(0, 0), (0, tp - t), (0, 0), (0, 0)], constant_values=-1)
  return qh, kvb.transpose(0, 3, 1, 2, 4), ix.transpose(0, 2, 1, 3)


_take_blocks = jax.vmap(jax.vmap(lambda blocks, ix: blocks[ix]))  # over B and K


def _selected_tile(qh, kvb, ix, i, bq, block, s, scale):
  """Recomputed pieces of one query tile.

  Returns q [B, K, bq, G, D] (scaled), the gathered k|v rows [B, K, bq, n*l', 2D],
  visibility [B, K, bq, 1, n*l'] and logits [B, K, bq, G, n*l'].
  """
  d = qh.shape[-1]
  qi = lax.dynamic_slice_in_dim(qh, i * bq, bq, axis=2).astype(F32) * scale
  ii = lax.dynamic_slice_in_dim(ix, i * bq, bq, axis=2)  # [B, K, bq, n]
  b, kh, _, n = ii.shape
  kvg = _take_blocks(kvb, jnp.maximum(ii, 0)).astype(F32).reshape(b, kh, bq, n * block, 2 * d)
  kpos = ii[..., None] * block + jnp.arange(block)
  qpos = (i * bq + jnp.arange(bq))[:, None, None]
  ok = (ii[..., None] >= 0) & (kpos <= qpos) & (kpos < s)
  ok = ok.reshape(b, kh, bq, 1, n * block)
  # Contract against the whole k|v rows (q padded with zeros over the v half):
  # slicing k and v out of the gathered rows would copy them.
  q_ext = jnp.concatenate([qi, jnp.zeros_like(qi)], axis=-1)
  logits = jnp.einsum("bkqgd,bkqsd->bkqgs", q_ext, kvg)
  return qi, kvg, ok, logits


def _forward(q, k, v, idx, block, bq, scale):
  b, t, h, d = q.shape
  s = k.shape[1]
  qh, kvb, ix = _selected_layout(q, k, v, idx, block, bq)

  def tile(i):
    _, kvg, ok, logits = _selected_tile(qh, kvb, ix, i, bq, block, s, scale)
    logits = jnp.where(ok, logits, -jnp.inf)
    m = jnp.max(logits, axis=-1)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.exp(logits - m[..., None])
    l = jnp.sum(p, axis=-1)
    seen = l > 0
    out = jnp.einsum("bkqgs,bkqsd->bkqgd", p, kvg)[..., d:]
    out = out / jnp.where(seen, l, 1.0)[..., None]
    lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), -jnp.inf)
    return out.astype(q.dtype), lse

  outs, lses = lax.map(tile, jnp.arange(qh.shape[2] // bq))  # [nq, B, K, bq, G, ...]
  out = outs.transpose(1, 0, 3, 2, 4, 5).reshape(b, -1, h, d)[:, :t]
  lse = lses.transpose(1, 0, 3, 2, 4).reshape(b, -1, h)[:, :t]
  return out, lse


def _backward(q, k, v, idx, out, lse, dout, dlse, block, bq, scale):
  b, t, h, d = q.shape
  s, kh = k.shape[1], k.shape[2]
  g = h // kh
  qh, kvb, ix = _selected_layout(q, k, v, idx, block, bq)
  tp = qh.shape[2]
  to_hm = lambda x: jnp.moveaxis(
      tiling.pad_axis(x, 1, tp).reshape(b, tp, kh, g, *x.shape[3:]), 2, 1)
  do_h = to_hm(dout)  # [B, K, Tp, G, D]
  delta = to_hm(jnp.sum(dout.astype(F32) * out.astype(F32), axis=-1) - dlse.astype(F32))
  lse_h = to_hm(lse)
  lse_h = jnp.where(jnp.isfinite(lse_h), lse_h, 0.0)
  scatter = jax.vmap(jax.vmap(lambda acc, ix_, upd: acc.at[ix_].add(upd)))

  def tile(dkvb, i):
    qi, kvg, ok, logits = _selected_tile(qh, kvb, ix, i, bq, block, s, scale)
    doi = lax.dynamic_slice_in_dim(do_h, i * bq, bq, axis=2).astype(F32)
    lse_i = lax.dynamic_slice_in_dim(lse_h, i * bq, bq, axis=2)
    delta_i = lax.dynamic_slice_in_dim(delta, i * bq, bq, axis=2)
    p = jnp.where(ok, jnp.exp(logits - lse_i[..., None]), 0.0)
    kg, vg = kvg[..., :d], kvg[..., d:]
    ds = p * (jnp.einsum("bkqgd,bkqsd->bkqgs", doi, vg) - delta_i[..., None])
    dq = jnp.einsum("bkqgs,bkqsd->bkqgd", ds, kg) * scale
    dkv = jnp.concatenate([jnp.einsum("bkqgs,bkqgd->bkqsd", ds, qi),
                           jnp.einsum("bkqgs,bkqgd->bkqsd", p, doi)], axis=-1)
    n = ix.shape[-1]
    safe = jnp.maximum(lax.dynamic_slice_in_dim(ix, i * bq, bq, axis=2), 0)
    dkvb = scatter(dkvb, safe, dkv.reshape(b, kh, bq, n, block, 2 * d))
    return dkvb, dq

  dkvb, dqs = lax.scan(tile, jnp.zeros(kvb.shape, F32), jnp.arange(tp // bq))
  dq = dqs.transpose(1, 0, 3, 2, 4, 5).reshape(b, tp, h, d)[:, :t]
  dkv = dkvb.transpose(0, 2, 3, 1, 4).reshape(b, -1, kh, 2 * d)[:, :s]
  return dq.astype(q.dtype), dkv[..., :d].astype(k.dtype), dkv[..., d:].astype(v.dtype)


# The selected branch, blockwise: selected(q, k, v, idx, block, bq, scale) with
# q [B, T, H, D], k/v [B, T, K, D], idx [B, T, K, n]; returns (out [B, T, H, D],
# lse [B, T, H] float32); bq queries per tile.
selected = vjp.attention_vjp(_forward, _backward, num_inputs=4)


def selected_decode(q, k_cmp, lse_cmp, sel_kv, pos, cfg: NSAConfig, scale: float):
  """Selection and the selected branch for one query per row, as in training.

  q [B, 1, H, D]; k_cmp [B, K, NC, D] and lse_cmp [B, 1, H], the compressed
  branch's keys and log-sum-exp; sel_kv (k, v) [B, K, S, D] caches, S a
  multiple of block_sel; pos [B] the query's position. Returns [B, 1, H, D]
  float32.
  """
  b, _, h, d = q.shape
  k_sel, v_sel = sel_kv
  kh, s = k_sel.shape[1], k_sel.shape[2]
  g = h // kh
  # The compressed probabilities of each KV group's heads, mapped onto blocks
  # (eq. 9), top-n with the forced blocks.
  pos = pos[:, None]  # [B, 1]
  qg = q.reshape(b, kh, g, 1, d).astype(F32) * scale
  lse = lse_cmp.reshape(b, kh, g, 1)
  nsel = cfg.num_blocks(s)
  top = min(cfg.num_sel, nsel)
  ends = compressed_positions(cfg, k_cmp.shape[2])
  idx = _top_blocks(qg, k_cmp.astype(F32), lse, pos, ends, cfg, nsel, top)[:, :, 0]
  # The selected branch over the gathered blocks [B, K, n, l', D].
  blocks = lambda x: x.reshape(b, kh, s // cfg.block_sel, cfg.block_sel, d)
  keys = _take_blocks(blocks(k_sel), jnp.maximum(idx, 0)).astype(F32)
  values = _take_blocks(blocks(v_sel), jnp.maximum(idx, 0)).astype(F32)
  key_pos = idx[..., None] * cfg.block_sel + jnp.arange(cfg.block_sel)  # [B, K, n, l']
  visible = (idx[..., None] >= 0) & (key_pos <= pos[:, :, None, None])
  logits = jnp.einsum("bkgd,bknld->bkgnl", qg[:, :, :, 0], keys)
  logits = jnp.where(visible[:, :, None], logits, -jnp.inf)
  probs = jax.nn.softmax(logits.reshape(b, kh, g, -1), axis=-1)
  o_sel = jnp.einsum("bkgs,bksd->bkgd", probs, values.reshape(b, kh, -1, d))
  return o_sel.reshape(b, 1, h, d)
