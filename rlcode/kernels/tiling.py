"""Tile bookkeeping shared by every family's blockwise XLA and Pallas versions.

A mask is described by integer arrays (positions, segment ids, valid lengths)
plus a static `Mask`; `block_mask` evaluates it on one tile pair, and
`make_layout` pads the arrays and computes, for each query tile, the range
[lo, hi) of key tiles that can hold a visible key. Visiting only that range is
what makes the cost grow with the attended area. Also here (from rlcode.kernels.spec): `cdiv` /
`round_up`, padding, and the head-major layout the tiled versions compute in.
Nothing here is T x S, and nothing here computes attention.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlcode.kernels.spec import AttentionSpec, cdiv, round_up  # noqa: F401 (re-exported)

_BIG = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Mask:
  """Static part of a mask. Keys are always limited to index < kv_len.

  causal: key position <= query position. window (> 0): key position >
  query position - window. document: same segment, or the query is in the
  row's final segment; with packed, same segment only (no segment is final).
  """

  causal: bool = True
  window: int = 0
  document: bool = False
  packed: bool = False

  @classmethod
  def from_spec(cls, spec: AttentionSpec) -> Mask:
    return cls(causal=spec.causal, window=spec.window if spec.kind == "sliding" else 0,
               document=spec.kind in ("document", "packed"), packed=spec.kind == "packed")


class Layout(NamedTuple):
  """Integer arrays of a padded problem (Tp = nq * block_q, Sp = nk * block_k).

  q_pos, q_seg: [B, Tp] query positions and segment ids. k_pos: [Sp] key
  positions (ascending; arange for ordinary keys, block ends for compressed
  keys). k_seg: [B, Sp]. kv_len: [B] valid keys (by index). final: [B] the
  final segment id. lo, hi: [B, nq] key-tile range of each query tile.
  """

  q_pos: jax.Array
  q_seg: jax.Array
  k_pos: jax.Array
  k_seg: jax.Array
  kv_len: jax.Array
  final: jax.Array
  lo: jax.Array
  hi: jax.Array


def block_mask(mask: Mask, q_pos, q_seg, k_idx, k_pos, k_seg, kv_len, final):
  """Visibility [..., bq, bk] of one tile pair.

  q_pos, q_seg: [..., bq]; k_idx, k_pos: [bk]; k_seg: [..., bk]; kv_len,
  final: [...] (leading dims broadcast: a batch, or none inside a kernel).
  """
  ok = k_idx[None, :] < jnp.asarray(kv_len)[..., None, None]
  if mask.causal:
    ok = ok & (k_pos[None, :] <= q_pos[..., :, None])
  if mask.window:
    ok = ok & (k_pos[None, :] > q_pos[..., :, None] - mask.window)
  if mask.document:
    is_final = q_seg == jnp.asarray(final)[..., None]
    ok = ok & ((q_seg[..., :, None] == k_seg[..., None, :]) | is_final[..., :, None])
  return ok


def pad_axis(x, axis: int, size: int, mode: str = "constant"):
  """Pads x along axis to length `size` (zeros, or repeating the edge)."""
  extra = size - x.shape[axis]
  if extra == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, extra)
  return jnp.pad(x, widths, mode=mode)


def concrete(x):
  """x as a numpy array when its value is known now (not traced), else None."""
  try:
    return np.asarray(x)
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    return None


def check_segment_ids(name: str, seg) -> None:
  """Segment ids must be non-decreasing along each row.

  Checked when the ids are concrete. Under jit they are tracers and cannot be
  checked; decreasing ids then give undefined results (the tile ranges assume
  sorted ids), so callers that jit should validate their batches on the host.
  """
  arr = concrete(seg)
  if arr is not None and arr.shape[-1] > 1 and np.any(np.diff(arr, axis=-1) < 0):
    row = int(np.argwhere(np.diff(arr, axis=-1) < 0)[0][0])
    raise ValueError(f"{name} must be non-decreasing along each row; row {row} is "
                     f"{arr[row].tolist()}")


def make_layout(mask: Mask, b: int, t: int, s: int, bq: int, bk: int, *, q_offset=None,
                kv_lengths=None, segment_ids=None, kv_segment_ids=None,
                k_pos=None) -> Layout:
  """Pads the mask arrays to whole tiles and computes each query tile's key range.

  Args:
    mask: the static mask.
    b, t, s: batch, query length, key length (unpadded).
    bq, bk: tile sizes.
    q_offset: int or [B]; default s - t.
    kv_lengths: [B] valid keys; default s.
    segment_ids, kv_segment_ids: [B, T], [B, S] (document masks).
    k_pos: [S] ascending key positions; default arange(s).
  """
  tp, sp = round_up(t, bq), round_up(s, bk)
  nq = tp // bq
  if q_offset is None:
    q_offset = s - t
  q_offset = jnp.broadcast_to(jnp.asarray(q_offset, jnp.int32), (b,))
  q_pos = q_offset[:, None] + jnp.arange(tp, dtype=jnp.int32)[None, :]
  if kv_lengths is None:
    kv_len = jnp.full((b,), s, jnp.int32)
  else:
    kv_len = jnp.minimum(jnp.asarray(kv_lengths, jnp.int32), s)
  if k_pos is None:
    k_pos = jnp.arange(sp, dtype=jnp.int32)
  else:
    # Padding keys sit past every query (they are also beyond kv_len).
    k_pos = pad_axis(jnp.asarray(k_pos, jnp.int32), 0, sp, mode="edge")
  if mask.document:
    q_seg = jnp.asarray(segment_ids, jnp.int32)
    k_seg = q_seg if kv_segment_ids is None else jnp.asarray(kv_segment_ids, jnp.int32)
    # Packed sequences have no final segment: -1 matches no (non-negative) id.
    final = jnp.full((b,), -1, jnp.int32) if mask.packed else jnp.max(k_seg, axis=1)
    q_seg = pad_axis(q_seg, 1, tp, mode="edge")
    k_seg = pad_axis(k_seg, 1, sp, mode="edge")
  else:
    q_seg = jnp.zeros((b, tp), jnp.int32)
    k_seg = jnp.zeros((b, sp), jnp.int32)
    final = jnp.zeros((b,), jnp.int32)

  valid = (jnp.arange(tp) < t).reshape(nq, bq)
  pos = q_pos.reshape(b, nq, bq)
  q_max = jnp.max(jnp.where(valid, pos, -_BIG), axis=2)
  q_min = jnp.min(jnp.where(valid, pos, _BIG), axis=2)
  n_keys = jnp.broadcast_to(kv_len[:, None], (b, nq))
  if mask.causal:
    n_keys = jnp.minimum(n_keys, jnp.searchsorted(k_pos, q_max, side="right"))
  hi = cdiv(n_keys, bk)
  first = jnp.zeros((b, nq), jnp.int32)
  if mask.window:
    first = jnp.searchsorted(k_pos, q_min - mask.window, side="right").astype(jnp.int32)
  if mask.document:
    doc_start = jax.vmap(lambda row, q: jnp.searchsorted(row, q, side="left"))(k_seg, q_seg)
    start = jnp.where(q_seg == final[:, None], 0, doc_start).reshape(b, nq, bq)
    first = jnp.maximum(first, jnp.min(jnp.where(valid, start, _BIG), axis=2))
  lo = jnp.minimum(first // bk, hi)
  return Layout(q_pos, q_seg, k_pos, k_seg, kv_len, final,
                lo.astype(jnp.int32), hi.astype(jnp.int32))


def to_head_major(q, k, v, tp: int, sp: int):
  """[B, T, H, D], [B, S, K, D] -> padded [B, K, G, Tp, D], [B, K, Sp, D]."""
  b, t, h, d = q.shape
  kh = k.shape[2]
  q = pad_axis(q, 1, tp).reshape(b, tp, kh, h // kh, d).transpose(0, 2, 3, 1, 4)
  k = pad_axis(k, 1, sp).transpose(0, 2, 1, 3)
  v = pad_axis(v, 1, sp).transpose(0, 2, 1, 3)
  return q, k, v


def from_head_major(out, lse, t: int):
  """Inverse of `to_head_major` for the results: [B, T, H, D], [B, T, H]."""
  b, kh, g, tp, d = out.shape
  out = out.transpose(0, 3, 1, 2, 4).reshape(b, tp, kh * g, d)[:, :t]
  lse = lse.transpose(0, 3, 1, 2).reshape(b, tp, kh * g)[:, :t]
  return out, lse


def tile_sizes(bq: int, bk: int, t: int, s: int, multiple: int = 8) -> tuple[int, int]:
  """Tiles no larger than the (rounded-up) lengths: a short input is one tile."""
  return min(bq, round_up(t, multiple)), min(bk, round_up(s, multiple))
