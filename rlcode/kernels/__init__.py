"""Attention kernels, by family, behind one entry point.

    out = kernels.attention(q, k, v, spec, impl="auto")
    out, lse = kernels.attention(q, k, v, spec, return_lse=True)
    out = kernels.decode_attention(q, k_cache, v_cache, lengths, spec=spec)
    out = kernels.paged_attention(q, k_pages, v_pages, page_table, lengths, spec=spec)

q is [B, T, H, D]; k and v are [B, S, K, D] with H a multiple of K (grouped-query).
Every implementation returns the log-sum-exp on request so that partial
attentions over disjoint key sets merge exactly (`merge`). Each family keeps
its dense-mask reference, blockwise XLA version and Pallas kernels side by
side: `kernels.flash` (masked attention: dense, sliding, document),
`kernels.decode` (a few queries against a cache), `kernels.paged` (the same
against a cache in pages of a shared pool), `kernels.nsa` (DeepSeek's
Native Sparse Attention, whose entry points live there). `kernels.dispatch`
decides which implementation serves a call (on GPU: cuDNN for the masks it
computes when no log-sum-exp is needed, our Pallas kernels elsewhere).
"""

from rlcode.kernels.api import IMPLS, attention, decode_attention, paged_attention, resolve_impl
from rlcode.kernels.lse import merge
from rlcode.kernels.spec import DENSE_CAUSAL, KINDS, PACKED, AttentionSpec, NSAConfig

__all__ = ["AttentionSpec", "DENSE_CAUSAL", "IMPLS", "KINDS", "NSAConfig", "PACKED", "attention",
           "decode_attention", "merge", "paged_attention", "resolve_impl"]
