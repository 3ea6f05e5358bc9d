"""Where a relative input path points: the working directory, else the project root.

Data sets, tokenizers and histories are named by paths relative to the repository
(`data/repos/attrs.bundle`); a command run elsewhere still finds them. This module must
not open anything: it resolves names.
"""

from __future__ import annotations

import os

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def resolve(path: str) -> str:
  """`path` as given when it exists (or is absolute or remote), else under the project
  root when it exists there, else as given."""
  if "://" in path or os.path.isabs(path) or os.path.exists(path):
    return path
  candidate = os.path.join(PROJECT_ROOT, path)
  return candidate if os.path.exists(candidate) else path
