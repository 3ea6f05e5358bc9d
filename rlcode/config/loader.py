"""Loading `configs/*.py` files, applying `--config.a.b=value` overrides, resolving against
the schema.

A config file defines `get_config(arg=None)` returning an ml_collections ConfigDict;
`path.py:arg` passes `arg`. Config files may import modules next to them
(configs/common.py). `resolve` turns what a file sets into the whole config: every
section its trainer reads (rlcode.config.schema.TRAINER_SECTIONS) with every default
filled, the overrides applied, the derived keys derived, every value checked. An
unknown key, a wrong type or a value out of range is one line naming the key and what is
allowed (rlcode.errors.BadInput / UnknownKey). The result is a locked ConfigDict:
`config.rl.group_size` reads a value that is always there.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from rlcode import fields, pyast
from rlcode.config import policy, schema
from rlcode.errors import BadInput, MissingInput, UnknownKey

PREFIX = "--config."


def load_config(spec: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
  """Loads `path[.py][:arg]`, applies overrides of the form `--config.a.b=value`, resolves."""
  return resolve(read_config_file(spec), overrides)


def read_config_file(spec: str) -> ml_collections.ConfigDict:
  """What the file's get_config() returns, as it returns it (unresolved)."""
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
  try:
    config = module.get_config(arg) if arg else module.get_config()
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    # The config file's own refusal (a bad argument, a wrong key in it): the user's input.
    raise BadInput(f"{spec}: get_config({arg!r}) failed: {type(e).__name__}: {e}") from None
  if not isinstance(config, ml_collections.ConfigDict):
    raise BadInput(f"{path}: get_config() returned {type(config).__name__}, not a ConfigDict")
  return config


