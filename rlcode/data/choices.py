"""User choices: which of k candidates was picked for a prompt, from JSON lines to tfds.

Each line is one choice object:
  prompt      string: what the candidates answer
  candidates  list of k >= 2 strings (completions of the prompt)
  chosen      integer in [0, k): the candidate the user picked
  extra       optional object; "features", when present, maps a feature name to a list
              of k numbers (ground truth per candidate: tests passed, diff similarity, ...),
              the inputs a reward model may take besides the text
  id          optional non-empty string, unique in the file (default: "line-N")
  split       optional "train", "validation" or "held_out"
Unknown fields, missing or mistyped fields, k < 2 and `chosen` out of range are BadInput
errors naming file:line, so a malformed row never trains a model silently.

Splits: a choice without a `split` field is held out when the hash of its prompt maps
below `held_out_fraction` (jsonl.held_out), so every choice on one prompt lands in the
same split; validation is only ever explicit.

This module knows no model and no simulator (rlcode.rm.simulate writes such files).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from rlcode.data.tasks import LocalDatasetInfo
from rlcode.data.jsonl import SPLITS, held_out, json_objects
from rlcode.errors import BadInput, UnknownKey

_REQUIRED = ("prompt", "candidates", "chosen")
_OPTIONAL = ("extra", "id", "split")


@dataclasses.dataclass(frozen=True)
class Choice:
  """One observed choice: `candidates[chosen]` was picked among the candidates."""

  id: str
  prompt: str
  candidates: tuple[str, ...]
  chosen: int
  extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def k(self) -> int:
    return len(self.candidates)

  def features(self, names: Sequence[str]) -> np.ndarray:
    """[k, len(names)] float32 ground-truth features; KeyError naming what is missing."""
    table = self.extra.get("features", {})
    missing = [n for n in names if n not in table]
    if missing:
      raise UnknownKey(f"choice {self.id!r} has no feature(s) {missing}; it has "
                       f"{sorted(table)}")
    return np.asarray([table[n] for n in names], np.float32).T.reshape(self.k, len(names))

  def to_example(self) -> dict[str, Any]:
    return {"id": self.id, "prompt": self.prompt, "candidates": list(self.candidates),
            "chosen": self.chosen, "extra": json.dumps(dict(self.extra), sort_keys=True)}

  @classmethod
  def from_example(cls, ex: Mapping[str, Any]) -> Choice:
    text = lambda v: v.decode("utf-8") if isinstance(v, bytes) else str(v)
    return cls(id=text(ex["id"]), prompt=text(ex["prompt"]),
               candidates=tuple(text(c) for c in ex["candidates"]), chosen=int(ex["chosen"]),
               extra=json.loads(text(ex["extra"])))


def _check_features(extra: dict, k: int, where: str) -> None:
  features = extra.get("features")
  if features is None:
    return
  if not isinstance(features, dict):
    raise BadInput(f"{where}: extra.features must be an object of name -> list of {k} "
                   f"numbers, got {type(features).__name__}")
  for name, values in features.items():
    ok = (isinstance(values, list) and len(values) == k
          and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                  for v in values))
    if not ok:
      raise BadInput(f"{where}: extra.features[{name!r}] must be a list of {k} finite "
                     f"numbers (one per candidate), got {values!r}"[:300])


def parse_choice(row: dict, where: str, default_id: str) -> tuple[Choice, str | None]:
  """(the Choice, its explicit split or None) of one JSON object; BadInput naming `where`."""
  missing = [k for k in _REQUIRED if k not in row]
  unknown = sorted(set(row) - set(_REQUIRED) - set(_OPTIONAL))
  if missing or unknown:
    raise BadInput(f"{where}: missing fields {missing}, unknown fields {unknown}; a choice "
                   f"has {list(_REQUIRED)} and optionally {list(_OPTIONAL)}")
  if not isinstance(row["prompt"], str):
    raise BadInput(f"{where}: field 'prompt' must be a string, got "
                   f"{type(row['prompt']).__name__}")
  candidates = row["candidates"]
  if not isinstance(candidates, list) or not all(isinstance(c, str) for c in candidates):
    raise BadInput(f"{where}: field 'candidates' must be a list of strings")
  if len(candidates) < 2:
    raise BadInput(f"{where}: a choice needs k >= 2 candidates, got {len(candidates)}")
  chosen = row["chosen"]
  if not isinstance(chosen, int) or isinstance(chosen, bool):
    raise BadInput(f"{where}: field 'chosen' must be an integer, got {type(chosen).__name__}")
  if not 0 <= chosen < len(candidates):
    raise BadInput(f"{where}: chosen={chosen} is out of range for {len(candidates)} "
                   f"candidates (0..{len(candidates) - 1})")
  extra = row.get("extra", {})
  if not isinstance(extra, dict):
    raise BadInput(f"{where}: field 'extra' must be an object, got {type(extra).__name__}")
  _check_features(extra, len(candidates), where)
  choice_id = row.get("id", default_id)
  if not isinstance(choice_id, str) or not choice_id:
    raise BadInput(f"{where}: field 'id' must be a non-empty string, got {choice_id!r}")
  split = row.get("split")
  if split is not None and split not in SPLITS:
    raise BadInput(f"{where}: split must be one of {SPLITS}, got {split!r}")
  return Choice(choice_id, row["prompt"], tuple(candidates), chosen, extra), split


def read_choices(path: str | Path, held_out_fraction: float = 0.2) -> dict[str, list[Choice]]:
  """Reads `path` into {split: [Choice, ...]} in file order (splits that hold none are left
  out). BadInput naming file:line for any malformed row or a repeated id."""
  if not 0.0 <= held_out_fraction <= 1.0:
    raise ValueError(f"held_out_fraction must be in [0, 1], got {held_out_fraction}")
  splits: dict[str, list[Choice]] = {s: [] for s in SPLITS}
  seen: set[str] = set()
  for where, row in json_objects(path):
    lineno = where.rsplit(":", 1)[1]
    choice, split = parse_choice(row, where, f"line-{lineno}")
    if choice.id in seen:
      raise BadInput(f"{where}: id {choice.id!r} is repeated")
    seen.add(choice.id)
    if split is None:
      split = "held_out" if held_out(choice.prompt, held_out_fraction) else "train"
    splits[split].append(choice)
  if not seen:
    raise BadInput(f"{path}: no choices")
  return {name: rows for name, rows in splits.items() if rows}


def write_choices(path: str | Path, rows: Sequence[tuple[Choice, str | None]]) -> None:
  """Writes (choice, split or None) pairs as JSON lines that `read_choices` reads back."""
  with Path(path).open("w", encoding="utf-8") as f:
    for choice, split in rows:
      row = {"id": choice.id, "prompt": choice.prompt, "candidates": list(choice.candidates),
             "chosen": choice.chosen, "extra": dict(choice.extra)}
      if split is not None:
        row["split"] = split
      f.write(json.dumps(row) + "\n")


class ChoicesBuilder(tfds.core.GeneratorBasedBuilder):
  """Choices from a JSON-lines file, written as array_record (no TensorFlow needed).

  The builder config is named after the file and a hash of its content and the
  held-out fraction, so different files never share a prepared dataset.
  """

  VERSION = tfds.core.Version("1.0.0")
  pkg_dir_path = None  # no metadata files next to this module

  def __init__(self, *, data_dir: str, path: str | Path, held_out_fraction: float = 0.2,
               **kwargs):
    self._path = Path(path)
    self._fraction = float(held_out_fraction)
    digest = hashlib.sha256(self._path.read_bytes())
    digest.update(repr(self._fraction).encode())
    stem = "".join(c if c.isalnum() else "_" for c in self._path.stem.lower())
    config = tfds.core.BuilderConfig(name=f"{stem}_{digest.hexdigest()[:12]}",
                                     description=f"{self._path} held_out={self._fraction}")
    kwargs.setdefault("file_format", "array_record")
    super().__init__(data_dir=data_dir, config=config, **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return LocalDatasetInfo(
        builder=self, description=(type(self).__doc__ or "").strip(),
        features=tfds.features.FeaturesDict({
            "id": tfds.features.Text(), "prompt": tfds.features.Text(),
            "candidates": tfds.features.Sequence(tfds.features.Text()),
            "chosen": tfds.features.Scalar(np.int32), "extra": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    del dl_manager  # the source is a local file
    return {name: self._generate_examples(rows)
            for name, rows in read_choices(self._path, self._fraction).items()}

  def _generate_examples(self, rows):
    for choice in rows:
      yield choice.id, choice.to_example()


def load_choices(builder: ChoicesBuilder, split: str) -> list[Choice]:
  """Prepares the builder if needed and returns `split` sorted by id."""
  builder.download_and_prepare()
  if split not in builder.info.splits:
    raise UnknownKey(f"{builder.name}: no split {split!r}; splits are "
                     f"{sorted(builder.info.splits)}")
  source = builder.as_data_source(split=split)
  return sorted((Choice.from_example(source[i]) for i in range(len(source))),
                key=lambda c: c.id)
