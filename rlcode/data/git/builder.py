"""The tfds builder of mined diff tasks, with the build report beside the dataset.

This module must not mine (rlcode.data.git.mining): it names, runs and stores.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import posixpath
import re
from collections.abc import Mapping
from typing import Any

import tensorflow_datasets as tfds
from etils import epath

from rlcode.data.git.config import MiningConfig
from rlcode.data.git.mining import MiningResult, mine
from rlcode.data.git.repo import Git, checkout, is_bundle
from rlcode.data.tasks import TaskBuilder

REPORT_NAME = "build_report.json"


@dataclasses.dataclass(eq=False)
class GitDiffsConfig(tfds.core.BuilderConfig):
  """A `MiningConfig` as a tfds config; the name hashes every argument.

  The branch is resolved to its commit (a bundle through its cached clone,
  rlcode.data.git.repo), and that commit is part of the hash too: new commits
  on the branch make a new dataset rather than reuse a stale one.
  """

  mining: MiningConfig | None = None
  head: str = ""

  @classmethod
  def create(cls, mining: MiningConfig, cache_dir: str | None = None) -> GitDiffsConfig:
    head = Git(checkout(mining.source, cache_dir)).resolve(mining.branch)
    args = {**dataclasses.asdict(mining), "head": head}
    if not is_bundle(mining.source):
      args["source"] = os.path.realpath(mining.source)
    digest = hashlib.sha256(
        json.dumps(args, sort_keys=True).encode()).hexdigest()[:12]
    base = posixpath.basename(mining.source.rstrip("/")) or "repo"
    slug = re.sub(r"[^A-Za-z0-9_]+", "_", base).strip("_") or "repo"
    return cls(name=f"{slug}-{digest}", version=GitDiffs.VERSION,
               description=json.dumps(args, sort_keys=True),
               mining=mining, head=head)


class GitDiffs(TaskBuilder):
  """Diff tasks mined from a git history (SWE-RL style), split by commit time."""

  VERSION = tfds.core.Version("1.0.0")

  def __init__(self, *, data_dir: str, mining: MiningConfig | None = None,
               config: GitDiffsConfig | None = None, mined: MiningResult | None = None,
               cache_dir: str | None = None, **kwargs):
    """Makes the builder.

    Args:
      data_dir: where tfds writes the dataset.
      mining, config: what to mine: exactly one of them.
      mined: the tasks, already mined with this config at its head (the CLI
        mines once for several granularities); None mines when preparing.
      cache_dir: where bundle clones are cached (rlcode.data.git.repo).
      **kwargs: passed to tfds.
    """
    if (mining is None) == (config is None):
      raise ValueError("GitDiffs: give exactly one of mining= and config=")
    if config is None:
      config = GitDiffsConfig.create(mining, cache_dir)
    if not isinstance(config, GitDiffsConfig) or config.mining is None:
      raise ValueError(f"GitDiffs: config must be a GitDiffsConfig from "
                       f"GitDiffsConfig.create, got {config!r}")
    if mined is not None and (mined.report["head"] != config.head
                              or config.mining.granularity not in mined.by_granularity):
      raise ValueError(f"GitDiffs: mined= holds head {mined.report['head']} and "
                       f"granularities {sorted(mined.by_granularity)}; this config needs "
                       f"head {config.head} at {config.mining.granularity!r}")
    self._mined, self._cache_dir = mined, cache_dir
    super().__init__(data_dir=data_dir, config=config, **kwargs)

  def _split_tasks(self) -> Mapping[str, Any]:
    result = self._mined or mine(self.builder_config.mining,
                                 revision=self.builder_config.head,
                                 cache_dir=self._cache_dir)
    granularity = self.builder_config.mining.granularity
    # A result mined for several granularities reports this dataset's own.
    report = {**result.report, "granularity": granularity,
              "tasks": result.report["tasks_by_granularity"][granularity]}
    # During preparation data_dir is the temporary directory tfds renames into
    # place on success, so the report lands next to the dataset's files.
    (epath.Path(self.data_dir) / REPORT_NAME).write_text(
        json.dumps(report, indent=2, sort_keys=True))
    return result.by_granularity[granularity]

  def build_report(self) -> dict[str, Any]:
    """The report written when the dataset was prepared."""
    path = epath.Path(self.data_dir) / REPORT_NAME
    if not path.exists():
      raise FileNotFoundError(f"{path} does not exist: call "
                              "download_and_prepare() first")
    return json.loads(path.read_text())
