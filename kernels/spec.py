"""What kind of attention to compute: a small frozen dataclass, hashable for jit."""

from __future__ import annotations

import dataclasses

KINDS = ("dense", "sliding", "document")


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
  Keys at j >= kv_lengths[b] are padding and never attended.

  block_q and block_k are the tile sizes of the blockwise and Pallas versions.
  """

  kind: str = "dense"
  causal: bool = True
  window: int = 0
  block_q: int = 64
  block_k: int = 64

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"AttentionSpec.kind={self.kind!r}; expected one of {KINDS}")
    if self.kind == "sliding" and self.window < 1:
      raise ValueError(f"AttentionSpec.window={self.window}: a sliding window "
                       "must be at least 1 (the query itself)")
    if self.kind in ("sliding", "document") and not self.causal:
      raise ValueError(f"AttentionSpec.causal=False is not defined for kind={self.kind!r}")
    for name in ("block_q", "block_k"):
      if getattr(self, name) < 1:
        raise ValueError(f"AttentionSpec.{name}={getattr(self, name)} must be positive")


DENSE_CAUSAL = AttentionSpec()
