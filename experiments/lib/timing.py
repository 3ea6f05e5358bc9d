"""Timing a jitted program: the best (or the median) of a few runs after a compiling one."""

from __future__ import annotations

import statistics
import time


def _block(x):
  """x once its arrays are computed (jax.block_until_ready)."""
  import jax
  return jax.block_until_ready(x)


def _timed_calls(fn, repeats: int) -> list[float]:
  """Seconds of each of `repeats` calls of fn() after one untimed (compiling) call; each
  call waits for fn's arrays."""
  _block(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    _block(fn())
    times.append(time.perf_counter() - start)
  return times


def best_time(fn, repeats: int) -> float:
  """Seconds of the fastest of `repeats` calls of fn() after one untimed (compiling) call;
  each call waits for fn's arrays."""
  return min(_timed_calls(fn, repeats))


def median_time(fn, repeats: int) -> float:
  """As best_time, the median of the timed calls instead of their minimum."""
  return statistics.median(_timed_calls(fn, repeats))


def best_of(fn, repeats: int):
  """(seconds of the fastest of `repeats` calls of fn(), the last call's output), no
  compiling call first and no waiting on arrays (fn returns host values)."""
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    out = fn()
    times.append(time.perf_counter() - start)
  return min(times), out


def timed(fn, args, repeats: int, budget_s: float):
  """Compile fn for args, run it once, then the best of up to `repeats` runs within
  `budget_s` seconds (at least one).

  Returns ({"ms", "runs", "compile_s"}, the output of the last run).
  """
  import jax
  t0 = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  compile_s = time.perf_counter() - t0
  out = jax.block_until_ready(compiled(*args))
  times = []
  while len(times) < repeats and (not times or sum(times) < budget_s):
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - t0)
  return dict(ms=min(times) * 1e3, runs=len(times), compile_s=compile_s), out
