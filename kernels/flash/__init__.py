"""Masked attention: dense (causal or not), sliding window and document masks.

One flash kernel with a mask predicate (`kernels.tiling.block_mask`) serves
every kind: reference.py (dense mask, the truth), xla.py (blockwise, the CPU
default), pallas.py (the GPU kernels). Callers go through `kernels.attention`.
"""
