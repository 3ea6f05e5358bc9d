"""The implementations the kernel tests compare with the dense reference here.

On CPU (CI) the Pallas kernel bodies run in the interpreter and the library
path (`jax.nn.dot_product_attention`) with implementation="xla". Where JAX
sees a GPU (run the tests with JAX_PLATFORMS=cuda), the compiled Triton
kernels and cuDNN are added, so the same cases and tolerances check the real
lowering.
"""

import jax

ON_GPU = jax.default_backend() == "gpu"
PALLAS = ("pallas_interpret", "pallas") if ON_GPU else ("pallas_interpret",)
LIBRARY = ("xla", "cudnn") if ON_GPU else ("xla",)
