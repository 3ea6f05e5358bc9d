"""The data sources "swe" (executable PR tasks mined from config.data.repo) and "swebench"
(SWE-bench JSON lines at config.data.path), registered with rlcode.data.sources when
rlcode.swe is imported."""

from __future__ import annotations

import os

from rlcode.data import sources
from rlcode.errors import MissingInput
from rlcode.paths import resolve
from rlcode.swe.config import SweConfig


def swe_tasks(data_cfg, root: str):
  """The executable PR tasks of config.data.repo, config.data.swe's options."""
  from rlcode.swe.builder import SweTasks  # deferred: tfds, for runs that read these tasks
  options = data_cfg.swe.to_dict() if data_cfg.swe is not None else {}
  fields = {k: (tuple(v) if isinstance(v, list) else v) for k, v in options.items()}
  fields["source"] = resolve(data_cfg.repo)
  return SweTasks(data_dir=root, swe=SweConfig(**fields))


def swebench_file(data_cfg, root: str):
  """The SWE-bench JSON lines at config.data.path (against config.data.repo, if set)."""
  from rlcode.swe.builder import SweBenchFile  # deferred: tfds, for runs that read these tasks
  path = resolve(data_cfg.path)
  if not os.path.isfile(path):
    raise MissingInput(f"config.data.path={data_cfg.path!r}: no such file")
  return SweBenchFile(data_dir=root, path=path,
                      repo=resolve(data_cfg.repo) if data_cfg.repo else None)


sources.register("swe", swe_tasks)
sources.register("swebench", swebench_file)
