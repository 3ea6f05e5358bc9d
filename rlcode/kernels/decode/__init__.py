"""Decode attention: a few new queries against a KV cache with per-row lengths.

reference.py (dense mask), xla.py (one-piece scores while small, else
masked attention's blockwise version), pallas.py (split-K flash-decoding).
Callers go through `kernels.decode_attention`.
"""
