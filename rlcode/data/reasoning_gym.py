"""Question/answer tasks from reasoning-gym's procedural generators (config.data.source
"reasoning_gym", config.data.gym: rlcode.data.gym_config.GymConfig), kind "gym".

Each entry of a generator (reasoning_gym.create_dataset(name, seed=, size=, **kwargs)[i]:
a dict of question, answer and metadata) becomes a Task:
  id         f"gym/{name}/{split}/{i:07d}" (i: the entry's index in its split's dataset)
  prompt     the question, then "\\nAnswer:" (PLAIN_SUFFIX; rlcode.data.chat_prompts asks
             it through a chat template instead, answer in <answer> tags)
  reference  " " + the answer, what a warm start trains on ("" when the generator has no
             single answer and checks one by its metadata)
  extra      GymExtra: the name, the dataset's keywords, i, and the entry (tagged JSON)
The "gym" reward (rlcode.rewards.gym) scores a completion by that generator's own
score_answer.

Splits: "train", "validation" and "held_out" (a split of size 0 is not made), each of
`*_size` entries per generator, deterministic in the section and reasoning-gym's version.
A split's dataset has the seed (3 * gym.seed + k) * SEED_STRIDE (k = 0, 1, 2 for
held_out, validation, train) and is read from index 0 on; most generators draw entry i
from Random(seed + i), and for them the splits' random streams never meet (a split reads
fewer than SEED_STRIDE entries). Questions are kept apart by their text whatever a
generator does: the splits are filled in the order held_out, validation, train, generator
by generator, and an entry whose question an earlier entry already has (in any split, of
any generator) is skipped; so no question is in two splits nor twice in one, and held_out
does not change with the other splits' sizes. A generator that cannot give enough new
questions in 4 * size + 64 entries is one BadInput line.

JSON: an entry's metadata may hold tuples and mappings keyed by ints (graph_color), which
JSON would turn into lists and string keys, and some score_answer compare them as they
were (arc_agi, rearc): `to_json` tags them ({"__tuple__": [...]}, {"__items__": [[k, v],
...]}) and `from_json` gives them back. Another type (a set, a Fraction, a numpy value) is
a BadInput line naming the generator; none of the generators at their defaults makes one
(tests/test_reasoning_gym.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
from collections.abc import Mapping
from typing import Any

import tensorflow_datasets as tfds

from rlcode.data.extras import GymExtra
from rlcode.data.gym_config import GymConfig
from rlcode.data.tasks import Task, TaskBuilder
from rlcode.errors import BadInput

SPLITS = ("held_out", "validation", "train")  # the order they are filled in
SEED_STRIDE = 1 << 20
PLAIN_SUFFIX = "\nAnswer:"
_TUPLE, _ITEMS = "__tuple__", "__items__"
_SCALARS = (str, int, float, bool, type(None))


def to_json(value: Any, where: str = "value") -> Any:
  """`value` as plain JSON data that `from_json` turns back into it: tuples and mappings
  whose keys are not all strings (or that use a tag as a key) are tagged."""
  if isinstance(value, _SCALARS):
    return value
  if isinstance(value, list):
    return [to_json(v, where) for v in value]
  if isinstance(value, tuple):
    return {_TUPLE: [to_json(v, where) for v in value]}
  if isinstance(value, Mapping):
    keys = list(value)
    if all(isinstance(k, str) for k in keys) and not {_TUPLE, _ITEMS} & set(keys):
      return {k: to_json(v, where) for k, v in value.items()}
    return {_ITEMS: [[to_json(k, where), to_json(v, where)] for k, v in value.items()]}
  raise BadInput(f"{where}: holds a {type(value).__name__} ({str(value)[:40]!r}), which "
                 "rlcode cannot store as JSON")


def from_json(value: Any) -> Any:
  """The value `to_json` was given."""
  if isinstance(value, list):
    return [from_json(v) for v in value]
  if isinstance(value, Mapping):
    if set(value) == {_TUPLE}:
      return tuple(from_json(v) for v in value[_TUPLE])
    if set(value) == {_ITEMS}:
      return {_hashable(from_json(k)): from_json(v) for k, v in value[_ITEMS]}
    return {k: from_json(v) for k, v in value.items()}
  return value


def _hashable(key):
  return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def plain_prompt(question: str) -> str:
  """The prompt of a question asked as it is: the answer follows "Answer:"."""
  return question.rstrip() + PLAIN_SUFFIX


def split_seed(seed: int, split: str) -> int:
  """The seed of `split`'s datasets (module docstring)."""
  return (3 * seed + SPLITS.index(split)) * SEED_STRIDE


