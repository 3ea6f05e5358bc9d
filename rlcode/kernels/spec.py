"""What kind of attention to compute: small frozen dataclasses, hashable for jit.

This file only describes and validates sizes; it computes nothing.
"""

from __future__ import annotations

import dataclasses


KINDS = ("dense", "sliding", "document", "packed")

# Tile sizes when a spec leaves them unset. XLA on CPU: measured at T=8192,
# H=8, K=2, D=64 (experiments/speed/attention_scaling.py), 256 balances loop steps
# against a tile pair that stays in cache (512 is as fast forward, 1.4x slower
# backward); sliding windows want narrow query tiles, which visit fewer
# masked keys. Pallas on GPU (Triton) keeps a tile in registers/shared
# memory, so its tiles are small.
_XLA_BLOCKS = {"dense": (256, 256), "sliding": (128, 256), "document": (256, 256),
               "packed": (256, 256)}
_PALLAS_BLOCKS = (64, 64)


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
  """The kind of attention and its sizes.

  Masking, for a query at absolute position p (see `kernels.attention`) and a
  key at position j of the same row:
    dense:    causal: j <= p; non-causal: every valid key.
    sliding:  p - window < j <= p (the query and the window-1 tokens before it;
              FlashAttention's window_size=(window-1, 0)).
    document: j <= p and (seg(j) == seg(p) or seg(p) is the row's final
              segment): documents attend causally within themselves, the final
              segment (the query) attends to every document and to itself.
              The final segment is the largest key segment id of the row.
    packed:   j <= p and seg(j) == seg(p): sequences packed into one row, each
              attending causally within itself (rlcode.rl.packing).
  Keys at j >= kv_lengths[b] are padding and never attended.

  block_q and block_k are the tile sizes of the blockwise and Pallas versions
  (queries per tile, keys per tile; they need not divide the lengths, inputs
  are padded internally). None picks the implementation's default
  (`blocks`): on GPU, Triton needs powers of two.
  """

  kind: str = "dense"
  causal: bool = True
  window: int = 0
  block_q: int | None = None
  block_k: int | None = None

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"AttentionSpec.kind={self.kind!r}; expected one of {KINDS}")
    if self.kind == "sliding" and self.window < 1:
      raise ValueError(f"AttentionSpec.window={self.window}: a sliding window "
                       "must be at least 1 (the query itself)")
    if self.kind != "sliding" and self.window:
      raise ValueError(f"AttentionSpec.window={self.window} is only meaningful for "
                       f"kind='sliding', not {self.kind!r}")
    if self.kind in ("sliding", "document", "packed") and not self.causal:
      raise ValueError(f"AttentionSpec.causal=False is not defined for kind={self.kind!r}")
    for name in ("block_q", "block_k"):
      value = getattr(self, name)
      if value is not None and value < 1:
        raise ValueError(f"AttentionSpec.{name}={value} must be positive")

  def blocks(self, impl: str) -> tuple[int, int]:
    """(block_q, block_k) for implementation family "xla" or "pallas"."""
    default = _XLA_BLOCKS[self.kind] if impl == "xla" else _PALLAS_BLOCKS
    return (self.block_q or default[0], self.block_k or default[1])


DENSE_CAUSAL = AttentionSpec()
PACKED = AttentionSpec(kind="packed")


@dataclasses.dataclass(frozen=True)
class NSAConfig:
  """Sizes of DeepSeek's Native Sparse Attention (arXiv 2502.11089).

  Attributes:
    block_cmp: l, keys per compressed token; compressed token i covers key
      positions [i * stride_cmp, i * stride_cmp + block_cmp).
    stride_cmp: d, the stride between compressed tokens.
    block_sel: l', keys per selection block; block j covers [j*l', (j+1)*l').
    num_sel: n, selection blocks per query, always including the first block
      and the `num_local` blocks ending at the query's own block.
    num_local: the local blocks always selected (the query's block and the
      ones just before it).
    window: w of the sliding branch.
    compress_hidden: hidden width of the compression MLP (the model layer's).
    block_q: queries per tile of every NSA pass (compressed, scoring,
      selected); None picks per-pass defaults (on CPU 128, 32 and 4: the
      selected branch gathers n*l' keys per query and wants small tiles).
  """

  block_cmp: int = 32
  stride_cmp: int = 16
  block_sel: int = 64
  num_sel: int = 16
  num_local: int = 2
  window: int = 512
  compress_hidden: int = 256
  block_q: int | None = None

  def __post_init__(self):
    for name in ("block_cmp", "stride_cmp", "block_sel", "num_sel", "window",
                 "compress_hidden"):
      if getattr(self, name) < 1:
        raise ValueError(f"NSAConfig.{name}={getattr(self, name)} must be positive")
    if self.num_local < 0:
      raise ValueError(f"NSAConfig.num_local={self.num_local} must be >= 0")
    if self.block_q is not None and self.block_q < 1:
      raise ValueError(f"NSAConfig.block_q={self.block_q} must be positive")
    if self.block_cmp % self.stride_cmp:
      raise ValueError(f"NSAConfig.block_cmp={self.block_cmp} must be a multiple of "
                       f"stride_cmp={self.stride_cmp} (the paper's d | l)")
    if self.block_sel % self.stride_cmp:
      raise ValueError(f"NSAConfig.block_sel={self.block_sel} must be a multiple of "
                       f"stride_cmp={self.stride_cmp} (eq. 9 needs d | l')")
    if self.block_sel < self.block_cmp:
      raise ValueError(f"NSAConfig.block_sel={self.block_sel} must be >= "
                       f"block_cmp={self.block_cmp} (eq. 9 needs l <= l')")
    if self.num_sel < 1 + self.num_local:
      raise ValueError(f"NSAConfig.num_sel={self.num_sel} must leave room for the "
                       f"first block and num_local={self.num_local} local blocks")

  def num_compressed(self, t: int) -> int:
    """Compressed tokens of a length-t sequence (blocks that fit entirely)."""
    return max(0, (t - self.block_cmp) // self.stride_cmp + 1)

  def num_blocks(self, t: int) -> int:
    """Selection blocks covering a length-t sequence (the last may be partial)."""
    return cdiv(t, self.block_sel)


def cdiv(n, m):
  """Ceiling of n / m for non-negative integers (Python ints or integer arrays)."""
  return -(-n // m)


def round_up(n, m):
  """n rounded up to a multiple of m."""
  return cdiv(n, m) * m
