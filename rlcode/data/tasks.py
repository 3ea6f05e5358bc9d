"""The task type every reward and data source shares, and the tfds plumbing for it.

A task is a plain frozen dataclass. Datasets are tfds builders that write
array_record files (tfds builds and reads them without TensorFlow); every builder
here yields `Task`s and stores them with one fixed feature set, so any task source
loads through `load_tasks` the same way. This module must not know any particular
source (HumanEval, git history, documents): those are subclasses elsewhere.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from typing import Any

import tensorflow_datasets as tfds

from rlcode.data.extras import Extra, extra_dict, extra_for
from rlcode.errors import BadInput, UnknownKey


@dataclasses.dataclass(frozen=True)
class Task:
  """One unit of work for the policy.

  Attributes:
    id: stable, unique within its dataset.
    prompt: the text the policy is conditioned on.
    kind: what rewards understand it: "code" (tests), "diff" (SWE-RL), "section", "swe"
      (a real repository checked by its own tests), "verifiers" (a row of a verifiers
      environment, scored by its rubric), "gym" (a reasoning-gym question, scored by its
      generator's verifier).
    reference: a reference answer (solution, oracle section); may be empty.
    tests: test code for "code" tasks, run in the sandbox against the completion.
    entry_point: the function the tests call, for "code" tasks.
    extra: what the kind carries besides (rlcode.data.extras: CodeExtra, DiffExtra,
      SectionExtra, SweExtra, VerifiersExtra, GymExtra); given as a mapping, it is checked
      and made the kind's extra.
  """

  id: str
  prompt: str
  kind: str = "code"
  reference: str = ""
  tests: str = ""
  entry_point: str = ""
  extra: Extra = None

  def __post_init__(self):
    object.__setattr__(self, "extra", extra_for(self.kind, self.extra, f"task {self.id!r}"))

  def to_example(self) -> dict[str, str]:
    return {
        "id": self.id, "prompt": self.prompt, "kind": self.kind,
        "reference": self.reference, "tests": self.tests,
        "entry_point": self.entry_point,
        "extra": json.dumps(extra_dict(self.extra), sort_keys=True),
    }

  @classmethod
  def from_example(cls, ex: Mapping[str, Any]) -> Task:
    def text(v):
      return v.decode("utf-8") if isinstance(v, bytes) else str(v)
    fields = {k: text(ex[k]) for k in
              ("id", "prompt", "kind", "reference", "tests", "entry_point")}
    return cls(**fields, extra=json.loads(text(ex["extra"])))


_TEXT_FEATURES = ("id", "prompt", "kind", "reference", "tests", "entry_point", "extra")


class LocalDatasetInfo(tfds.core.DatasetInfo):
  """The DatasetInfo of a dataset made here: tfds never looks it up on its cloud bucket
  (its lookup, run for every builder not yet prepared, also leaves an empty temporary
  directory behind each time)."""

  def initialize_from_bucket(self) -> None:
    return None


class TaskBuilder(tfds.core.GeneratorBasedBuilder):
  """Base tfds builder for datasets of `Task`s.

  Subclasses set VERSION and implement `_split_tasks()` returning
  {split_name: iterable of Task}. Splits must be deterministic functions of the
  source and the builder's arguments.
  """

  VERSION = tfds.core.Version("1.0.0")
  # tfds looks for metadata files next to the builder's module; ours has none.
  pkg_dir_path = None

  def __init__(self, *, data_dir: str, **kwargs):
    kwargs.setdefault("file_format", "array_record")
    super().__init__(data_dir=data_dir, **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return LocalDatasetInfo(
        builder=self,
        description=(type(self).__doc__ or "").strip(),
        features=tfds.features.FeaturesDict(
            {k: tfds.features.Text() for k in _TEXT_FEATURES}),
    )

  def _split_tasks(self) -> Mapping[str, Any]:
    raise NotImplementedError(f"{type(self).__name__} must implement _split_tasks")

  def _split_generators(self, dl_manager):
    del dl_manager  # sources are local or read through epath/gcsfs by subclasses
    # A split with no tasks is not declared (tfds cannot write an empty one): asking for
    # it is then load_tasks' one-line "no split" error, not a tfds assertion.
    splits = {name: list(tasks) for name, tasks in self._split_tasks().items()}
    return {name: self._generate_examples(tasks) for name, tasks in splits.items() if tasks}

  def _generate_examples(self, tasks) -> Iterator[tuple[str, dict[str, str]]]:
    seen = set()
    for task in tasks:
      if task.id in seen:
        raise ValueError(f"{type(self).__name__}: duplicate task id {task.id!r}")
      seen.add(task.id)
      yield task.id, task.to_example()


def load_tasks(builder: TaskBuilder, split: str) -> list[Task]:
  """Prepares `builder` if needed and returns `split` as Tasks, sorted by id.

  tfds stores examples in hash order; sorting by id makes the order a property
  of the data, not of the file layout.

  Raises:
    BadInput: a split too large to prepare without TensorFlow (tfds keeps up
      to 1 GB of serialised examples in memory and spills the rest to disk
      through tf.io, which is not installed).
  """
  try:
    builder.download_and_prepare()
  except ModuleNotFoundError as e:
    if e.name != "tensorflow":
      raise
    raise BadInput(f"{builder.name}: a split serialises to over 1 GB, which tfds can only "
                   "write through TensorFlow (not installed); make the tasks smaller (for "
                   "mined tasks: fewer files carried, e.g. no tests_support) or fewer") from None
  if split not in builder.info.splits:
    raise UnknownKey(f"{builder.name}: no split {split!r}; "
                     f"splits are {sorted(builder.info.splits)}")
  source = builder.as_data_source(split=split)
  tasks = [Task.from_example(source[i]) for i in range(len(source))]
  return sorted(tasks, key=lambda t: t.id)
