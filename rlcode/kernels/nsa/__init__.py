"""Native Sparse Attention (DeepSeek, arXiv 2502.11089): compression, selection, the
selected branch and their composition.

reference.py (dense masks, the truth), xla.py (selection and the blockwise
selected branch), pallas.py (the selected branch's kernels), branches.py (the
entry points below: checks, implementation choice, the gated sum, decoding).
"""

from rlcode.kernels.nsa.branches import compressed_attention, nsa_attention, nsa_decode, selected_attention, sliding_attention
from rlcode.kernels.nsa.xla import compression_windows, select_blocks

__all__ = ["compressed_attention", "compression_windows", "nsa_attention", "nsa_decode",
           "select_blocks", "selected_attention", "sliding_attention"]
