"""Masked attention: dense (causal or not), sliding window and document masks.

One flash kernel with a mask predicate (`kernels.tiling.block_mask`) serves
every kind: reference.py (dense mask, the truth), xla.py (blockwise, the CPU
default), pallas.py (our GPU kernels), library.py (`jax.nn.dot_product_attention`,
cuDNN on GPU for the masks it computes). Callers go through `kernels.attention`,
which picks among them (`kernels.dispatch`).
"""
