"""The held-out split, read through one door that records each read.

    tasks = heldout.read(config, "held_out")       # the tasks, the read recorded
    flag = heldout.through_loop(config, "test")    # a training process's data.test_split

Every experiment that scores anything on a held-out split (rlcode.config.schema's
HELD_OUT_SPLITS: "test", "held_out") gets its tasks here, or hands the split to a
training process through `through_loop`; nothing else under experiments/ loads one. A
read is recorded in this process (`results.HELD_OUT_READS`): the split, the design's hash
(`design_hash`), the tree hash of rlcode/ at HEAD, the commit, whether tracked files
differed from it, the date and the command. The process's next `results.write` takes the
reads made since its previous write into that result's manifest under "held_out_reads",
after the reads that manifest already held; no later result gets them. When a read is of
a design none of the earlier reads of that result had, it says so in one line, printed
and kept under "held_out_after_change": a figure from such a read is a second look at
the split, after a change that may have been chosen by the first.

What this does not defend: a held-out read outside experiments/ (`rlcode train
--config.data.test_split=test` by hand), a result written somewhere else than results/,
a process that reads for two results before writing the first (every read goes to the
first written), and a change of code rather than config: the code's tree hash is recorded
with each read but not compared, since nearly every commit changes it.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import subprocess
import uuid

from experiments.lib import ROOT, results
from rlcode.config.schema import HELD_OUT_SPLITS
from rlcode.data import sources

# What places or repeats a run without changing what it learns: a design is the rest.
# (The seed: one design's seeds are its repetitions. The splits: where it is measured.)
NOT_DESIGN = ("workdir", "seed", "logging", "data.eval_split", "data.test_split",
              "data.max_eval_tasks", "data.data_dir", "warmstart.cache_dir",
              "train.progress_bar")


def read(config, split: str, data=None) -> list:
  """The tasks of the held-out `split` of config.data (or of `data`, a data section that
  replaces it; rlcode.data.sources.load), the read recorded for the manifest of the
  results this process writes."""
  data = config.data if data is None else data
  tasks = sources.load(data, _held_out(split))
  record(config, split, len(tasks), data=data)
  return tasks


def tasks(config, split: str, data=None) -> list:
  """The tasks of any `split` of config.data (or `data`): a held-out one through `read`."""
  if is_held_out(split):
    return read(config, split, data)
  return sources.load(config.data if data is None else data, split)


def through_loop(config, split: str = "test") -> str:
  """The override that has a training process of `config` evaluate the held-out `split` as
  its data.test_split (at its first and last evaluation), the read recorded as `read`'s."""
  record(config, _held_out(split), None)
  return f"--config.data.test_split={split}"


def record(config, split: str, count: int | None, data=None) -> dict:
  """Records a read of `split` by a run of `config` (with `data` for its data section when
  given; count: the tasks read, None when a training process reads them) and returns the
  record."""
  entry = {"id": uuid.uuid4().hex, "split": split, "design": design_hash(config, data),
           "tasks": count, "code": code_tree(), **results.git_state(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
               timespec="seconds"),
           "command": results.command_line()}
  results.HELD_OUT_READS.append(entry)
  return entry


def design_hash(config, data=None) -> str:
  """A 12-digit hash of a resolved config (with `data` for its data section when given)
  without the keys of NOT_DESIGN."""
  plain = results.plain_config(config)
  if data is not None:
    plain["data"] = results.plain_config(data)
  for dotted in NOT_DESIGN:
    *path, leaf = dotted.split(".")
    node = plain
    for part in path:
      node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
      node.pop(leaf, None)
  text = json.dumps(plain, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:12]


def code_tree() -> str:
  """The git tree hash of rlcode/ at HEAD ("unknown" without git or a repository)."""
  try:
    return subprocess.run(["git", "rev-parse", "HEAD:rlcode"], cwd=ROOT, capture_output=True,
                          text=True, check=True, timeout=60).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return "unknown"


def _held_out(split: str) -> str:
  if split not in HELD_OUT_SPLITS:
    raise ValueError(f"heldout: split {split!r} is not a held-out split "
                     f"{HELD_OUT_SPLITS}; read a tuning split with rlcode.data.sources")
  return split


def is_held_out(split: str) -> bool:
  """Whether `split` names a held-out split (read those through `read`)."""
  return split in HELD_OUT_SPLITS

