"""`ast.parse` (and `ast.literal_eval` of text) behind one process-wide lock.

CPython 3.11 keeps the AST constructor's recursion depth in per-interpreter state, so
two threads building trees at once can fail with "SystemError: AST constructor
recursion depth mismatch" (python/cpython#106905, fixed in later releases). rlcode
parses tests and programs from worker threads (the agent's environments score
episodes side by side, rewards run in pools), and an agent run crashed this way
while playing expert episodes on 8 threads. Parsing is a small share of that work,
so serialising it costs nothing measurable.

The lock cannot cover threads that are not ours: Python 3.11's traceback module
parses source lines to place its carets, so a library thread that formats an error
(orbax's, after a failed restore, was seen doing so) can still collide with a parse
here. Parsing is pure, so such a collision is retried.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()
_RETRIES = 3


def _locked(fn, *args):
  for attempt in range(_RETRIES + 1):
    with _LOCK:
      try:
        return fn(*args)
      except SystemError as e:
        if "recursion depth mismatch" not in str(e) or attempt == _RETRIES:
          raise


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
  """ast.parse(source, filename, mode), one thread at a time."""
  return _locked(ast.parse, source, filename, mode)


def literal_eval(text: str):
  """ast.literal_eval(text), one thread at a time (it parses `text` first)."""
  return _locked(ast.literal_eval, text)
