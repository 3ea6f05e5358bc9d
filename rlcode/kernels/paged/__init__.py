"""Paged attention: queries against a KV cache stored in fixed-size pages of a shared pool.

reference.py (gather the pages into a dense cache, then decode's reference),
xla.py (an online softmax over tiles of pages up to the longest row),
pallas.py (one program per row, KV head and query block, walking the row's
pages through its page table). Callers go through `kernels.paged_attention`.
"""