def resolve(config: Mapping | ml_collections.ConfigDict,
            overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
  """The whole config of what `config` sets (idempotent: a resolved config resolves to
  itself), with `overrides` applied."""
  trainer = config.get("trainer")  # the raw file's: absent is an error below
  for item in overrides:  # a trainer override decides which sections there are
    dotted, raw_value = _split_override(item)
    if dotted == "trainer":
      trainer = raw_value
  if trainer is None:
    raise BadInput(f"config.trainer is not set: declare what the config trains, one of "
                   f"{', '.join(schema.TRAINERS)}")
  fields.check("trainer", trainer, str, _field(schema.Config, "trainer"))
  # An override of a key the file sets is applied there first, so that the file's
  # references (`get_ref`: one value shared by two keys) carry it to both.
  later = [item for item in overrides if not _set_in_file(config, item)]
  raw = _plain(config)
  raw["trainer"] = trainer
  tree = _fill("", schema.Config, raw, trainer)
  for item in later:
    _override(tree, item, trainer)
  _derive(tree, trainer)
  values, _ = _validate("", schema.Config, tree, trainer)
  out = ml_collections.ConfigDict(values)
  out.lock()
  return out


# ---------------------------------------------------------------- filling defaults

def _plain(value):
  if isinstance(value, ml_collections.ConfigDict):
    value = value.to_dict()
  if isinstance(value, Mapping):
    return {k: _plain(v) for k, v in value.items()}
  if isinstance(value, list):
    return tuple(_plain(v) for v in value)
  if isinstance(value, tuple):
    return tuple(_plain(v) for v in value)
  return value


def _field(cls, name) -> dataclasses.Field:
  return next(f for f in dataclasses.fields(cls) if f.name == name)


def keys_of(cls, trainer: str | None = None) -> list[str]:
  """The keys a section holds (at the top, those `trainer` reads)."""
  excluded = policy.EXCLUDED.get(cls, {})
  names = [f.name for f in dataclasses.fields(cls) if f.name not in excluded]
  if cls is schema.Config and trainer is not None:
    names = [n for n in names if n in schema.TRAINER_SECTIONS[trainer]]
  return names


def _default(f: dataclasses.Field):
  if f.default is not dataclasses.MISSING:
    return f.default
  if f.default_factory is not dataclasses.MISSING:
    return f.default_factory()
  return dataclasses.MISSING


def _section_default(f: dataclasses.Field):
  """A section field's base values ({} for the section's own defaults), or None."""
  d = _default(f)
  return {} if d is dataclasses.MISSING else d


def _fill(path: str, cls, raw, trainer: str) -> dict:
  where = path.rstrip(".") or "config"
  if not isinstance(raw, Mapping):
    raise BadInput(f"config.{where} is a {type(raw).__name__}, not a group of keys")
  names = keys_of(cls)
  reads = keys_of(cls, trainer)
  unknown = sorted(set(raw) - set(names))
  if unknown:
    raise UnknownKey(f"config.{path}{unknown[0]}: {where} has no key {unknown[0]!r}; "
                     f"valid keys: {sorted(reads)}")
  unread = sorted(set(raw) - set(reads))
  if unread:
    readers = [t for t, keys in schema.TRAINER_SECTIONS.items() if unread[0] in keys]
    raise BadInput(f"config.{unread[0]}: the {trainer!r} trainer reads no {unread[0]!r} "
                   f"(the trainers that do: {', '.join(readers)})")
  hints = fields.hints(cls)
  out = {}
  for name in reads:
    f = _field(cls, name)
    inner, _ = fields.optional_of(hints[name])
    if fields.is_section(inner):
      base = _section_default(f)
      value = raw.get(name, base)
      if value is None:
        out[name] = None
        continue
      if isinstance(value, Mapping) and isinstance(base, Mapping):
        value = {**base, **value}
      out[name] = _fill(f"{path}{name}.", inner, value, trainer)
    elif name in raw:
      out[name] = raw[name]
    else:
      default = _default(f)
      if default is dataclasses.MISSING:
        doc = fields.first_sentence(fields.docs(cls).get(name, ""))
        raise BadInput(f"config.{path}{name} is required: {doc}")
      out[name] = default
  return out


# ---------------------------------------------------------------- overrides

def _set_in_file(config, item: str) -> bool:
  """Applies an override to the file's ConfigDict when it holds that leaf; whether it did."""
  if not isinstance(config, ml_collections.ConfigDict):
    return False
  dotted, raw = _split_override(item)
  *parents, leaf = dotted.split(".")
  node, cls = config, schema.Config
  for name in parents:
    if not isinstance(node, ml_collections.ConfigDict) or name not in node or cls is None:
      return False
    inner = fields.optional_of(fields.hints(cls)[name])[0] if name in keys_of(cls) else None
    if not fields.is_section(inner):
      return False
    node, cls = node[name], inner
  if (not isinstance(node, ml_collections.ConfigDict) or leaf not in node
      or leaf not in keys_of(cls)
      or isinstance(node[leaf], ml_collections.ConfigDict)):
    return False
  value = _parse(raw, fields.hints(cls)[leaf], dotted)
  with node.ignore_type():
    node[leaf] = value
  return True


def _split_override(item: str) -> tuple[str, str]:
  if not item.startswith(PREFIX) or "=" not in item:
    raise BadInput(f"override {item!r} must look like --config.a.b=value")
  dotted, _, raw = item[len(PREFIX):].partition("=")
  return dotted, raw


def _override(tree: dict, item: str, trainer: str) -> None:
  dotted, raw = _split_override(item)
  keys = dotted.split(".")
  node, cls = tree, schema.Config
  for depth, name in enumerate(keys):
    where = ".".join(keys[:depth]) or "config"
    last = depth == len(keys) - 1
    if cls is None:  # inside a free-form mapping (rewards, reward_options)
      if last:
        node[name] = _parse_free(raw)
      else:
        node = node.setdefault(name, {})
        if not isinstance(node, dict):
          raise BadInput(f"--config.{dotted}: {'.'.join(keys[:depth + 1])} is not a group")
      continue
    reads = keys_of(cls, trainer)
    if name not in reads:
      if name in keys_of(cls):
        readers = [t for t, ks in schema.TRAINER_SECTIONS.items() if name in ks]
        raise BadInput(f"--config.{dotted}: the {trainer!r} trainer reads no {name!r} (the "
                       f"trainers that do: {', '.join(readers)})")
      raise UnknownKey(f"--config.{dotted}: {where} has no key {name!r}; valid keys: "
                       f"{sorted(reads)}")
    tp = fields.hints(cls)[name]
    inner, optional = fields.optional_of(tp)
    if fields.is_section(inner):
      if last:
        if raw == "None" and optional:
          node[name] = None
          return
        raise UnknownKey(f"--config.{dotted} is a group of keys {sorted(keys_of(inner))}; "
                         "set one of them" + (" (or None)" if optional else ""))
      if node.get(name) is None:  # an optional section switched on by setting a key
        node[name] = _fill(f"{'.'.join(keys[:depth + 1])}.", inner, {}, trainer)
      node, cls = node[name], inner
      continue
    if last:
      node[name] = _parse(raw, tp, dotted)
      return
    if _is_mapping(inner):
      node, cls = node.setdefault(name, {}), None
      continue
    raise UnknownKey(f"--config.{dotted}: {'.'.join(keys[:depth + 1])} is a "
                     f"{fields.type_name(tp)}, not a group of keys")


def _is_mapping(tp) -> bool:
  import typing
  return tp in (dict, Mapping) or typing.get_origin(tp) in (dict, Mapping)


def _parse_free(raw: str):
  try:
    return pyast.literal_eval(raw)
  except (ValueError, SyntaxError):
    return raw


def _parse(raw: str, tp, name: str):
  """An override's text as a value of the key's type (checked later)."""
  inner, optional = fields.optional_of(tp)
  if optional and raw == "None":
    return None
  if inner is bool:
    low = raw.lower()
    if low in ("true", "1", "yes"):
      return True
    if low in ("false", "0", "no"):
      return False
    raise BadInput(f"--config.{name}={raw!r}: expected a boolean (true/false)")
  if inner is str:
    return raw
  try:
    return pyast.literal_eval(raw)
  except (ValueError, SyntaxError):
    if "str" in fields.type_name(inner) or inner is Any:
      return raw
    raise BadInput(f"--config.{name}={raw!r}: cannot parse as {fields.type_name(tp)}") from None


# ---------------------------------------------------------------- derived keys

def _get(tree: dict, dotted: str):
  node = tree
  for k in dotted.split("."):
    if not isinstance(node, dict) or k not in node:
      return dataclasses.MISSING
    node = node[k]
  return node


def _derive(tree: dict, trainer: str) -> None:
  for target, source, trainers in schema.DERIVED:
    if trainer not in trainers:
      continue
    parent, _, leaf = target.rpartition(".")
    node = _get(tree, parent)
    value = _get(tree, source)
    if isinstance(node, dict) and node.get(leaf, dataclasses.MISSING) is None \
        and value is not dataclasses.MISSING:
      node[leaf] = value


# ---------------------------------------------------------------- checking

def _validate(path: str, cls, tree: dict, trainer: str) -> tuple[dict, Any]:
  """(the section's canonical values, its dataclass instance or None at the top)."""
  hints = fields.hints(cls)
  values, kwargs = {}, dict(policy.EXCLUDED.get(cls, {}))
  for name, value in tree.items():
    f = _field(cls, name)
    tp = hints[name]
    inner, _ = fields.optional_of(tp)
    dotted = f"{path}{name}"
    if fields.is_section(inner) and value is not None:
      values[name], kwargs[name] = _validate(f"{dotted}.", inner, value, trainer)
    else:
      values[name] = kwargs[name] = fields.check(dotted, value, tp, f)
    only = fields.meta(f)["only"]
    if only and trainer not in only and values[name] != _plain(_canonical(_default(f))):
      raise BadInput(f"config.{dotted}: read by the {'/'.join(only)} trainer only; this "
                     f"config's trainer is {trainer!r} (leave it at its default)")
  if cls is schema.Config:
    if "rewards" in values:
      # Deferred: the rewards package imports every reward's module.
      from rlcode.rewards import registry
      known = registry.names()
      for name in values["rewards"]:
        if name not in known:
          raise UnknownKey(f"config.rewards.{name}: no such reward; known: {sorted(known)}")
    return values, None
  try:
    instance = cls(**kwargs)
  except (ValueError, TypeError, KeyError) as e:
    text = str(e.args[0]) if e.args else type(e).__name__
    text = re.sub(rf"\b{cls.__name__}[.:]\s*", "", " ".join(text.split()))
    raise BadInput(f"config.{path.rstrip('.')}: {text}") from None
  for name in values:
    if not fields.is_section(fields.optional_of(hints[name])[0]):
      values[name] = _canonical(getattr(instance, name))
  return values, instance


def _canonical(value):
  """A section's value as plain data (a nested dataclass as a dict, mappings as dicts)."""
  if value is dataclasses.MISSING:
    return value
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return {k: _canonical(v) for k, v in dataclasses.asdict(value).items()}
  if isinstance(value, Mapping):
    return {k: _canonical(v) for k, v in value.items()}
  if isinstance(value, list):
    return tuple(_canonical(v) for v in value)
  return value