def split_tasks(gym: GymConfig) -> dict[str, list[Task]]:
  """{split: its tasks, generator by generator in the order of gym.datasets, each in
  index order}; a split of size 0 is left out."""
  sizes = {"train": gym.train_size, "validation": gym.validation_size,
           "held_out": gym.held_out_size}
  generator_kwargs = {name: dict(gym.kwargs[name]) if name in gym.kwargs else {}
                      for name in gym.datasets}
  seen: set[str] = set()
  out: dict[str, list[Task]] = {}
  for split in SPLITS:
    if sizes[split] == 0:
      continue
    out[split] = []
    for name in gym.datasets:
      out[split] += _generator_tasks(name, generator_kwargs[name], split,
                                     split_seed(gym.seed, split), sizes[split], seen)
  return {split: out[split] for split in ("train", "validation", "held_out") if split in out}


def _generator_tasks(name: str, kwargs: dict, split: str, seed: int, size: int,
                     seen: set[str]) -> list[Task]:
  import reasoning_gym  # deferred: a second or two, for runs that build these tasks
  attempts = 4 * size + 64
  made = dict(kwargs, seed=seed, size=attempts)
  dataset = reasoning_gym.create_dataset(name, **made)
  stored = to_json(made, f"data.gym.kwargs.{name}")
  tasks = []
  for index in range(attempts):
    entry = dataset[index]
    where = f"reasoning-gym {name!r} entry {index} (seed {seed})"
    unknown = sorted(set(entry) - {"question", "answer", "metadata"})
    if unknown or not isinstance(entry.get("question"), str):
      raise BadInput(f"{where}: expected a string question, an answer and metadata, got the "
                     f"keys {sorted(entry)}")
    question = entry["question"]
    if question in seen:
      continue
    seen.add(question)
    answer = entry.get("answer")
    tasks.append(Task(
        id=f"gym/{name}/{split}/{index:07d}", prompt=plain_prompt(question), kind="gym",
        reference=" " + answer if isinstance(answer, str) else "",
        extra=GymExtra(dataset=name, config=stored, index=index, question=question,
                       answer=to_json(answer, where),
                       metadata=to_json(dict(entry.get("metadata") or {}), where))))
    if len(tasks) == size:
      return tasks
  raise BadInput(f"data.gym: reasoning-gym {name!r} gave {len(tasks)} questions not seen "
                 f"before in {attempts} entries for split {split!r}, which asks {size}; ask "
                 "for fewer, or widen data.gym.kwargs")


class GymTasks(TaskBuilder):
  """Question/answer tasks from reasoning-gym's generators, checked by their own verifiers
  (splits "train", "validation", "held_out"; rlcode.data.reasoning_gym).

  The builder config is named after a hash of the section, reasoning-gym's version and
  this builder's version, so another section or release never reads a stale cache.
  """

  VERSION = tfds.core.Version("1.0.0")

  def __init__(self, *, data_dir: str, config: GymConfig, **kwargs):
    self._config = config
    what = {"gym": to_json(dataclasses.asdict(config)), "builder": str(self.VERSION),
            "reasoning_gym": importlib.metadata.version("reasoning_gym"),
            "prompt": PLAIN_SUFFIX}
    digest = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]
    builder_config = tfds.core.BuilderConfig(
        name=f"gym_{digest}", description=f"reasoning-gym {', '.join(config.datasets)}")
    super().__init__(data_dir=data_dir, config=builder_config, **kwargs)

  def _split_tasks(self):
    return split_tasks(self._config)


def gym_tasks(data_cfg, root: str) -> GymTasks:
  """The builder of a data section whose source is "reasoning_gym"."""
  if data_cfg.gym is None:
    raise BadInput("config.data.source='reasoning_gym' needs config.data.gym (its "
                   "datasets at least)")
  fields = data_cfg.gym.to_dict() if hasattr(data_cfg.gym, "to_dict") else dict(data_cfg.gym)
  if isinstance(fields.get("datasets"), list):
    fields["datasets"] = tuple(fields["datasets"])
  try:
    config = GymConfig(**fields)
  except (ValueError, TypeError) as e:  # (the loader checked a config's section already)
    raise BadInput(f"config.data.gym: {e}") from None
  return GymTasks(data_dir=root, config=config)
