"""rlcode: reinforcement learning of code models in JAX.

One Python process drives a device mesh; the policy, the attention kernels and
generation are sharded over it. See README.md for the map of the package.
"""

__version__ = "0.1.0"
