"""The XLA flags the suite compiles with, in one place (no JAX import here: conftest.py
reads this before JAX starts).

Level 0 compiles the same computations without LLVM's expensive passes, in about half
the time; most of the suite's time is compiling small programs (tests/conftest.py).
A level already in the caller's XLA_FLAGS wins.
"""

import os

_LEVEL = "--xla_backend_optimization_level"
COMPILE = next((f for f in os.environ.get("XLA_FLAGS", "").split() if f.startswith(_LEVEL)),
               f"{_LEVEL}=0")


def for_subprocess(*flags: str) -> str:
  """XLA_FLAGS for a process a test starts: `flags` and the suite's compile level."""
  return " ".join((*flags, COMPILE))
