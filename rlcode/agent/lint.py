"""Linting a workspace's Python files with ruff, on the host: its messages as text.

ruff parses; it never imports or runs what it checks, so it reads the policy's files on
the host the way `ast.parse` does elsewhere, with no sandbox. It runs with `--isolated`
(no configuration file of the host or the workspace is read), over the text given on
stdin, with the rules that name errors rather than style (`RULES`: syntax errors and
pyflakes' undefined names, unused imports and the like), each file under a wall clock.

This module must not know about sessions or tasks: it checks texts.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping

RULES = "E9,F"
_SECONDS = 20
_MESSAGE = re.compile(r"^.+:\d+:\d+: ")


class LintUnavailable(RuntimeError):
  """ruff is not installed."""


def ruff_binary() -> str:
  try:
    from ruff import find_ruff_bin
  except ImportError:
    raise LintUnavailable("ruff is not installed") from None
  try:
    return str(find_ruff_bin())
  except FileNotFoundError as e:
    raise LintUnavailable(f"no ruff binary: {e}") from None


def check(files: Mapping[str, str]) -> list[str]:
  """ruff's messages ("path:line:col: CODE text") for every file, in path order.

  Raises:
    LintUnavailable: ruff is not installed.
  """
  binary = ruff_binary()
  out = []
  for path in sorted(files):
    try:
      r = subprocess.run([binary, "check", "--isolated", "--no-cache", "--select", RULES,
                          "--output-format", "concise", "--stdin-filename", path, "-"],
                         input=files[path].encode("utf-8", "surrogateescape"),
                         capture_output=True, timeout=_SECONDS, check=False)
    except subprocess.TimeoutExpired:
      out.append(f"{path}: the linter timed out")
      continue
    text = r.stdout.decode("utf-8", "replace")
    out += [line for line in text.splitlines() if _MESSAGE.match(line)]
  return out
