"""`ast.parse` behind one process-wide lock.

CPython 3.11 keeps the AST constructor's recursion depth in per-interpreter state, so
two threads building trees at once can fail with "SystemError: AST constructor
recursion depth mismatch" (python/cpython#106905, fixed in later releases). rlcode
parses tests and programs from worker threads (the agent's environments score
episodes side by side, rewards run in pools), and an agent run crashed this way
while playing expert episodes on 8 threads. Parsing is a small share of that work,
so serialising it costs nothing measurable.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
  """ast.parse(source, filename, mode), one thread at a time."""
  with _LOCK:
    return ast.parse(source, filename, mode)
