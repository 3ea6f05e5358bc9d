"""Native Sparse Attention (DeepSeek, arXiv 2502.11089): the branch functions.

Three branches over the same queries, each with its own keys/values:
  compressed: attention over compressed tokens; token i summarises key
    positions [i*d, i*d + l) and a query at t sees it iff i*d + l - 1 <= t.
  selected: attention over the keys of n selection blocks (size l') chosen per
    query and KV group; a block holding the query is causal.
  sliding: ordinary sliding-window attention (`kernels.attention`, kind
    "sliding").
`select_blocks` turns the compressed attention probabilities into the
selected indices (eqs. 8-10 and top-n, with the first block and the local
blocks always in); top-k runs there, in XLA, outside any kernel, and the
selected-branch kernels gather key blocks by index.

The compression MLP, the projections and the gates are parameters: they live in
the model layer (`rlcode.models.nsa.NSAAttention`), not here. The branch
functions are training mode (queries and keys are the same full sequence,
T == S); `nsa_decode` is one new query per row against the layer's caches.

Implementations: "reference" (dense masks, `kernels.reference`), "xla"
(blockwise, memory linear in T), "pallas"/"pallas_interpret". The compressed
branch reuses the flash kernels with compressed key positions; the selected
branch's Pallas kernel is a forward kernel (one program per query and KV
group, as in the paper) whose custom_vjp backward is the blockwise XLA one
(dK/dV of a gathered block are a scatter-add over queries, done in XLA).

Must not: build [T, T] or [T, T/l'] arrays outside the references; own parameters.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels import api, blockwise, pallas_flash, reference, tiling
from kernels.spec import AttentionSpec, NSAConfig

F32 = jnp.float32
# Query tiles of the blockwise XLA passes (and key tiles of the compressed
# branch), measured on CPU at T=8192: the scoring pass holds [tile, nc]
# probabilities and the selected branch gathers n*l' keys per query, so both
# want small tiles whose data stays in cache.
_XLA_TILES = {"compressed": (128, 128), "select": 32, "selected": 4}


def compressed_positions(cfg: NSAConfig, nc: int) -> jax.Array:
  """Position of the last key of each compressed token [nc]: i*d + l - 1."""
  return jnp.arange(nc, dtype=jnp.int32) * cfg.stride_cmp + cfg.block_cmp - 1


def compression_windows(x, cfg: NSAConfig):
  """The key blocks that compressed tokens summarise: [B, nc, l, K, D] from x [B, T, K, D]."""
  nc = cfg.num_compressed(x.shape[1])
  starts = jnp.arange(nc) * cfg.stride_cmp
  gather = starts[:, None] + jnp.arange(cfg.block_cmp)[None, :]  # [nc, l]
  return x[:, gather]


def compressed_attention(q, k_cmp, v_cmp, cfg: NSAConfig, *, impl: str = "auto", scale=None,
                         return_lse: bool = False):
  """The compressed branch.

  Args:
    q: [B, T, H, D], queries at positions 0..T-1.
    k_cmp, v_cmp: [B, nc, K, D] compressed keys/values (nc = cfg.num_compressed(T)).
    cfg: NSA sizes.
    impl, scale, return_lse: as for `kernels.attention`.

  Queries before the end of the first compressed block see nothing: out 0, lse -inf.
  """
  api.check_qkv("compressed_attention", q, k_cmp, v_cmp)
  if k_cmp.shape[1] != cfg.num_compressed(q.shape[1]):
    raise ValueError(f"compressed_attention: k_cmp has {k_cmp.shape[1]} compressed tokens; "
                     f"T={q.shape[1]} with block_cmp={cfg.block_cmp}, stride_cmp="
                     f"{cfg.stride_cmp} gives {cfg.num_compressed(q.shape[1])}")
  impl = api.resolve_impl(impl, "compressed_attention")
  if k_cmp.shape[1] == 0:  # T < block_cmp: no compressed token exists yet
    b, t, h, _ = q.shape
    out, lse = jnp.zeros_like(q), jnp.full((b, t, h), -jnp.inf, F32)
    return (out, lse) if return_lse else out
  mask = tiling.Mask(causal=True)
  k_pos = compressed_positions(cfg, k_cmp.shape[1])
  if impl == "reference":
    out, lse = reference.compressed_attention(q, k_cmp, v_cmp, cfg, scale=scale)
  elif impl == "xla":
    bq, bk = _XLA_TILES["compressed"]
    out, lse = blockwise.masked_flash(q, k_cmp, v_cmp, mask, bq=cfg.block_q or bq, bk=bk,
                                      scale=scale, q_offset=0, k_pos=k_pos)
  else:
    bq, bk = AttentionSpec().blocks("pallas")
    out, lse = pallas_flash.masked_flash(q, k_cmp, v_cmp, mask, bq=cfg.block_q or bq, bk=bk,
                                         interpret=impl == "pallas_interpret", scale=scale,
                                         q_offset=0, k_pos=k_pos)
  return (out, lse) if return_lse else out


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
  bq = min(cfg.block_q or _XLA_TILES["select"], tiling.round_up(t, 8))
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


# ------------------------------------------------------- selected branch


def _selected_layout(q, k, v, idx, block: int, bq: int):
  """Padded views: q [B, K, Tp, G, D], KV blocks [B, K, nb, l', 2D] (k | v), idx [B, K, Tp, n].

  K and V are gathered together: one gather of 2D-wide rows instead of two.
  """
  b, t, h, d = q.shape
  s, kh = k.shape[1], k.shape[2]
  g = h // kh
  tp = tiling.round_up(t, bq)
  nb = -(-s // block)
  qh = tiling.pad_axis(q, 1, tp).reshape(b, tp, kh, g, d).transpose(0, 2, 1, 3, 4)
  kv = jnp.concatenate([k, v.astype(k.dtype)], axis=-1)
  kvb = tiling.pad_axis(kv, 1, nb * block).reshape(b, nb, block, kh, 2 * d)
  ix = jnp.pad(idx, [(0, 0), (0, tp - t), (0, 0), (0, 0)], constant_values=-1)
  return qh, kvb.transpose(0, 3, 1, 2, 4), ix.transpose(0, 2, 1, 3)


_take = jax.vmap(jax.vmap(lambda blocks, ix: blocks[ix]))  # over B and K


def _selected_tile(qh, kvb, ix, i, bq, block, s, scale):
  """Recomputed pieces of one query tile.

  Returns q [B, K, bq, G, D] (scaled), the gathered k|v rows [B, K, bq, n*l', 2D],
  visibility [B, K, bq, 1, n*l'] and logits [B, K, bq, G, n*l'].
  """
  d = qh.shape[-1]
  qi = lax.dynamic_slice_in_dim(qh, i * bq, bq, axis=2).astype(F32) * scale
  ii = lax.dynamic_slice_in_dim(ix, i * bq, bq, axis=2)  # [B, K, bq, n]
  b, kh, _, n = ii.shape
  kvg = _take(kvb, jnp.maximum(ii, 0)).astype(F32).reshape(b, kh, bq, n * block, 2 * d)
  kpos = ii[..., None] * block + jnp.arange(block)
  qpos = (i * bq + jnp.arange(bq))[:, None, None]
  ok = (ii[..., None] >= 0) & (kpos <= qpos) & (kpos < s)
  ok = ok.reshape(b, kh, bq, 1, n * block)
  # Contract against the whole k|v rows (q padded with zeros over the v half):
  # slicing k and v out of the gathered rows would copy them.
  q_ext = jnp.concatenate([qi, jnp.zeros_like(qi)], axis=-1)
  logits = jnp.einsum("bkqgd,bkqsd->bkqgs", q_ext, kvg)
  return qi, kvg, ok, logits


def _selected_fwd_xla(q, k, v, idx, block, bq, scale):
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


def _selected_bwd_xla(q, k, v, idx, out, lse, dout, dlse, block, bq, scale):
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


def _sel_kernel(idx_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, block, num_sel, s, scale):
  t = pl.program_id(2)
  q = q_ref[...]
  rows, d = q.shape

  def body(j, carry):
    m, l, acc = carry
    blk = idx_ref[j]
    start = pl.multiple_of(jnp.maximum(blk, 0) * block, block)
    kj, vj = k_ref[pl.ds(start, block), :], v_ref[pl.ds(start, block), :]
    kpos = start + lax.iota(jnp.int32, block)
    ok = ((blk >= 0) & (kpos <= t) & (kpos < s))[None, :]
    sc = jnp.where(ok, pallas_flash.dot_nt(q, kj) * scale, pallas_flash.NEG)
    m_new = jnp.maximum(m, jnp.max(sc, axis=1))
    p = jnp.where(ok, jnp.exp(sc - m_new[:, None]), 0.0)
    alpha = jnp.exp(m - m_new)
    l = alpha * l + jnp.sum(p, axis=1)
    acc = alpha[:, None] * acc + pallas_flash.dot_nn(p.astype(vj.dtype), vj)
    return m_new, l, acc

  init = (jnp.full((rows,), pallas_flash.NEG, F32), jnp.zeros((rows,), F32),
          jnp.zeros((rows, d), F32))
  m, l, acc = lax.fori_loop(0, num_sel, body, init)
  seen = l > 0
  l_safe = jnp.where(seen, l, 1.0)
  o_ref[...] = (acc / l_safe[:, None]).astype(o_ref.dtype)
  lse_ref[...] = jnp.where(seen, m + jnp.log(l_safe), -jnp.inf)


def _selected_fwd_pallas(q, k, v, idx, block, scale, interpret):
  b, t, h, d = q.shape
  s, kh = k.shape[1], k.shape[2]
  g = h // kh
  n = idx.shape[-1]
  pallas_flash.check_gpu_sizes(interpret, block_sel=block, head_dim=d)
  # One program per (query, KV group): its G heads share the gathered blocks.
  # Triton's matmul needs at least 16 rows, so pad the heads on GPU.
  rows = g if interpret else max(16, pallas_flash.next_pow2(g))
  nb = -(-s // block)
  qg = q.reshape(b, t, kh, g, d).transpose(0, 2, 1, 3, 4)
  qg = tiling.pad_axis(qg, 3, rows)
  kt = tiling.pad_axis(k, 1, nb * block).transpose(0, 2, 1, 3)
  vt = tiling.pad_axis(v, 1, nb * block).transpose(0, 2, 1, 3)
  it = idx.transpose(0, 2, 1, 3)  # [B, K, T, n]
  kernel = functools.partial(_sel_kernel, block=block, num_sel=n, s=s, scale=scale)
  out, lse = pallas_flash.call(
      kernel, grid=(b, kh, t), interpret=interpret, name="nsa_selected",
      in_specs=[
          pl.BlockSpec((None, None, None, n), lambda bi, ki, ti: (bi, ki, ti, 0)),
          pl.BlockSpec((None, None, None, rows, d), lambda bi, ki, ti: (bi, ki, ti, 0, 0)),
          pl.BlockSpec((None, None, nb * block, d), lambda bi, ki, ti: (bi, ki, 0, 0)),
          pl.BlockSpec((None, None, nb * block, d), lambda bi, ki, ti: (bi, ki, 0, 0)),
      ],
      out_specs=[pl.BlockSpec((None, None, None, rows, d), lambda bi, ki, ti: (bi, ki, ti, 0, 0)),
                 pl.BlockSpec((None, None, None, rows), lambda bi, ki, ti: (bi, ki, ti, 0))],
      out_shape=[jax.ShapeDtypeStruct((b, kh, t, rows, d), q.dtype),
                 jax.ShapeDtypeStruct((b, kh, t, rows), F32)],
  )(it, qg, kt, vt)
  out = out[:, :, :, :g].transpose(0, 2, 1, 3, 4).reshape(b, t, h, d)
  lse = lse[:, :, :, :g].transpose(0, 2, 1, 3).reshape(b, t, h)
  return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _selected(q, k, v, idx, block, bq, scale, pallas):
  """pallas: None for XLA, else the `interpret` flag of the Pallas forward."""
  if pallas is None:
    return _selected_fwd_xla(q, k, v, idx, block, bq, scale)
  return _selected_fwd_pallas(q, k, v, idx, block, scale, pallas)


def _selected_vjp_fwd(q, k, v, idx, block, bq, scale, pallas):
  out, lse = _selected(q, k, v, idx, block, bq, scale, pallas)
  return (out, lse), (q, k, v, idx, out, lse)


def _selected_vjp_bwd(block, bq, scale, pallas, res, cts):
  del pallas  # both forwards share the blockwise XLA backward
  q, k, v, idx, out, lse = res
  dq, dk, dv = _selected_bwd_xla(q, k, v, idx, out, lse, cts[0], cts[1], block, bq, scale)
  return dq, dk, dv, None


_selected.defvjp(_selected_vjp_fwd, _selected_vjp_bwd)


def selected_attention(q, k, v, indices, cfg: NSAConfig, *, impl: str = "auto", scale=None,
                       return_lse: bool = False):
  """The selected branch: each query attends the keys of its selected blocks.

  Args:
    q: [B, T, H, D]; k, v: [B, T, K, D] (the selected branch's own keys).
    indices: int [B, T, K, n] block indices (from `select_blocks`); -1 = none.
      Blocks must be distinct per (query, group); a block after the query's
      sees nothing, the query's own block is causal.
    cfg: NSA sizes (block_sel).
    impl, scale, return_lse: as for `kernels.attention`.
  """
  api.check_qkv("selected_attention", q, k, v)
  b, t, h, d = q.shape
  if k.shape[1] != t:
    raise ValueError(f"selected_attention: training-mode NSA needs T == S; got q{q.shape} "
                     f"k{k.shape}")
  if indices.shape[:3] != (b, t, k.shape[2]):
    raise ValueError(f"selected_attention: indices has shape {indices.shape}; expected "
                     f"({b}, {t}, {k.shape[2]}, n)")
  if not jnp.issubdtype(indices.dtype, jnp.integer):
    raise ValueError(f"selected_attention: indices must be integers, got {indices.dtype}")
  impl = api.resolve_impl(impl, "selected_attention")
  scale = d ** -0.5 if scale is None else float(scale)
  indices = indices.astype(jnp.int32)
  if impl == "reference":
    out, lse = reference.selected_attention(q, k, v, indices, cfg, scale=scale)
  else:
    bq = min(cfg.block_q or _XLA_TILES["selected"], tiling.round_up(t, 8))
    pallas = None if impl == "xla" else impl == "pallas_interpret"
    out, lse = _selected(q, k, v, indices, cfg.block_sel, bq, scale, pallas)
  return (out, lse) if return_lse else out


def sliding_attention(q, k, v, cfg: NSAConfig, *, impl: str = "auto", scale=None,
                      return_lse: bool = False):
  """The sliding branch: causal attention over the last cfg.window keys."""
  return api.attention(q, k, v, AttentionSpec("sliding", window=cfg.window), impl=impl,
                       scale=scale, return_lse=return_lse)


def nsa_attention(q, cmp_kv, sel_kv, win_kv, gates, cfg: NSAConfig, *, impl: str = "auto",
                  scale=None):
  """The three branches combined: sum over branches of gate * branch output.

  Args:
    q: [B, T, H, D] (already rotated where the model uses RoPE).
    cmp_kv: (k_cmp, v_cmp) [B, nc, K, D] compressed keys/values.
    sel_kv, win_kv: (k, v) [B, T, K, D] of the selected and sliding branches.
    gates: [B, T, H, 3] gate values (compressed, selected, sliding).
    cfg, impl, scale: as for the branch functions.

  Returns [B, T, H, D] in q's dtype.
  """
  o_cmp, lse_cmp = compressed_attention(q, *cmp_kv, cfg, impl=impl, scale=scale,
                                        return_lse=True)
  idx = select_blocks(q, cmp_kv[0], lse_cmp, cfg, scale=scale)
  o_sel = selected_attention(q, *sel_kv, idx, cfg, impl=impl, scale=scale)
  o_win = sliding_attention(q, *win_kv, cfg, impl=impl, scale=scale)
  gates = gates.astype(F32)[..., None]
  out = (gates[..., 0, :] * o_cmp.astype(F32) + gates[..., 1, :] * o_sel.astype(F32)
         + gates[..., 2, :] * o_win.astype(F32))
  return out.astype(q.dtype)


# ------------------------------------------------------- decoding


def nsa_decode(q, cmp_kv, num_compressed, sel_kv, win_kv, lengths, gates, cfg: NSAConfig, *,
               impl: str = "auto", scale=None):
  """NSA for one new query per row against head-major caches (generation).

  Args:
    q: [B, 1, H, D], the newest token's queries; its keys are already in the
      caches, at index lengths - 1 (its position).
    cmp_kv: (k_cmp, v_cmp) [B, K, NC, D] compressed tokens; the first
      num_compressed[b] are complete (their blocks end at or before the query).
    sel_kv, win_kv: (k, v) [B, K, S, D] caches of the selected and sliding
      branches, S a multiple of cfg.block_sel; lengths [B] valid entries.
    gates: [B, 1, H, 3].
    cfg, impl, scale: as for `nsa_attention`.

  Returns [B, 1, H, D]: row lengths - 1 of `nsa_attention` over the whole
  sequence (the same compressed tokens, the same selected blocks, the same
  window), without recomputing it. The selected branch gathers the n chosen
  blocks of l' keys per KV group (n * l' keys, at most 1024 by default) and
  runs in XLA; the compressed and sliding branches use `decode_attention`.
  """
  b, tq, h, d = q.shape
  k_cmp, v_cmp = cmp_kv
  k_sel, v_sel = sel_kv
  kh, s = k_sel.shape[1], k_sel.shape[2]
  g = h // kh
  if tq != 1:
    raise ValueError(f"nsa_decode: one query per row, got q{q.shape}")
  if s % cfg.block_sel:
    raise ValueError(f"nsa_decode: cache length {s} must be a multiple of "
                     f"block_sel={cfg.block_sel}")
  scale = d ** -0.5 if scale is None else float(scale)
  o_cmp, lse_cmp = api.decode_attention(q, k_cmp, v_cmp, num_compressed,
                                        spec=AttentionSpec(causal=False), impl=impl,
                                        scale=scale, return_lse=True, kv_head_major=True)
  # Selection, exactly as in training: the compressed probabilities of each
  # KV group's heads, mapped onto blocks (eq. 9), top-n with the forced blocks.
  pos = (lengths - 1)[:, None]  # [B, 1]
  qg = q.reshape(b, kh, g, 1, d).astype(F32) * scale
  lse = lse_cmp.reshape(b, kh, g, 1)
  nsel = cfg.num_blocks(s)
  top = min(cfg.num_sel, nsel)
  ends = compressed_positions(cfg, k_cmp.shape[2])
  idx = _top_blocks(qg, k_cmp.astype(F32), lse, pos, ends, cfg, nsel, top)[:, :, 0]
  # The selected branch over the gathered blocks [B, K, n, l', D].
  blocks = lambda x: x.reshape(b, kh, s // cfg.block_sel, cfg.block_sel, d)
  keys = _take(blocks(k_sel), jnp.maximum(idx, 0)).astype(F32)
  values = _take(blocks(v_sel), jnp.maximum(idx, 0)).astype(F32)
  key_pos = idx[..., None] * cfg.block_sel + jnp.arange(cfg.block_sel)  # [B, K, n, l']
  visible = (idx[..., None] >= 0) & (key_pos <= pos[:, :, None, None])
  logits = jnp.einsum("bkgd,bknld->bkgnl", qg[:, :, :, 0], keys)
  logits = jnp.where(visible[:, :, None], logits, -jnp.inf)
  probs = jax.nn.softmax(logits.reshape(b, kh, g, -1), axis=-1)
  o_sel = jnp.einsum("bkgs,bksd->bkgd", probs, values.reshape(b, kh, -1, d))
  o_sel = o_sel.reshape(b, 1, h, d)
  window = AttentionSpec("sliding", window=cfg.window)
  o_win = api.decode_attention(q, *win_kv, lengths, spec=window, impl=impl, scale=scale,
                               kv_head_major=True)
  gates = gates.astype(F32)[..., None]
  out = (gates[..., 0, :] * o_cmp.astype(F32) + gates[..., 1, :] * o_sel
         + gates[..., 2, :] * o_win.astype(F32))
  return out.astype(q.dtype)
