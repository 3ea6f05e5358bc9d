"""Reading a policy turn: the tool call in `<tool_call>{...}</tool_call>`, checked.

`parse_turn(text, ended, tools)` returns a `Call` (a known tool, arguments valid
against its JSON schema), `None` when the turn is a final answer (it ended with an
end-of-sequence token and holds no call), or raises `CallError` whose message is
the observation the policy gets back: a malformed call, an unknown tool or wrong
arguments is never a crash, only an error the policy can read and fix.

The JSON-schema check covers the subset the tools use: object with properties,
required and additionalProperties: false; string, integer, boolean, array of
items; enum.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from rlcode.agent.chat import CALL_CLOSE, CALL_OPEN

ENDINGS = ("call", "eos", "length")


class CallError(ValueError):
  """A turn that is not a valid tool call; the message is the observation."""


@dataclasses.dataclass(frozen=True)
class Call:
  name: str
  arguments: dict[str, Any]


def check_arguments(schema: Mapping[str, Any], value: Any, where: str = "arguments") -> None:
  """Raises CallError naming the first argument of `value` that `schema` rejects."""
  kind = schema.get("type")
  types = {"object": dict, "string": str, "array": list, "boolean": bool}
  if kind == "integer":
    if not isinstance(value, int) or isinstance(value, bool):
      raise CallError(f"{where} must be an integer, got {json.dumps(value)[:40]}")
  elif kind in types:
    if not isinstance(value, types[kind]):
      raise CallError(f"{where} must be a {kind}, got {json.dumps(value)[:40]}")
  if "enum" in schema and value not in schema["enum"]:
    raise CallError(f"{where} must be one of {schema['enum']}, got {json.dumps(value)[:40]}")
  if kind == "object":
    props = schema.get("properties", {})
    missing = [k for k in schema.get("required", ()) if k not in value]
    if missing:
      raise CallError(f"{where}: missing required {missing}; expected {sorted(props)}")
    if schema.get("additionalProperties") is False:
      extra = sorted(set(value) - set(props))
      if extra:
        raise CallError(f"{where}: unknown {extra}; expected {sorted(props)}")
    for key, sub in props.items():
      if key in value:
        check_arguments(sub, value[key], f"{where}.{key}" if where != "arguments" else key)
  if kind == "array" and "items" in schema:
    for i, item in enumerate(value):
      check_arguments(schema["items"], item, f"{where}[{i}]")


def _check_text(value, depth: int = 0) -> None:
  """CallError when a string of the call is not text (a lone surrogate, which JSON's
  \\ud800 escapes allow): nothing downstream has to meet one."""
  if isinstance(value, str):
    try:
      value.encode("utf-8")
    except UnicodeEncodeError:
      raise CallError("the call holds a string that is not valid Unicode (a lone "
                      "surrogate escape)") from None
  elif isinstance(value, dict):
    for k, v in value.items():
      _check_text(k, depth + 1)
      _check_text(v, depth + 1)
  elif isinstance(value, list):
    for v in value:
      _check_text(v, depth + 1)


def parse_turn(text: str, ended: str, tools: Mapping[str, Any]) -> Call | None:
  """The call in one policy turn.

  Args:
    text: the turn's decoded text (the closing tag included when it ended on it).
    ended: "call" (on the closing tag), "eos" (end of sequence) or "length" (the
      per-turn token cap).
    tools: name -> tool (anything with a `parameters` JSON schema).

  Returns:
    The Call, or None for a final answer (an "eos" turn without a call).

  Raises:
    CallError: no complete call, JSON that does not parse (or holds a string that is not
      valid Unicode), not {"name", "arguments"}, an unknown tool or arguments the tool's
      schema rejects.
  """
  if ended not in ENDINGS:
    raise ValueError(f"ended={ended!r}; expected one of {ENDINGS}")
  start = text.find(CALL_OPEN)
  if ended == "length":
    raise CallError("the turn reached its token limit before a complete "
                    f"{CALL_OPEN}...{CALL_CLOSE}")
  if start < 0:
    if ended == "eos":
      return None
    raise CallError(f"{CALL_CLOSE} without {CALL_OPEN}: write "
                    f'{CALL_OPEN}{{"name": ..., "arguments": {{...}}}}{CALL_CLOSE}')
  end = text.find(CALL_CLOSE, start)
  if end < 0:
    raise CallError(f"{CALL_OPEN} without {CALL_CLOSE}")
  body = text[start + len(CALL_OPEN):end].strip()
  try:
    obj = json.loads(body)
  except json.JSONDecodeError as e:
    raise CallError(f"the call is not valid JSON: {e.msg} at char {e.pos}") from None
  except RecursionError:
    raise CallError("the call is not valid JSON: nested too deeply") from None
  except ValueError as e:  # e.g. an integer of more digits than Python converts
    raise CallError(f"the call is not valid JSON: {str(e)[:120]}") from None
  _check_text(obj)
  if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
    raise CallError('the call must be a JSON object {"name": ..., "arguments": {...}}')
  extra = sorted(set(obj) - {"name", "arguments"})
  if extra:
    raise CallError(f"the call has unknown keys {extra}; expected name and arguments")
  name = obj["name"]
  if name not in tools:
    raise CallError(f"unknown tool {name!r}; tools: {sorted(tools)}")
  arguments = obj.get("arguments", {})
  if not isinstance(arguments, dict):
    raise CallError(f"arguments of {name} must be a JSON object")
  check_arguments(tools[name].parameters, arguments)
  return Call(name, arguments)
