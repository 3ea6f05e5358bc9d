"""`rlcode config show CONFIG` and `rlcode config keys`: a resolved config, the schema.

`show` prints every key of a resolved config as `key = value` lines, in the schema's
order; `keys` prints every key of the schema with its type, default, allowed values,
the trainers that read it and its one-line doc.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping

from rlcode import fields
from rlcode.config import loader, schema


def show(config) -> str:
  """`key = value` lines of a resolved config, in the schema's order."""
  tree = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  return "\n".join(f"{k} = {v!r}" for k, v in _leaves(schema.Config, tree, ""))


def _leaves(cls, tree: Mapping, prefix: str) -> Iterator[tuple[str, object]]:
  hints = fields.hints(cls)
  for name in loader.keys_of(cls):
    if name not in tree:
      continue
    value = tree[name]
    inner, _ = fields.optional_of(hints[name])
    if fields.is_section(inner) and isinstance(value, Mapping):
      yield from _leaves(inner, value, f"{prefix}{name}.")
    else:
      yield f"{prefix}{name}", value


@dataclasses.dataclass(frozen=True)
class Key:
  path: str
  type: str
  default: str
  allowed: str
  trainers: tuple[str, ...]
  doc: str


def keys(trainer: str | None = None) -> list[Key]:
  """Every key of the schema (only those `trainer` reads, when given), in order."""
  out = []
  for name in loader.keys_of(schema.Config, trainer):
    readers = tuple(t for t, ks in schema.TRAINER_SECTIONS.items() if name in ks)
    out += _section_keys(schema.Config, name, name, readers, trainer)
  return out


def _section_keys(cls, name: str, path: str, readers: tuple[str, ...],
                  trainer: str | None) -> list[Key]:
  f = next(f for f in dataclasses.fields(cls) if f.name == name)
  tp = fields.hints(cls)[name]
  inner, _ = fields.optional_of(tp)
  only = fields.meta(f)["only"]
  if only:
    readers = tuple(t for t in readers if t in only)
  if trainer is not None and trainer not in readers:
    return []
  if fields.is_section(inner):
    out = []
    for sub in loader.keys_of(inner):
      out += _section_keys(inner, sub, f"{path}.{sub}", readers, trainer)
    return out
  default = loader._default(f)
  derived = fields.meta(f)["derived"]
  shown = ("(required)" if default is dataclasses.MISSING
           else f"derived: {derived}" if derived and default is None else repr(default))
  return [Key(path=path, type=fields.type_name(tp), default=shown,
              allowed=fields.allowed_text(f), trainers=readers,
              doc=fields.docs(cls).get(name, ""))]


def format_keys(rows: list[Key], long: bool = False) -> str:
  """A table, one key a line: key, type, default, allowed, trainers; then its doc."""
  lines = []
  for k in rows:
    head = f"{k.path}  ({k.type}, default {k.default}"
    head += f"; {k.allowed}" if k.allowed else ""
    head += f"; {'/'.join(k.trainers)}" if len(k.trainers) < len(schema.TRAINERS) else ""
    lines.append(head + ")")
    lines.append(f"    {k.doc}")
  return "\n".join(lines)
