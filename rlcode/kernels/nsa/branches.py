"""NSA's entry points: each branch's checks and implementation choice, and their sum.

Three branches over the same queries, each with its own keys/values:
  compressed: attention over compressed tokens; token i summarises key
    positions [i*d, i*d + l) and a query at t sees it iff i*d + l - 1 <= t.
  selected: attention over the keys of n selection blocks (size l') chosen per
    query and KV group; a block holding the query is causal.
  sliding: ordinary sliding-window attention (`kernels.attention`, kind
    "sliding").
`select_blocks` (in xla.py) turns the compressed attention probabilities into
the selected indices (eqs. 8-10 and top-n, with the first block and the local
blocks always in); top-k runs there, in XLA, outside any kernel, and the
selected-branch kernels gather key blocks by index.

The compression MLP, the projections and the gates are parameters: they live in
the model layer (`rlcode.models.nsa.NSAAttention`), not here. The branch
functions are training mode (queries and keys are the same full sequence,
T == S); `nsa_decode` is one new query per row against the layer's caches.

Implementations: "reference" (dense masks, reference.py), "xla" (blockwise,
memory linear in T, xla.py), "pallas"/"pallas_interpret" (pallas.py). The
compressed branch reuses masked attention's kernels (`kernels.flash`) with
compressed key positions.

Must not: hold attention math beyond combining the branches; own parameters.
"""

from __future__ import annotations

import jax.numpy as jnp

from rlcode.kernels import api, tiling
from rlcode.kernels.flash import pallas as flash_pallas
from rlcode.kernels.flash import xla as flash_xla
from rlcode.kernels.nsa import pallas as nsa_pallas
from rlcode.kernels.nsa import reference as nsa_reference
from rlcode.kernels.nsa import xla as nsa_xla
from rlcode.kernels.nsa.xla import compressed_positions, select_blocks
from rlcode.kernels.spec import AttentionSpec, NSAConfig

F32 = jnp.float32


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
    out, lse = nsa_reference.compressed_attention(q, k_cmp, v_cmp, cfg, scale=scale)
  elif impl == "xla":
    bq, bk = nsa_xla.XLA_TILES["compressed"]
    out, lse = flash_xla.masked_flash(q, k_cmp, v_cmp, mask, bq=cfg.block_q or bq, bk=bk,
                                     scale=scale, q_offset=0, k_pos=k_pos)
  else:
    bq, bk = AttentionSpec().blocks("pallas")
    out, lse = flash_pallas.masked_flash(q, k_cmp, v_cmp, mask, bq=cfg.block_q or bq, bk=bk,
                                        interpret=impl == "pallas_interpret", scale=scale,
                                        q_offset=0, k_pos=k_pos)
  return (out, lse) if return_lse else out


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
    out, lse = nsa_reference.selected_attention(q, k, v, indices, cfg, scale=scale)
  elif impl == "xla":
    bq = min(cfg.block_q or nsa_xla.XLA_TILES["selected"], tiling.round_up(t, 8))
    out, lse = nsa_xla.selected(q, k, v, indices, cfg.block_sel, bq, scale)
  else:
    out, lse = nsa_pallas.selected(q, k, v, indices, cfg.block_sel, scale,
                                   impl == "pallas_interpret")
  return (out, lse) if return_lse else out


def sliding_attention(q, k, v, cfg: NSAConfig, *, impl: str = "auto", scale=None,
                      return_lse: bool = False):
  """The sliding branch: causal attention over the last cfg.window keys."""
  return api.attention(q, k, v, AttentionSpec("sliding", window=cfg.window), impl=impl,
                       scale=scale, return_lse=return_lse)


def _gated_sum(gates, o_cmp, o_sel, o_win):
  """sum over branches of gate * branch output, in float32; gates [B, T, H, 3]."""
  gates = gates.astype(F32)[..., None]
  return (gates[..., 0, :] * o_cmp.astype(F32) + gates[..., 1, :] * o_sel.astype(F32)
          + gates[..., 2, :] * o_win.astype(F32))


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
  return _gated_sum(gates, o_cmp, o_sel, o_win).astype(q.dtype)


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
  runs in XLA (`kernels.nsa.xla.selected_decode`); the compressed and sliding
  branches use `decode_attention`.
  """
  tq, d = q.shape[1], q.shape[3]
  k_cmp, v_cmp = cmp_kv
  s = sel_kv[0].shape[2]
  if tq != 1:
    raise ValueError(f"nsa_decode: one query per row, got q{q.shape}")
  if s % cfg.block_sel:
    raise ValueError(f"nsa_decode: cache length {s} must be a multiple of "
                     f"block_sel={cfg.block_sel}")
  scale = d ** -0.5 if scale is None else float(scale)
  o_cmp, lse_cmp = api.decode_attention(q, k_cmp, v_cmp, num_compressed,
                                        spec=AttentionSpec(causal=False), impl=impl,
                                        scale=scale, return_lse=True, kv_head_major=True)
  o_sel = nsa_xla.selected_decode(q, k_cmp, lse_cmp, sel_kv, lengths - 1, cfg, scale)
  window = AttentionSpec("sliding", window=cfg.window)
  o_win = api.decode_attention(q, *win_kv, lengths, spec=window, impl=impl, scale=scale,
                               kv_head_major=True)
  return _gated_sum(gates, o_cmp, o_sel, o_win).astype(q.dtype)
