"""The config a run records in its workdir (config.json), and the resume check against it.

A run writes the config it was resolved to; resuming with different values outside
`RESUMABLE_KEYS` (where it writes, how long it runs, how often it evaluates and saves,
where prepared datasets are cached, whether a bar is drawn) is one line listing the keys.
A derived key follows its resumable source: a run resumed for more steps stretches a
decay derived from train.steps. A key added to the schema after the run started counts as
its default.
"""

from __future__ import annotations

import json
import os

import ml_collections

from rlcode.config import loader, schema
from rlcode.errors import BadInput, MissingInput

RUN_CONFIG = "config.json"
RESUMABLE_KEYS = ("workdir", "train.steps", "train.eval_every", "train.checkpoint_every",
                  "train.keep_checkpoints", "train.progress_bar", "data.data_dir",
                  "warmstart.cache_dir")

# Keys recorded under another section by runs of an older schema: (section, key) ->
# (section, key) today. A recorded config is read as if written today, so such a run
# still resumes, serves and evaluates.
MOVED_KEYS = {("warmstart", "max_episodes"): ("agent", "demo_tasks"),
              **{("warmstart", k): ("agent", k)
                 for k in ("guess_fraction", "guess_families", "decoy_copy", "note_trust")}}


def flat(tree, prefix: str = "") -> dict[str, object]:
  """{"a.b": value} of a nested mapping."""
  out = {}
  for key, value in tree.items():
    name = f"{prefix}{key}"
    if isinstance(value, dict):
      out.update(flat(value, name + "."))
    else:
      out[name] = value
  return out


def plain(config: ml_collections.ConfigDict) -> dict:
  """The config as JSON values (tuples become lists), as a run records it."""
  return json.loads(json.dumps(config.to_dict(), default=list))


def write_run_config(config: ml_collections.ConfigDict, workdir: str) -> str:
  """Records the config a run starts with in workdir/config.json; returns the path."""
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, RUN_CONFIG)
  with open(path, "w") as f:
    json.dump(plain(config), f, indent=2, sort_keys=True)
  return path


def _read_json(path: str) -> dict:
  """A run's recorded config; a file cut mid-write (or not a config) is one line."""
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise BadInput(f"{path}: the run's recorded config is not valid JSON ({e}); it was "
                   "cut mid-write or edited: restore it, or use another workdir") from None
  if not isinstance(value, dict):
    raise BadInput(f"{path}: the run's recorded config is not a JSON object")
  return _moved(value)


def _moved(recorded: dict) -> dict:
  """`recorded` with MOVED_KEYS where today's schema has them. The older schema recorded
  every key of a section for every trainer: a key whose new section the run's trainer does
  not read is dropped (it was at its default and unread)."""
  reads = schema.TRAINER_SECTIONS.get(recorded.get("trainer"), ())
  for (section, key), (to_section, to_key) in MOVED_KEYS.items():
    old = recorded.get(section)
    if isinstance(old, dict) and key in old:
      value = old.pop(key)
      if to_section in reads:
        new = recorded.setdefault(to_section, {})
        if isinstance(new, dict):
          new.setdefault(to_key, value)
  return recorded


def check_resume(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Raises BadInput listing every key (outside RESUMABLE_KEYS) in which `config`
  differs from the one the run in `workdir` started with."""
  path = os.path.join(workdir, RUN_CONFIG)
  if not os.path.isfile(path):
    raise MissingInput(f"{path} does not exist: {workdir!r} holds a checkpoint but not the "
                       "config it was written with, so a resume cannot be checked")
  recorded = _read_json(path)
  before = flat(recorded)
  now = flat(plain(config))
  # A key rlcode gained since the run started is absent from its record: the recorded
  # config resolved by today's schema holds its default, which is what the run used.
  try:
    resolved = flat(plain(loader.resolve(recorded)))
  except BadInput:
    resolved = {}
  for k, value in resolved.items():
    before.setdefault(k, value)
  resumable = set(RESUMABLE_KEYS)
  # A derived key that follows a resumable one (decay steps from train.steps) follows it.
  from rlcode.config.schema import DERIVED
  for target, source, _ in DERIVED:
    if (source in resumable and before.get(target) == before.get(source)
        and now.get(target) == now.get(source)):
      resumable.add(target)
  differ = [k for k in sorted(set(before) | set(now))
            if k not in resumable and before.get(k, "<absent>") != now.get(k, "<absent>")]
  if differ:
    shown = "; ".join(f"{k}: {before.get(k, '<absent>')!r} -> {now.get(k, '<absent>')!r}"
                      for k in differ)
    raise BadInput(f"{workdir!r} holds a run with a different config ({shown}); resume with "
                   f"the same config (only {', '.join(RESUMABLE_KEYS)} may change) or use "
                   "another workdir")


def recorded_config(path: str, what: str = "path") -> ml_collections.ConfigDict:
  """The config a run was started with (resolved again): config.json in `path` or the
  directory above it (a workdir's warm_start/ or checkpoints/)."""
  for where in (path, os.path.dirname(os.path.abspath(path))):
    candidate = os.path.join(where, RUN_CONFIG)
    if os.path.isfile(candidate):
      return loader.resolve(_read_json(candidate))
  raise MissingInput(f"{what}={path!r}: no {RUN_CONFIG} there or one directory "
                     "up; name a run's workdir or checkpoint directory")
