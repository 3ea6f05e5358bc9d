"""Loading `configs/*.py` files and applying `--config.a.b=value` overrides.

A config file defines `get_config(arg=None)` returning an ml_collections
ConfigDict; `path.py:arg` passes `arg`. Config files may import modules next to
them (configs/common.py). The loaded config is locked, so an
override of a key that does not exist fails, naming the keys that do.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Sequence

import ml_collections

from rlcode import pyast
from rlcode.errors import BadInput, MissingInput, UnknownKey

PREFIX = "--config."
RUN_CONFIG = "config.json"
# What a resumed run may change: where it writes, how long it runs, how often it
# evaluates and saves, where prepared datasets are cached, whether a bar is drawn.
RESUMABLE_KEYS = ("workdir", "train.steps", "train.eval_every", "train.checkpoint_every",
                  "train.keep_checkpoints", "train.progress_bar", "data.data_dir",
                  "warmstart.cache_dir")


def load_config(spec: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
  """Loads `path[.py][:arg]` and applies overrides of the form `--config.a.b=value`."""
  path, _, arg = spec.partition(":")
  if not os.path.isfile(path):
    raise MissingInput(f"config file {path!r} does not exist")
  module_spec = importlib.util.spec_from_file_location(
      f"rlcode_config_{abs(hash(os.path.abspath(path)))}", path)
  module = importlib.util.module_from_spec(module_spec)
  # Config files import their siblings (`from common import tiny_model`).
  sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
  try:
    module_spec.loader.exec_module(module)
  finally:
    sys.path.pop(0)
  if not hasattr(module, "get_config"):
    raise BadInput(f"{path}: a config file must define get_config()")
  config = module.get_config(arg) if arg else module.get_config()
  if not isinstance(config, ml_collections.ConfigDict):
    raise BadInput(f"{path}: get_config() returned {type(config).__name__}, not a ConfigDict")
  config.lock()
  for item in overrides:
    apply_override(config, item)
  return config


def apply_override(config: ml_collections.ConfigDict, item: str) -> None:
  if not item.startswith(PREFIX) or "=" not in item:
    raise BadInput(f"override {item!r} must look like --config.a.b=value")
  dotted, _, raw = item[len(PREFIX):].partition("=")
  keys = dotted.split(".")
  node = config
  for depth, key in enumerate(keys):
    where = ".".join(keys[:depth]) or "config"
    if not isinstance(node, ml_collections.ConfigDict):
      raise UnknownKey(f"--config.{dotted}: {where} is a {type(node).__name__}, "
                       "not a group of keys")
    if key not in node:
      raise UnknownKey(f"--config.{dotted}: {where} has no key {key!r}; "
                       f"valid keys: {sorted(node.keys())}")
    if depth < len(keys) - 1:
      node = node[key]
  current = node[keys[-1]]
  if isinstance(current, ml_collections.ConfigDict):
    raise UnknownKey(f"--config.{dotted} is a group of keys {sorted(current.keys())}; "
                     "set one of them")
  with node.ignore_type():
    node[keys[-1]] = parse_value(raw, current, dotted)


def parse_value(raw: str, current, name: str = "value"):
  """Parses `raw` as the type of the value it replaces."""
  if isinstance(current, bool):
    low = raw.lower()
    if low in ("true", "1", "yes"):
      return True
    if low in ("false", "0", "no"):
      return False
    raise BadInput(f"--config.{name}={raw!r}: expected a boolean (true/false)")
  if isinstance(current, str):
    return raw
  try:
    value = pyast.literal_eval(raw)
  except (ValueError, SyntaxError):
    if current is None:
      return raw
    raise BadInput(f"--config.{name}={raw!r}: cannot parse as {type(current).__name__}") from None
  if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  if current is not None and not isinstance(value, type(current)):
    if isinstance(current, (tuple, list)) and isinstance(value, (tuple, list)):
      return type(current)(value)
    raise BadInput(f"--config.{name}={raw!r}: expected {type(current).__name__}, "
                   f"got {type(value).__name__}")
  return value


def _flat(tree, prefix: str = "") -> dict[str, object]:
  out = {}
  for key, value in tree.items():
    name = f"{prefix}{key}"
    if isinstance(value, dict):
      out.update(_flat(value, name + "."))
    else:
      out[name] = value
  return out


def _plain(config: ml_collections.ConfigDict) -> dict:
  """The config as JSON values (tuples become lists), as a run records it."""
  return json.loads(json.dumps(config.to_dict(), default=list))


def write_run_config(config: ml_collections.ConfigDict, workdir: str) -> str:
  """Records the config a run starts with in workdir/config.json; returns the path."""
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, RUN_CONFIG)
  with open(path, "w") as f:
    json.dump(_plain(config), f, indent=2, sort_keys=True)
  return path


def check_resume(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Raises BadInput listing every key (outside RESUMABLE_KEYS) in which `config`
  differs from the one the run in `workdir` started with."""
  path = os.path.join(workdir, RUN_CONFIG)
  if not os.path.isfile(path):
    raise MissingInput(f"{path} does not exist: {workdir!r} holds a checkpoint but not the "
                       "config it was written with, so a resume cannot be checked")
  with open(path) as f:
    before = _flat(json.load(f))
  now = _flat(_plain(config))
  differ = [k for k in sorted(set(before) | set(now))
            if k not in RESUMABLE_KEYS and before.get(k, "<absent>") != now.get(k, "<absent>")]
  if differ:
    shown = "; ".join(f"{k}: {before.get(k, '<absent>')!r} -> {now.get(k, '<absent>')!r}"
                      for k in differ)
    raise BadInput(f"{workdir!r} holds a run with a different config ({shown}); resume with "
                   f"the same config (only {', '.join(RESUMABLE_KEYS)} may change) or use "
                   "another workdir")
