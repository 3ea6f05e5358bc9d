"""Loading `configs/*.py` files and applying `--config.a.b=value` overrides.

A config file defines `get_config(arg=None)` returning an ml_collections
ConfigDict; `path.py:arg` passes `arg`. Config files may import modules next to
them (configs/common.py). The loaded config is locked, so an
override of a key that does not exist fails, naming the keys that do.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from collections.abc import Sequence

import ml_collections

PREFIX = "--config."


def load_config(spec: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
  """Loads `path[.py][:arg]` and applies overrides of the form `--config.a.b=value`."""
  path, _, arg = spec.partition(":")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"config file {path!r} does not exist")
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
    raise AttributeError(f"{path}: a config file must define get_config()")
  config = module.get_config(arg) if arg else module.get_config()
  if not isinstance(config, ml_collections.ConfigDict):
    raise TypeError(f"{path}: get_config() returned {type(config).__name__}, not a ConfigDict")
  config.lock()
  for item in overrides:
    apply_override(config, item)
  return config


def apply_override(config: ml_collections.ConfigDict, item: str) -> None:
  if not item.startswith(PREFIX) or "=" not in item:
    raise ValueError(f"override {item!r} must look like --config.a.b=value")
  dotted, _, raw = item[len(PREFIX):].partition("=")
  keys = dotted.split(".")
  node = config
  for depth, key in enumerate(keys):
    where = ".".join(keys[:depth]) or "config"
    if not isinstance(node, ml_collections.ConfigDict):
      raise KeyError(f"--config.{dotted}: {where} is a {type(node).__name__}, not a group of keys")
    if key not in node:
      raise KeyError(f"--config.{dotted}: {where} has no key {key!r}; "
                     f"valid keys: {sorted(node.keys())}")
    if depth < len(keys) - 1:
      node = node[key]
  current = node[keys[-1]]
  if isinstance(current, ml_collections.ConfigDict):
    raise KeyError(f"--config.{dotted} is a group of keys {sorted(current.keys())}; "
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
    raise ValueError(f"--config.{name}={raw!r}: expected a boolean (true/false)")
  if isinstance(current, str):
    return raw
  try:
    value = ast.literal_eval(raw)
  except (ValueError, SyntaxError):
    if current is None:
      return raw
    raise ValueError(f"--config.{name}={raw!r}: cannot parse as {type(current).__name__}") from None
  if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  if current is not None and not isinstance(value, type(current)):
    if isinstance(current, (tuple, list)) and isinstance(value, (tuple, list)):
      return type(current)(value)
    raise ValueError(f"--config.{name}={raw!r}: expected {type(current).__name__}, "
                     f"got {type(value).__name__}")
  return value
