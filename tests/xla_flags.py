"""The XLA flags the suite compiles with, in one place (no JAX import here: conftest.py
reads this before JAX starts).

- Backend optimisation level 0 compiles the same computations without LLVM's expensive
  passes, in about half the time.
- `--xla_cpu_use_fusion_emitters=false` lowers fusions with XLA:CPU's elemental emitters
  instead of its MLIR fusion pipeline: the same computations, compiled in about 40% of the
  time again (a tiny GRPO run's programs: 7.7 s against 3.1 s).

Most of the suite's time is compiling small programs (tests/conftest.py). A value of
either flag already in the caller's XLA_FLAGS wins.
"""

import os

_DEFAULTS = {"--xla_backend_optimization_level": "0", "--xla_cpu_use_fusion_emitters": "false"}
_given = {f.split("=", 1)[0]: f for f in os.environ.get("XLA_FLAGS", "").split()}
COMPILE = tuple(_given.get(name, f"{name}={value}") for name, value in _DEFAULTS.items())


def for_subprocess(*flags: str) -> str:
  """XLA_FLAGS for a process a test starts: `flags` and the suite's compile flags."""
  return " ".join((*flags, *COMPILE))
