"""Compiling a server's engine programs before requests need them.

An engine compiles a program per bucketed shape on first use: rows, page-table width and
chunk length are powers of two, so a stream of requests meets a few dozen shapes, and on
a CPU each costs a second or more to compile. A benchmark of 16 concurrent clients spent
most of its time compiling the shapes 16 rows first met. `shapes(engine)` lists the shapes
an unconstrained request of one candidate can meet (a grammar's masked programs and the
page copies of n > 1 candidates still compile on first use), the likeliest first (decode steps of few rows, then prefill chunks of
few rows); the engine's loop compiles one whenever it is idle (`Engine(warmup=True)`, what
`rlcode serve` runs), so a request waits for at most one compile that is not its own.

A warm-up call runs the real program on the engine's own pools with every row invalid:
its writes go to the scratch page, which no row reads. This module must not know about
requests or HTTP.
"""

from __future__ import annotations

import logging

import jax
import numpy as np

from rlcode.engine import programs
from rlcode.engine.rows import bucket
from rlcode.models.paged import SCRATCH_PAGE

log = logging.getLogger("rlcode.engine")


def _powers(lo: int, hi: int) -> list[int]:
  out, n = [], lo
  while n <= hi:
    out.append(n)
    n *= 2
  return out


def shapes(engine, min_rows: int, min_pages: int, min_chunk: int) -> list[tuple]:
  """("decode", rows, width), ("forward", rows, chunk, width) and ("sample", rows, chunk,
  width) (the first tokens' sampling, after a forward of that shape): every
  shape the engine's steps can call, fewest rows first (a chunk of prefill may be as long
  as the budget beside rows of one token each, so every pair of rows and chunk occurs)."""
  rows = _powers(min_rows, max(bucket(engine.max_rows), min_rows))
  widths = _powers(min_pages, max(bucket(engine.max_pages), min_pages))
  widths = [w for w in widths if w <= bucket(engine.max_pages)] or [bucket(engine.max_pages)]
  budget = bucket(engine.prefill_tokens)
  chunks = _powers(min_chunk, max(budget, min_chunk))
  out = []
  for r in rows:
    out += [("decode", r, w) for w in widths]
  for r in rows:
    out += [("forward", r, t, w) for t in chunks for w in widths]
    out.append(("sample", r, chunks[0], widths[0]))
  return out


def run_next(engine) -> None:
  """The next shape of `engine.warm`, taken off the list once it ran (an empty list means
  every listed shape is compiled); a failure is logged and ends the warm-up (never fatal:
  a shape not compiled here compiles when a request meets it), the pools rebuilt if the
  failed call held them."""
  try:
    run(engine, engine.warm[0])
    engine.warm.popleft()
  except Exception:
    log.exception("an engine warm-up call failed")
    engine.warm.clear()
    if any(x.is_deleted() for x in engine.pools[0]):
      engine.pools = programs.zero_pools(engine.cfg, engine.pool.num_pages, engine.page_size,
                                         engine.mesh)


def run(engine, shape: tuple) -> None:
  """One call of `shape`'s program with every row invalid (compiled on first use)."""
  kind, r = shape[0], shape[1]
  zeros = np.zeros(r, np.int32)
  params = (np.zeros(r, np.uint32), np.zeros(r, np.int32), np.zeros(r, np.int32),
            np.ones(r, np.float32), np.zeros(r, np.int32), np.ones(r, np.float32))
  width = shape[-1]
  table = np.full((r, width), SCRATCH_PAGE, np.int32)
  if kind == "sample":  # on a prefill's logits, picked by row as the engine picks them
    engine.pools, logits, _ = engine.programs.forward(
        engine.state, engine.pools, np.zeros((r, shape[2]), np.int32), table, zeros, zeros)
    jax.block_until_ready(programs.sample(logits[np.zeros(r, np.int32)], *params, None))
    return
  if kind == "decode":
    engine.pools, *out = engine.programs.decode(engine.state, engine.pools, zeros, table,
                                                zeros, zeros, *params, None)
  else:
    tokens = np.zeros((r, shape[2]), np.int32)
    engine.pools, *out = engine.programs.forward(engine.state, engine.pools, tokens, table,
                                                 zeros, zeros)
  jax.block_until_ready(out)
