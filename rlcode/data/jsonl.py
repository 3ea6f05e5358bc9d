"""Code tasks from a JSON-lines file of problems, split deterministically.

Each line is one problem object:
  id           unique, non-empty string
  prompt       string
  tests        string, or a list of strings (joined with newlines; see
               rlcode.sandbox.plan_tests for how tests are counted)
  entry_point  string ("" for script-style tests that call functions by name)
  reference    string, a reference solution (assembled like a completion)
  family       optional string: problems of one family share a split
  split        optional "train", "validation" or "held_out": overrides the hash
  extra        optional object, the task's rlcode.data.extras.CodeExtra fields (for
               example {"assemble": "completion"} or {"tests_format": "script"})
Unknown fields are errors, so a misspelt key cannot silently drop data.

Splits: "train" and "held_out", and "validation" when some problem names it. A
problem without a `split` field is held out when sha256(family or id) maps below
`held_out_fraction`, so the split of a problem never changes when others are added
or removed, and variants of one family never straddle train and held-out. A
validation split (for tuning, so that held_out is reported once) is only ever
explicit in the file.

This module knows no particular problem set; the embedded sets live in data/.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import tensorflow_datasets as tfds

from rlcode.data.extras import extra_for
from rlcode.data.tasks import Task, TaskBuilder
from rlcode.errors import BadInput, MissingInput

SPLITS = ("train", "validation", "held_out")
_REQUIRED = ("id", "prompt", "tests", "entry_point", "reference")
_OPTIONAL = ("family", "split", "extra")


def json_objects(path: str | Path) -> Iterator[tuple[str, dict]]:
  """(where, object) for each non-blank line; `where` is "path:line". The one reader of
  JSON-lines inputs (tasks, choices, completions): each line is decoded on its own, so a
  problem names its line.

  Raises BadInput (a ValueError) naming the line for invalid UTF-8, bad JSON or a line
  that is not an object; MissingInput for a file that is not there.
  """
  path = Path(path)
  if not path.is_file():
    raise MissingInput(f"{path}: no such file")
  with path.open("rb") as f:
    for lineno, raw in enumerate(f, 1):
      where = f"{path}:{lineno}"
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise BadInput(f"{where}: not UTF-8 (byte {raw[e.start]:#04x} at column "
                       f"{e.start + 1})") from None
      if not line.strip():
        continue
      try:
        row: Any = json.loads(line)
      except json.JSONDecodeError as e:
        raise BadInput(f"{where}: not valid JSON: {e.msg} (column {e.colno})") from None
      except (ValueError, RecursionError) as e:  # an integer too long, nesting too deep
        raise BadInput(f"{where}: not valid JSON: {str(e)[:120]}") from None
      if not isinstance(row, dict):
        raise BadInput(f"{where}: expected a JSON object, got {type(row).__name__}")
      yield where, row


def held_out(key: str, fraction: float) -> bool:
  """Whether the problem (or family) named `key` belongs to the held-out split."""
  digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
  return int(digest[:15], 16) / 16**15 < fraction


def _text(row: dict, key: str, where: str) -> str:
  value = row[key]
  if not isinstance(value, str):
    raise BadInput(f"{where}: field {key!r} must be a string, got {type(value).__name__}")
  return value


def read_jsonl_tasks(path: str | Path, held_out_fraction: float) -> dict[str, list[Task]]:
  """Reads `path` into {"train": [...], "held_out": [...]} (and "validation" when a row
  names it), each in file order.

  Raises:
    ValueError: naming the file and line, for bad JSON, missing, unknown or
      mistyped fields, duplicate ids, or a bad split value.
  """
  if not 0.0 <= held_out_fraction <= 1.0:
    raise ValueError(f"held_out_fraction must be in [0, 1], got {held_out_fraction}")
  path = Path(path)
  splits: dict[str, list[Task]] = {s: [] for s in SPLITS}
  seen: set[str] = set()
  for where, row in json_objects(path):
    missing = [k for k in _REQUIRED if k not in row]
    unknown = sorted(set(row) - set(_REQUIRED) - set(_OPTIONAL))
    if missing or unknown:
      raise BadInput(f"{where}: missing fields {missing}, unknown fields {unknown}")
    task_id = _text(row, "id", where)
    if not task_id or task_id in seen:
      raise BadInput(f"{where}: id {task_id!r} is empty or repeated")
    seen.add(task_id)
    tests = row["tests"]
    if isinstance(tests, list) and all(isinstance(t, str) for t in tests):
      tests = "\n".join(tests)
    if not isinstance(tests, str) or not tests.strip():
      raise BadInput(f"{where}: tests must be a non-empty string or list of strings")
    if not isinstance(row.get("extra", {}), dict):
      raise BadInput(f"{where}: extra must be an object")
    extra = dict(row.get("extra", {}))
    family = row.get("family")
    if family is not None:
      extra["family"] = _text(row, "family", where)
    split = row.get("split")
    if split is None:
      split = "held_out" if held_out(family or task_id, held_out_fraction) else "train"
    elif split not in SPLITS:
      raise BadInput(f"{where}: split must be one of {SPLITS}, got {split!r}")
    splits[split].append(Task(
        id=task_id, prompt=_text(row, "prompt", where), kind="code",
        reference=_text(row, "reference", where), tests=tests,
        entry_point=_text(row, "entry_point", where), extra=extra_for("code", extra, where)))
  if not seen:
    raise BadInput(f"{path}: no problems")
  if not splits["validation"]:
    del splits["validation"]
  return splits


class JsonlTasks(TaskBuilder):
  """Code tasks from a JSON-lines file, split into "train" and "held_out".

  Args:
    path: the JSON-lines file (defaults to the class attribute PATH, so a set
      can be a subclass with PATH fixed).
    held_out_fraction: share of problems (or families) held out by hash.
    data_dir: where tfds writes the prepared array_record files.

  The builder config is named after the file's name and a hash of its content
  and the fraction, so different files or fractions never share a cache.
  """

  VERSION = tfds.core.Version("1.0.0")
  PATH: str | None = None
  HELD_OUT_FRACTION = 0.2

  def __init__(self, *, data_dir: str, path: str | Path | None = None,
               held_out_fraction: float | None = None, **kwargs):
    path = path if path is not None else self.PATH
    if path is None:
      raise ValueError(f"{type(self).__name__}: give path= or set PATH")
    self._path = Path(path)
    self._fraction = (self.HELD_OUT_FRACTION if held_out_fraction is None
                      else float(held_out_fraction))
    digest = hashlib.sha256(self._path.read_bytes())
    digest.update(repr(self._fraction).encode())
    stem = "".join(c if c.isalnum() else "_" for c in self._path.stem.lower())
    config = tfds.core.BuilderConfig(name=f"{stem}_{digest.hexdigest()[:12]}",
                                     description=f"{self._path} held_out={self._fraction}")
    super().__init__(data_dir=data_dir, config=config, **kwargs)

  def _split_tasks(self):
    return read_jsonl_tasks(self._path, self._fraction)
