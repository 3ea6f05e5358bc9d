"""The tfds builders of executable PR tasks: mined from a history (with the build report
beside the dataset), or read from a SWE-bench JSON-lines file.

This module must not mine (rlcode.swe.mining): it names, runs and stores.
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

from rlcode.data.git.repo import Git, checkout, is_bundle
from rlcode.data.tasks import TaskBuilder
from rlcode.swe import export
from rlcode.swe.config import SweConfig
from rlcode.swe.mining import SweResult, mine, split_by_time

REPORT_NAME = "build_report.json"


@dataclasses.dataclass(eq=False)
class SweTasksConfig(tfds.core.BuilderConfig):
  """A `SweConfig` as a tfds config; the name hashes every field that decides the tasks
  and the commit the branch resolves to (new commits make a new dataset)."""

  swe: SweConfig | None = None
  head: str = ""

  @classmethod
  def create(cls, swe: SweConfig) -> SweTasksConfig:
    head = Git(checkout(swe.source)).resolve(swe.branch)
    # No validation split leaves the name of the datasets made before there was one.
    args = {k: v for k, v in dataclasses.asdict(swe).items()
            if k != "workers" and not (k == "validation_fraction" and not v)}
    args["head"] = head
    if not is_bundle(swe.source):
      args["source"] = os.path.realpath(swe.source)
    digest = hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:12]
    base = posixpath.basename(swe.source.rstrip("/")) or "repo"
    slug = re.sub(r"[^A-Za-z0-9_]+", "_", base).strip("_") or "repo"
    return cls(name=f"{slug}-{digest}", version=SweTasks.VERSION,
               description=json.dumps(args, sort_keys=True), swe=swe, head=head)


class SweTasks(TaskBuilder):
  """Executable PR tasks (FAIL_TO_PASS / PASS_TO_PASS) mined from a git history."""

  VERSION = tfds.core.Version("1.0.0")

  def __init__(self, *, data_dir: str, swe: SweConfig | None = None,
               config: SweTasksConfig | None = None, mined: SweResult | None = None,
               cache_dir: str | None = None, **kwargs):
    """Makes the builder.

    Args:
      data_dir: where tfds writes the dataset.
      swe, config: what to mine: exactly one of them.
      mined: the result, already mined with this config at its head (the CLI prints its
        report); None mines when preparing.
      cache_dir: the miner's cache of runs and verdicts (rlcode.swe.mining).
      **kwargs: passed to tfds.
    """
    if (swe is None) == (config is None):
      raise ValueError("SweTasks: give exactly one of swe= and config=")
    if config is None:
      config = SweTasksConfig.create(swe)
    if not isinstance(config, SweTasksConfig) or config.swe is None:
      raise ValueError(f"SweTasks: config must be a SweTasksConfig from "
                       f"SweTasksConfig.create, got {config!r}")
    if mined is not None and mined.report["head"] != config.head:
      raise ValueError(f"SweTasks: mined= holds head {mined.report['head']}; this config "
                       f"needs head {config.head}")
    self._mined, self._cache_dir = mined, cache_dir
    super().__init__(data_dir=data_dir, config=config, **kwargs)

  def _split_tasks(self) -> Mapping[str, Any]:
    result = self._mined or mine(self.builder_config.swe, revision=self.builder_config.head,
                                 cache_dir=self._cache_dir)
    # During preparation data_dir is the temporary directory tfds renames into place.
    (epath.Path(self.data_dir) / REPORT_NAME).write_text(
        json.dumps(result.report, indent=2, sort_keys=True))
    return result.splits

  def build_report(self) -> dict[str, Any]:
    """The report written when the dataset was prepared."""
    path = epath.Path(self.data_dir) / REPORT_NAME
    if not path.exists():
      raise FileNotFoundError(f"{path} does not exist: call download_and_prepare() first")
    return json.loads(path.read_text())


@dataclasses.dataclass(eq=False)
class SweBenchFileConfig(tfds.core.BuilderConfig):
  """A SWE-bench JSON-lines file as a tfds config; the name hashes its bytes, the history
  it is read with and the split fraction."""

  path: str = ""
  repo: str | None = None
  test_fraction: float = 0.1

  @classmethod
  def create(cls, path: str, repo: str | None, test_fraction: float) -> SweBenchFileConfig:
    digest = hashlib.sha256(epath.Path(path).read_bytes()).hexdigest()
    args = {"file": digest, "repo": repo, "test_fraction": test_fraction}
    name = hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:12]
    return cls(name=f"swebench-{name}", version=SweBenchFile.VERSION,
               description=json.dumps({**args, "path": path}, sort_keys=True), path=path,
               repo=repo, test_fraction=test_fraction)


class SweBenchFile(TaskBuilder):
  """Executable PR tasks read from a SWE-bench JSON-lines file (rlcode.swe.export), split
  by PR time as the miner splits them."""

  VERSION = tfds.core.Version("1.0.0")

  def __init__(self, *, data_dir: str, path: str, repo: str | None = None,
               test_fraction: float = 0.1, **kwargs):
    super().__init__(data_dir=data_dir,
                     config=SweBenchFileConfig.create(path, repo, test_fraction), **kwargs)

  def _split_tasks(self) -> Mapping[str, Any]:
    c = self.builder_config
    return split_by_time(export.read(c.path, c.repo), c.test_fraction)
