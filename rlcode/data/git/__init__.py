"""Mining git histories into diff tasks (SWE-RL style), and the tfds builder that stores them.

    from rlcode.data.git import GitDiffs, MiningConfig, mine
    result = mine(MiningConfig(source="data/repos/attrs.bundle", granularity="hunk"))

    rlcode mine data/repos/more-itertools.bundle --out /tmp/tfds --granularity pr

The rooms:
  repo.py      git through its CLI: the repository or cached bundle clone, logs, diffs, blobs
  config.py    MiningConfig, the granularities, skip reasons, languages, default excludes
  filters.py   the file-level tests: paths, generated text, decoding, duplicates
  mining.py    the miner: each first-parent commit one PR, filtered, split by time, reported
  units.py     a PR into pr/commit/file/hunk units, and the Task (with tests) of a unit
  excerpts.py  windows of large files and prompt excerpts around the changes
  builder.py   the tfds builder (GitDiffs) and its build report
  command.py   `rlcode mine`: mine, write the datasets, print the counts
"""

from rlcode.data.git.builder import REPORT_NAME, GitDiffs, GitDiffsConfig
from rlcode.data.git.config import (DEFAULT_EXCLUDE, DEFAULT_GENERATED_MARKERS, GRANULARITIES,
                                    LANGUAGES, SKIP_REASONS, MiningConfig)
from rlcode.data.git.mining import MiningResult, mine, pr_request
from rlcode.data.git.repo import (CACHE_ENV, BundleError, EmptyRepositoryError, GitError,
                                  NotARepositoryError, ShallowHistoryError, SourceError,
                                  UnknownBranchError, cache_root, checkout)

__all__ = [
    "CACHE_ENV", "DEFAULT_EXCLUDE", "DEFAULT_GENERATED_MARKERS", "GRANULARITIES", "LANGUAGES",
    "REPORT_NAME", "SKIP_REASONS", "BundleError", "EmptyRepositoryError", "GitDiffs",
    "GitDiffsConfig", "GitError", "MiningConfig", "MiningResult", "NotARepositoryError",
    "ShallowHistoryError", "SourceError", "UnknownBranchError", "cache_root", "checkout",
    "mine", "pr_request",
]
