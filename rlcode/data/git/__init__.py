"""Mining git histories into diff tasks (SWE-RL style), and the tfds builder that stores them.

    from rlcode.data.git import GitDiffs, MiningConfig, mine
    result = mine(MiningConfig(source="path/to/repo", granularity="hunk"))

The rooms:
  repo.py     git through its CLI: the repository or bundle, log, diffs, blobs
  config.py   MiningConfig, the skip reasons, languages and default excludes
  mining.py   the miner: filters each first-parent commit, splits by time, reports
  units.py    a change into commit/file/hunk units, excerpts, and the Task of a unit
  builder.py  the tfds builder (GitDiffs) and its build report
"""

from rlcode.data.git.builder import REPORT_NAME, GitDiffs, GitDiffsConfig
from rlcode.data.git.config import (DEFAULT_EXCLUDE, DEFAULT_GENERATED_MARKERS, GRANULARITIES,
                                    LANGUAGES, SKIP_REASONS, MiningConfig)
from rlcode.data.git.mining import MiningResult, mine
from rlcode.data.git.repo import EmptyRepositoryError, GitError, NotARepositoryError

__all__ = [
    "DEFAULT_EXCLUDE", "DEFAULT_GENERATED_MARKERS", "GRANULARITIES", "LANGUAGES",
    "REPORT_NAME", "SKIP_REASONS", "EmptyRepositoryError", "GitDiffs", "GitDiffsConfig",
    "GitError", "MiningConfig", "MiningResult", "NotARepositoryError", "mine",
]
