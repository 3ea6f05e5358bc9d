"""The entry point: argument checks, implementation choice, fallbacks with warnings.

No attention math lives here: it only validates, asks `kernels.dispatch` which
implementation (reference, blockwise XLA, Pallas, cuDNN) of a family serves the
call (`kernels.flash` for masked attention, `kernels.decode` for decoding,
`kernels.paged` for decoding over a paged cache),
warns where a request falls back, and forwards. NSA's entry points
(`kernels.nsa`) use the same checks and choice.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp

from rlcode.kernels import dispatch, tiling
from rlcode.kernels.decode import pallas as decode_pallas
from rlcode.kernels.decode import reference as decode_reference
from rlcode.kernels.decode import xla as decode_xla
from rlcode.kernels.flash import library as flash_library
from rlcode.kernels.flash import pallas as flash_pallas
from rlcode.kernels.flash import reference as flash_reference
from rlcode.kernels.flash import xla as flash_xla
from rlcode.kernels.paged import pallas as paged_pallas
from rlcode.kernels.paged import reference as paged_reference
from rlcode.kernels.paged import xla as paged_xla
from rlcode.kernels.spec import AttentionSpec

IMPLS = dispatch.IMPLS


def _check_shape(fn: str, name: str, x, shape) -> None:
  if x is not None and jnp.shape(x) != tuple(shape):
    raise ValueError(f"{fn}: {name} has shape {jnp.shape(x)}; expected {tuple(shape)}")


def check_qkv(fn: str, q, k, v) -> None:
  """Rank, matching batch/head_dim, k == v shapes, H a multiple of K."""
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError(f"{fn}: q, k, v must be rank 4 ([B, T, H, D], [B, S, K, D]); "
                     f"got q{q.shape} k{k.shape} v{v.shape}")
  if k.shape != v.shape:
    raise ValueError(f"{fn}: k{k.shape} and v{v.shape} must have the same shape")
  if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
    raise ValueError(f"{fn}: batch and head_dim of q{q.shape} and k{k.shape} differ")
  if k.shape[2] < 1 or q.shape[2] % k.shape[2]:
    raise ValueError(f"{fn}: query heads H={q.shape[2]} (q) must be a multiple of "
                     f"KV heads K={k.shape[2]} (k)")


def _check(q, k, v, spec, segment_ids, kv_segment_ids, q_offset, kv_lengths):
  if not isinstance(spec, AttentionSpec):
    raise TypeError(f"attention: spec must be an AttentionSpec, got {type(spec).__name__}")
  check_qkv("attention", q, k, v)
  b, t = q.shape[:2]
  s = k.shape[1]
  _check_shape("attention", "kv_lengths", kv_lengths, (b,))
  if q_offset is not None and jnp.ndim(q_offset) not in (0, 1):
    raise ValueError(f"attention: q_offset must be an int or [B]; got shape "
                     f"{jnp.shape(q_offset)}")
  if q_offset is not None and jnp.ndim(q_offset) == 1:
    _check_shape("attention", "q_offset", q_offset, (b,))
  if spec.kind in ("document", "packed"):
    if segment_ids is None:
      raise ValueError(f"attention: spec.kind={spec.kind!r} needs segment_ids [B, T]")
    _check_shape("attention", "segment_ids", segment_ids, (b, t))
    if kv_segment_ids is None and t != s:
      raise ValueError(f"attention: kv_segment_ids [B, S] are needed when T={t} != S={s}")
    _check_shape("attention", "kv_segment_ids", kv_segment_ids, (b, s))
    tiling.check_segment_ids("attention: segment_ids", segment_ids)
    if kv_segment_ids is not None:
      tiling.check_segment_ids("attention: kv_segment_ids", kv_segment_ids)
  elif segment_ids is not None or kv_segment_ids is not None:
    raise ValueError(f"attention: segment_ids are only used by kind='document' or 'packed', "
                     f"not {spec.kind!r}")


def _backend() -> str:
  return jax.default_backend()


def _resolve(fn: str, impl: str, **call) -> str:
  choice = dispatch.choose(impl, backend=_backend(), fn=fn, **call)
  if choice.fallback:
    warnings.warn(f"{fn}: {choice.reason}", stacklevel=3)
  dispatch.log_once(fn, choice)
  return choice.impl


def resolve_impl(impl: str, fn: str = "nsa", family: str = "nsa") -> str:
  """The implementation that runs for a family without a library path (NSA, decode).

  "auto" is Pallas on GPU and xla elsewhere; "pallas" falls back to "xla"
  with a warning where there is no GPU; "cudnn" is refused.
  """
  return _resolve(fn, impl, family=family)


def attention(q, k, v, spec: AttentionSpec = AttentionSpec(), *, impl: str = "auto",
              segment_ids=None, kv_segment_ids=None, q_offset=None, kv_lengths=None,
              scale=None, return_lse: bool = False):
  """Attention of q over k, v under `spec`'s mask.

  Args:
    q: [B, T, H, D]. k, v: [B, S, K, D].
    spec: the kind of attention (see AttentionSpec for the masks).
    impl: "auto", "reference", "xla", "pallas", "pallas_interpret", "cudnn".
      "auto" is xla off GPU; on GPU cuDNN where it computes this mask and the
      lse is not asked for, else Pallas (`kernels.dispatch`). One that cannot
      run here falls back to xla with a warning; "cudnn" where cuDNN cannot
      compute the call is an error.
    segment_ids: [B, T] non-decreasing document ids of the queries (document
      kind). Checked when concrete; under jit they cannot be checked and must
      be validated by the caller (decreasing ids give undefined results).
    kv_segment_ids: [B, S] ids of the keys; defaults to segment_ids (T == S).
    q_offset: int or [B]: absolute position of query 0 among the keys; default
      S - T, so the last query sits on the last key.
    kv_lengths: [B] number of valid keys per row; keys beyond are padding.
    scale: logit scale, default D ** -0.5.
    return_lse: also return the log-sum-exp [B, T, H] (float32).

  Returns out [B, T, H, D] (q's dtype), and lse when asked. Rows that see no
  key give out 0 and lse -inf. Every implementation is differentiable in q,
  k, v, also through lse.
  """
  _check(q, k, v, spec, segment_ids, kv_segment_ids, q_offset, kv_lengths)
  impl = _resolve("attention", impl, family="attention", spec=spec, needs_lse=return_lse,
                  q_shape=q.shape, k_shape=k.shape, dtype=q.dtype, q_offset=q_offset)
  if impl == "cudnn":
    return flash_library.attention(q, k, v, spec, implementation="cudnn",
                                   kv_lengths=kv_lengths, scale=scale)
  kwargs = dict(q_offset=q_offset, kv_lengths=kv_lengths, segment_ids=segment_ids,
                kv_segment_ids=kv_segment_ids, scale=scale)
  if impl == "reference":
    out, lse = flash_reference.attention(q, k, v, spec, **kwargs)
  elif impl == "xla":
    out, lse = flash_xla.attention(q, k, v, spec, **kwargs)
  else:
    out, lse = flash_pallas.attention(q, k, v, spec, interpret=impl == "pallas_interpret",
                                      **kwargs)
  return (out, lse) if return_lse else out


def decode_attention(q, k, v, lengths, *, spec: AttentionSpec = AttentionSpec(),
                     impl: str = "auto", scale=None, return_lse: bool = False,
                     q_offset=None, num_splits: int | None = None,
                     kv_head_major: bool = False):
  """A few new queries against a KV cache with per-sequence lengths (flash-decoding).

  Args:
    q: [B, Tq, H, D], the newest queries.
    k, v: [B, S, K, D] caches; keys at index >= lengths[b] are not attended.
    lengths: [B] valid cache entries per row (the queries' own keys included).
    spec: dense (causal or not), sliding (a window on the cache) or document
      (decoded tokens belong to the final segment, which sees every earlier
      key: the same as dense causal).
    impl: as for `attention`. "xla" computes the [B, H, Tq, S] scores in one
      piece while they are small (decode.xla.DIRECT_DECODE_MAX_SCORES), else
      runs an online softmax over the key tiles up to the longest row (cost ~
      the valid length); Pallas splits the cache into `num_splits` parts
      computed in parallel, each skipping its tiles beyond its row's length,
      merged by log-sum-exp.
    scale: logit scale, default D ** -0.5.
    return_lse: also return lse [B, Tq, H], so that attentions over KV that
      arrives in chunks merge exactly with `kernels.merge`.
    q_offset: int or [B], position of query 0 relative to key 0 of this
      cache; default lengths - Tq (the queries are the last Tq entries). A
      chunk of a longer cache passes the queries' position minus the chunk's start.
    num_splits: Pallas only: parts of the key axis (default: up to 16, at
      least 4 key tiles each).
    kv_head_major: k and v are laid out [B, K, S, D] (how a decode cache is
      best stored: each head's keys contiguous, so the direct path needs no
      transpose per step).

  Returns out [B, Tq, H, D] and, on request, lse [B, Tq, H].
  """
  k_in, v_in = k, v
  if kv_head_major:  # the other paths take [B, S, K, D]; unused swaps vanish under jit
    k, v = k.swapaxes(1, 2), v.swapaxes(1, 2)
  check_qkv("decode_attention", q, k, v)
  b, tq = q.shape[:2]
  lengths = jnp.asarray(lengths, jnp.int32)
  _check_shape("decode_attention", "lengths", lengths, (b,))
  if q_offset is None:
    q_offset = lengths - tq
  impl = resolve_impl(impl, "decode_attention", family="decode")
  causal = spec.causal or spec.kind != "dense"
  mask = tiling.Mask(causal=causal, window=spec.window if spec.kind == "sliding" else 0)
  if impl == "reference":
    out, lse = decode_reference.attention(q, k, v, spec, lengths=lengths, q_offset=q_offset,
                                          scale=scale)
  elif impl == "xla":
    out, lse = decode_xla.attention(q, k_in, v_in, mask, lengths=lengths, q_offset=q_offset,
                                    bk=spec.blocks("xla")[1], scale=scale,
                                    kv_head_major=kv_head_major)
  else:
    out, lse = decode_pallas.attention(q, k, v, mask, lengths=lengths, q_offset=q_offset,
                                       bk=spec.blocks("pallas")[1], scale=scale,
                                       interpret=impl == "pallas_interpret",
                                       num_splits=num_splits)
  return (out, lse) if return_lse else out



def _check_paged(q, k_pages, v_pages, page_table, lengths, q_offset):
  fn = "paged_attention"
  if q.ndim != 4 or k_pages.ndim != 4:
    raise ValueError(f"{fn}: q must be [B, T, H, D] and k_pages [P, K, S, D]; got "
                     f"q{q.shape} k_pages{k_pages.shape}")
  if v_pages.shape != k_pages.shape:
    raise ValueError(f"{fn}: v_pages{v_pages.shape} must have k_pages' shape {k_pages.shape}")
  if q.shape[3] != k_pages.shape[3]:
    raise ValueError(f"{fn}: head_dim of q{q.shape} and k_pages{k_pages.shape} differ")
  if q.shape[2] % k_pages.shape[1]:
    raise ValueError(f"{fn}: query heads H={q.shape[2]} (q) must be a multiple of "
                     f"KV heads K={k_pages.shape[1]} (k_pages)")
  b = q.shape[0]
  if jnp.ndim(page_table) != 2 or jnp.shape(page_table)[0] != b:
    raise ValueError(f"{fn}: page_table has shape {jnp.shape(page_table)}; expected [B={b}, M]")
  if not jnp.issubdtype(jnp.result_type(page_table), jnp.integer):
    raise ValueError(f"{fn}: page_table must hold integer page indices, not "
                     f"{jnp.result_type(page_table)}")
  _check_shape(fn, "lengths", lengths, (b,))
  if q_offset is not None and jnp.shape(q_offset) not in ((), (b,)):
    raise ValueError(f"{fn}: q_offset must be an int or [B={b}]; got shape "
                     f"{jnp.shape(q_offset)}")
  capacity = jnp.shape(page_table)[1] * k_pages.shape[2]
  if not isinstance(lengths, jax.core.Tracer) and (
      (lengths < 0).any() or (lengths > capacity).any()):
    raise ValueError(f"{fn}: lengths {lengths.tolist()} must lie in [0, M * S = {capacity}] "
                     "(the pages page_table names)")


def paged_attention(q, k_pages, v_pages, page_table, lengths, *,
                    spec: AttentionSpec = AttentionSpec(), impl: str = "auto", scale=None,
                    q_offset=None, return_lse: bool = False):
  """Queries against a KV cache kept in pages of one pool (decode and chunked prefill).

  Row b's cache position j lives in page page_table[b, j // S] at slot j % S.
  The result is exactly `decode_attention` on the gathered cache
  [B, K, M * S, D] with kv_head_major=True.

  Args:
    q: [B, T, H, D]: T = 1 for decode, a chunk of a prompt for prefill.
    k_pages, v_pages: [P, K, S, D], the pool of P pages of S positions (head
      major inside a page).
    page_table: [B, M] int32. Entries past ceil(lengths[b] / S) are never read
      into the result (point them at a scratch page); a page may appear in
      several rows (a shared prompt).
    lengths: [B] valid cache entries per row, the T queries' own keys
      included (written to the pages before the call); at most M * S
      (checked when concrete; under jit the caller keeps it so).
    spec: dense (causal or not), sliding (a window on the cache) or document
      (the same as dense causal, as in `decode_attention`).
    impl: "auto", "reference", "xla", "pallas", "pallas_interpret". "auto" is
      Pallas on GPU and xla elsewhere; "pallas" without a GPU falls back to
      xla with a warning. "xla" runs an online softmax over tiles of
      spec.block_k keys (whole pages; default paged.xla.TILE_KEYS) up to the
      longest row; Pallas walks each
      row's own pages (page size and head_dim powers of two of at least 16
      on GPU). Forward only: no implementation but the reference is
      differentiable.
    scale: logit scale, default D ** -0.5.
    q_offset: int or [B], position of query 0 relative to key 0; default
      lengths - T.
    return_lse: also return lse [B, T, H] (float32), for `kernels.merge`.

  Returns out [B, T, H, D] (q's dtype), and lse on request. A query that sees
  no key (a row of length 0) gives out 0 and lse -inf.
  """
  q, k_pages, v_pages = jnp.asarray(q), jnp.asarray(k_pages), jnp.asarray(v_pages)
  lengths = jnp.asarray(lengths, jnp.int32)
  _check_paged(q, k_pages, v_pages, page_table, lengths, q_offset)
  page_table = jnp.asarray(page_table, jnp.int32)
  if q_offset is None:
    q_offset = lengths - q.shape[1]
  q_offset = jnp.broadcast_to(jnp.asarray(q_offset, jnp.int32), lengths.shape)
  impl = resolve_impl(impl, "paged_attention", family="paged")
  causal = spec.causal or spec.kind != "dense"
  mask = tiling.Mask(causal=causal, window=spec.window if spec.kind == "sliding" else 0)
  args = (q, k_pages, v_pages, page_table)
  if impl == "reference":
    out, lse = paged_reference.attention(*args, spec, lengths=lengths, q_offset=q_offset,
                                         scale=scale)
  elif impl == "xla":
    tile_keys = spec.block_k or paged_xla.TILE_KEYS
    out, lse = paged_xla.attention(*args, mask, lengths=lengths, q_offset=q_offset,
                                   pages_per_tile=max(1, tile_keys // k_pages.shape[2]),
                                   scale=scale)
  else:
    out, lse = paged_pallas.attention(*args, mask, lengths=lengths, q_offset=q_offset,
                                      bq=spec.blocks("pallas")[0], scale=scale,
                                      interpret=impl == "pallas_interpret")
  return (out, lse) if return_lse else out
