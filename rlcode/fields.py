"""What a config key is: a dataclass field with its type, default and allowed values.

A section of the schema is a dataclass. Each field's annotation is its type, its default
is the key's default, and `key(...)` adds what else is allowed (choices, bounds, a check)
and which trainers read it. The one-line doc of every key is its entry under
`Attributes:` in the section's docstring (the Google style Tunix's and flax's configs
use), so a key's type, default, allowed values and doc sit in one class.

`check(path, value, annotation, field)` validates one value and returns it in its
canonical form (lists become tuples, ints become floats where a float is asked for);
what is wrong is one BadInput line naming the key. This module must not know any
particular section, and imports nothing of rlcode but its errors: sections that live beside
their code (rlcode.optim's OptimizerConfig) declare keys here without importing
rlcode.config, which composes them.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlcode.errors import BadInput

_MISSING = dataclasses.MISSING


@dataclasses.dataclass(frozen=True)
class Lazy:
  """A vocabulary that lives in a heavier module (imported only when a value is checked)."""

  module: str
  attr: str

  def get(self) -> tuple:
    value = getattr(importlib.import_module(self.module), self.attr)
    return tuple(value)


def key(default: Any = _MISSING, *, choices: Sequence | Lazy | None = None,
        ge: float | None = None, gt: float | None = None, le: float | None = None,
        lt: float | None = None, check: Callable[[Any], bool] | None = None,
        allowed: str = "", only: Sequence[str] = (), derived: str = "") -> Any:
  """A schema field. choices: the allowed values (of each element, for a tuple); ge, gt,
  le, lt: bounds; check(value) -> bool with `allowed` saying in words what passes;
  only: the trainers that read the key (elsewhere it must keep its default); derived:
  what a None default is derived from (documentation for `rlcode config keys`)."""
  meta = {"choices": choices, "ge": ge, "gt": gt, "le": le, "lt": lt, "check": check,
          "allowed": allowed, "only": tuple(only), "derived": derived}
  if isinstance(default, (dict, list, set)):
    frozen = default
    return dataclasses.field(default_factory=lambda: type(frozen)(frozen), metadata=meta)
  return dataclasses.field(default=default, metadata=meta)


def meta(field: dataclasses.Field) -> dict:
  base = {"choices": None, "ge": None, "gt": None, "le": None, "lt": None, "check": None,
          "allowed": "", "only": (), "derived": ""}
  return {**base, **dict(field.metadata)}


@functools.lru_cache(maxsize=None)
def hints(cls) -> dict[str, Any]:
  return typing.get_type_hints(cls)


@functools.lru_cache(maxsize=None)
def docs(cls) -> dict[str, str]:
  """{field: its doc} from the `Attributes:` part of the class docstring; a doc's
  continuation lines are joined to it."""
  text = cls.__doc__ or ""
  out, name = {}, None
  inside = False
  for line in text.splitlines():
    if line.strip() == "Attributes:":
      inside, indent = True, None
      continue
    if not inside:
      continue
    if not line.strip():
      continue
    depth = len(line) - len(line.lstrip())
    if indent is None:
      indent = depth
    if depth < indent:
      break
    match = re.match(r"\s*(\w+)(?: \([^)]*\))?: (.*)", line)
    if depth == indent and match:
      name = match.group(1)
      out[name] = match.group(2).strip()
    elif name is not None:
      out[name] += " " + line.strip()
  return out


def first_sentence(doc: str) -> str:
  """The doc up to its first ".", ";" or ":" outside parentheses (not "e.g.")."""
  depth = 0
  for i, ch in enumerate(doc):
    depth += (ch == "(") - (ch == ")")
    if (depth == 0 and ch in ".;:" and (i + 1 == len(doc) or doc[i + 1] == " ")
        and not doc[max(0, i - 3):i + 1].endswith(("e.g.", "i.e."))):
      return doc[:i]
  return doc


def is_section(tp) -> bool:
  return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def optional_of(tp):
  """(inner, True) for `X | None`, else (tp, False)."""
  args = typing.get_args(tp)
  if _is_union(tp) and type(None) in args:
    rest = [a for a in args if a is not type(None)]
    return (rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]), True
  return tp, False


def _is_union(tp) -> bool:
  return typing.get_origin(tp) in (typing.Union, types.UnionType)


def type_name(tp) -> str:
  """The type as `rlcode config keys` prints it."""
  inner, optional = optional_of(tp)
  if optional:
    return f"{type_name(inner)} | None"
  if _is_union(inner):
    return " | ".join(type_name(a) for a in typing.get_args(inner))
  origin = typing.get_origin(inner)
  if origin is tuple:
    args = typing.get_args(inner)
    return f"tuple[{type_name(args[0])}, ...]" if args else "tuple"
  if origin in (dict, Mapping) or inner in (dict, Mapping):
    args = typing.get_args(inner)
    return f"dict[{', '.join(type_name(a) for a in args)}]" if args else "dict"
  if is_section(inner):
    return "section"
  if inner is Any:
    return "any"
  return getattr(inner, "__name__", str(inner))


def allowed_text(field: dataclasses.Field) -> str:
  m = meta(field)
  parts = []
  if m["choices"] is not None:
    choices = m["choices"].get() if isinstance(m["choices"], Lazy) else m["choices"]
    parts.append("one of " + ", ".join(repr(c) for c in choices))
  low = ("[", m["ge"]) if m["ge"] is not None else ("(", m["gt"]) if m["gt"] is not None else None
  high = ("]", m["le"]) if m["le"] is not None else (")", m["lt"]) if m["lt"] is not None else None
  if low and high:
    parts.append(f"in {low[0]}{_num(low[1])}, {_num(high[1])}{high[0]}")
  elif low:
    parts.append(f"{'>=' if low[0] == '[' else '>'} {_num(low[1])}")
  elif high:
    parts.append(f"{'<=' if high[0] == ']' else '<'} {_num(high[1])}")
  if m["allowed"]:
    parts.append(m["allowed"])
  return ", ".join(parts)


def _num(x) -> str:
  return str(int(x)) if float(x).is_integer() else str(x)


def _fail(path: str, value, what: str):
  raise BadInput(f"config.{path}={value!r}: {what}")


def check(path: str, value, tp, field: dataclasses.Field | None = None):
  """`value` checked against the annotation `tp` and the field's allowed values; returns
  it in canonical form."""
  inner, optional = optional_of(tp)
  if value is None:
    if optional or inner is Any:
      return None
    _fail(path, value, f"expected {type_name(tp)}, not None")
  value = _typed(path, value, inner)
  if field is not None:
    _allowed(path, value, field)
  return value


def _typed(path: str, value, tp):
  if tp is Any:
    return value
  if _is_union(tp):
    for option in typing.get_args(tp):
      try:
        return _typed(path, value, option)
      except BadInput:
        continue
    _fail(path, value, f"expected {type_name(tp)}")
  origin = typing.get_origin(tp)
  if origin is tuple:
    if isinstance(value, str) or not isinstance(value, (tuple, list)):
      _fail(path, value, f"expected {type_name(tp)} (a tuple, not a {type(value).__name__})")
    args = typing.get_args(tp)
    elem = args[0] if args else Any
    return tuple(_typed(f"{path}[{i}]", v, elem) for i, v in enumerate(value))
  if origin in (dict, Mapping) or tp in (dict, Mapping):
    if not isinstance(value, Mapping):
      _fail(path, value, f"expected {type_name(tp)}")
    args = typing.get_args(tp) or (Any, Any)
    return {_typed(f"{path}", k, args[0]): _typed(f"{path}.{k}", v, args[1])
            for k, v in dict(value).items()}
  if tp is bool:
    if not isinstance(value, bool):
      _fail(path, value, "expected a boolean (true/false)")
    return value
  if tp is int:
    if isinstance(value, bool) or not isinstance(value, int):
      _fail(path, value, "expected an int")
    return value
  if tp is float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      _fail(path, value, "expected a float")
    return float(value)
  if tp is str:
    if not isinstance(value, str):
      _fail(path, value, f"expected a str, not a {type(value).__name__}")
    return value
  return value


def _allowed(path: str, value, field: dataclasses.Field) -> None:
  m = meta(field)
  values = value if isinstance(value, tuple) else (value,)
  if m["choices"] is not None:
    choices = m["choices"].get() if isinstance(m["choices"], Lazy) else tuple(m["choices"])
    for v in values:
      if v not in choices:
        _fail(path, value, f"expected one of {', '.join(repr(c) for c in choices)}")
  for v in values:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
      continue
    for name, ok in (("ge", v >= (m["ge"] if m["ge"] is not None else v)),
                     ("gt", m["gt"] is None or v > m["gt"]),
                     ("le", v <= (m["le"] if m["le"] is not None else v)),
                     ("lt", m["lt"] is None or v < m["lt"])):
      if m[name] is not None and not ok:
        _fail(path, value, f"must be {allowed_text(field)}")
  if m["check"] is not None and not m["check"](value):
    _fail(path, value, f"must be {allowed_text(field)}")
