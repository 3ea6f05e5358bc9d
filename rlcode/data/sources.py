"""From the `data` section of a config to a tfds builder and its tasks.

    config.data.source = "jsonl"       # config.data.path: a problems file (data/tiny_tasks.jsonl)
    config.data.source = "humaneval"   # the 164 HumanEval problems (split "test")
    config.data.source = "git"         # config.data.repo: mined PRs (rlcode.data.git)
                                       #   with config.data.mining: MiningConfig's other fields;
                                       #   a tuple of repositories mines each alike
    config.data.source = "sections"    # config.data.sources: documents (rlcode.data.sections)
    config.data.source = "swe"         # config.data.repo: executable PR tasks (rlcode.swe)
                                       #   with config.data.swe: SweConfig's other fields;
                                       #   a tuple of repositories mines each alike
    config.data.source = "swebench"    # config.data.path: SWE-bench JSON lines (rlcode.swe.export)
    config.data.source = "reasoning_gym"  # config.data.gym: reasoning-gym's generators
                                          #   (rlcode.data.reasoning_gym), kind "gym"

For "sections", config.data.count_tokens (default "words") is the unit of the
SectionOptions budgets: "words" counts whitespace-separated words, "bytes" counts
UTF-8 bytes, which are the tokens of a byte-level model (less its BOS), and a
path to a tokenizer.json counts that tokenizer's tokens (less its BOS): with the
model's own tokenizer a prompt's length in tokens is bounded by context_budget + 1.

Prepared datasets live under config.data.data_dir, else $TFDS_DATA_DIR, else
~/.cache/rlcode/tfds. Relative paths are tried against the working directory,
then the project root.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable
from typing import Any

from rlcode.paths import resolve
from rlcode.data.tasks import Task, TaskBuilder, load_tasks
from rlcode.errors import BadInput, MissingInput

SOURCES = ("jsonl", "humaneval", "git", "sections", "swe", "swebench", "reasoning_gym")
SECTION_COUNTS = ("words", "bytes")
# The sources another package builds, and that package: it registers its builders when
# imported (rlcode.swe is, by the config schema), so data/ does not import it.
ELSEWHERE = {"swe": "rlcode.swe", "swebench": "rlcode.swe"}
_REGISTERED: dict[str, Callable[[Any, str], TaskBuilder]] = {}


def register(source: str, make: Callable[[Any, str], TaskBuilder]) -> None:
  """Builds config.data.source `source` with `make(data_cfg, data_dir)`."""
  if source not in ELSEWHERE:
    raise ValueError(f"register({source!r}): the sources built elsewhere are {sorted(ELSEWHERE)}")
  _REGISTERED[source] = make


def utf8_bytes(text: str) -> int:
  """Token count of a byte-level tokenizer (without its BOS)."""
  return len(text.encode("utf-8"))


def _section_counter(unit: str) -> dict:
  """SectionTasks' count_tokens and count_tokens_name for config.data.count_tokens."""
  if unit == "words":
    return {}
  if unit == "bytes":
    return dict(count_tokens=utf8_bytes, count_tokens_name="utf8_bytes")
  path = resolve(unit)
  if not unit.endswith(".json") or not os.path.isfile(path):
    raise BadInput(f"config.data.count_tokens={unit!r}; expected one of {SECTION_COUNTS} "
                   "or the path of a tokenizer.json")
  from rlcode.models.tokenizer import load_tokenizer  # deferred: the tokenizers library
  tokenizer = load_tokenizer(path)
  bos = len(tokenizer.encode(""))
  with open(path, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()[:12]
  return dict(count_tokens=lambda text: len(tokenizer.encode(text)) - bos,
              count_tokens_name=f"tokenizer_{digest}")


def data_dir(data_cfg) -> str:
  return (data_cfg.data_dir or os.environ.get("TFDS_DATA_DIR")
          or os.path.expanduser("~/.cache/rlcode/tfds"))


def builders(data_cfg) -> list[TaskBuilder]:
  """The builders a data section reads: one, or one per repository of a "git" or "swe"
  source whose config.data.repo is a tuple."""
  repo = data_cfg.repo
  if data_cfg.source in ("git", "swe") and isinstance(repo, (tuple, list)):
    if not repo:
      raise BadInput("config.data.repo is an empty tuple: name at least one repository")
    import ml_collections
    fields = data_cfg.to_dict()
    return [builder(ml_collections.ConfigDict({**fields, "repo": one})) for one in repo]
  return [builder(data_cfg)]


def builder(data_cfg) -> TaskBuilder:
  source = data_cfg.source
  root = data_dir(data_cfg)
  # Deferred: each source's builder brings in tfds and its own readers.
  if source == "jsonl":
    from rlcode.data.jsonl import JsonlTasks  # deferred: tfds
    path = resolve(data_cfg.path)
    if not os.path.isfile(path):
      raise MissingInput(f"config.data.path={data_cfg.path!r}: no such file")
    return JsonlTasks(data_dir=root, path=path)
  if source == "humaneval":
    from rlcode.data.humaneval import HumanEval  # deferred: tfds
    return HumanEval(data_dir=root)
  if source == "git":
    from rlcode.data.git import GitDiffs, MiningConfig  # deferred: tfds
    mining = data_cfg.mining.to_dict() if data_cfg.mining is not None else {}
    fields = {k: (tuple(v) if isinstance(v, list) else v) for k, v in mining.items()}
    fields["source"] = resolve(data_cfg.repo)
    mining = MiningConfig(**fields)
    return GitDiffs(data_dir=root, mining=mining)
  if source in ELSEWHERE:
    if source not in _REGISTERED:
      raise BadInput(f"config.data.source={source!r} is filled in by {ELSEWHERE[source]}: "
                     f"import it before building the data")
    return _REGISTERED[source](data_cfg, root)
  if source == "sections":
    from rlcode.data.sections import SectionOptions, SectionTasks  # deferred: tfds
    counter = _section_counter(data_cfg.count_tokens)
    options = SectionOptions(**data_cfg.options.to_dict()) if data_cfg.options else SectionOptions()
    return SectionTasks(data_dir=root, sources=tuple(resolve(s) for s in data_cfg.sources),
                        options=options, **counter)
  if source == "reasoning_gym":
    from rlcode.data.reasoning_gym import gym_tasks  # deferred: tfds, reasoning_gym
    return gym_tasks(data_cfg, root)
  if source == "verifiers":
    raise BadInput("config.data.source='verifiers': the tasks are the rows of "
                   "harness.verifiers's environment, which only the harness trainer reads")
  raise BadInput(f"config.data.source={source!r}; expected one of {SOURCES}")


def load(data_cfg, split: str) -> list[Task]:
  """The tasks of `split` of every builder (`builders`), sorted by id as each
  builder's are (so max_eval_tasks takes from every repository)."""
  import tensorflow_datasets as tfds
  tfds.disable_progress_bar()
  tasks = [t for b in builders(data_cfg) for t in load_tasks(b, split)]
  # (a config's data section; the miner's CLI passes a section without these keys)
  share = getattr(data_cfg, "reference_share", 1.0)
  if share < 1.0 and split == data_cfg.train_split:
    # Only a task with tests can lose its reference: a diff's or a section's reward is it.
    tasks = [dataclasses.replace(t, reference="")
             if t.tests and not keeps_reference(t.id, share) else t for t in tasks]
  return sorted(tasks, key=lambda t: t.id)


def keeps_reference(task_id: str, share: float) -> bool:
  """Whether a training task keeps its reference under `data.reference_share`: a hash of
  its id below the share, so the same tasks in every run, seed and process, and a larger
  share keeps a superset of a smaller one's."""
  digest = hashlib.sha256(task_id.encode()).digest()
  return int.from_bytes(digest[:8], "big") / 2.0 ** 64 < share


def with_references(tasks) -> list[Task]:
  """What supervised training can use: every task but those with tests and no reference
  (a tests-only task, data.reference_share) and reasoning-gym tasks without one (a
  generator that checks an answer by its metadata has no single answer to train on)."""
  return [t for t in tasks if t.reference or not (t.tests or t.kind == "gym")]


def load_eval(data_cfg) -> list[Task]:
  """The evaluation split, cut to data_cfg.max_eval_tasks when that is set."""
  tasks = load(data_cfg, data_cfg.eval_split)
  return tasks[:data_cfg.max_eval_tasks]


def load_splits(data_cfg) -> tuple[list[Task], list[Task], list[Task]]:
  """A run's (train, eval, test) tasks: the evaluation split as `load_eval` gives it, and
  no test tasks without data_cfg.test_split."""
  evaluation = load_eval(data_cfg)
  train = load(data_cfg, data_cfg.train_split)
  test = load(data_cfg, data_cfg.test_split) if data_cfg.test_split else []
  return train, evaluation, test
