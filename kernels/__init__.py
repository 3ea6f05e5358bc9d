"""Attention kernels: one entry point over dense-mask references, blockwise XLA
versions and Pallas kernels.

    out = kernels.attention(q, k, v, spec, impl="auto")
    out, lse = kernels.attention(q, k, v, spec, return_lse=True)

q is [B, T, H, D]; k and v are [B, S, K, D] with H a multiple of K (grouped-query).
Every implementation returns the log-sum-exp on request so that partial
attentions over disjoint key sets merge exactly (`merge`).
"""

from kernels.api import IMPLS, attention, decode_attention, merge
from kernels.spec import DENSE_CAUSAL, KINDS, AttentionSpec

__all__ = ["AttentionSpec", "DENSE_CAUSAL", "IMPLS", "KINDS", "attention",
           "decode_attention", "merge"]
