"""The grammar a chat request's output must follow, for the engine's constrained decoding.

    response_format json_object        one JSON object
    response_format json_schema        one JSON value valid under its schema
    tool_choice {"function": {name}}   <tool_call>{"name": name, "arguments": ARGS}</tool_call>
    tool_choice "required"             the same, for any one of the tools

(a newline after the opening tag and before the closing one as the model likes). ARGS is
valid under the tool's `parameters` schema (any object without one). The call is
written in the Hermes tags the chat template and rlcode.serve.responses use, so the
response parses it into `tool_calls` as it parses an unconstrained one; once the call is
complete the grammar is, and the candidate ends ("tool_calls"). JSON is written with
compact separators (", " and ": "), the way json.dumps writes it. A schema llguidance
cannot compile is a 400 naming where it came from.
"""

from __future__ import annotations

import json

from rlcode.agent.chat import CALL_CLOSE, CALL_OPEN
from rlcode.engine.grammar import JSON_STYLE, Grammar
from rlcode.serve.bodies import refuse
from rlcode.serve.protocol import ChatRequest

def grammar_for(body: ChatRequest, tokenizer, vocab_size: int) -> Grammar | None:
  """The request's grammar, or None when nothing constrains its output."""
  forced = body.forced_tools()
  if forced is not None:
    tools = {t.function.name: (i, t) for i, t in enumerate(body.tools or [])}
    calls = [_call_schema(name, tools[name][1].function.parameters) for name in forced]
    defs = {k: v for c in calls for k, v in c.pop("$defs", {}).items()}
    call = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if defs:
      call = dict(call, **{"$defs": defs})
    lark = (f"start: {json.dumps(CALL_OPEN)} \"\\n\"? call \"\\n\"? {json.dumps(CALL_CLOSE)}\n"
            f"call: %json {json.dumps(dict(call, **{'x-guidance': JSON_STYLE}))}\n")
    where = (f"tools.{tools[forced[0]][0]}.function.parameters" if len(forced) == 1
             else "tools")
    return _compiled(lambda: Grammar.lark(tokenizer, vocab_size, lark), where)
  schema = body.json_format()
  if schema is None:
    return None
  where = ("response_format.json_schema.schema" if body.response_format.type == "json_schema"
           else "response_format")
  return _compiled(lambda: Grammar.json_schema(tokenizer, vocab_size, schema), where)


def _call_schema(name: str, parameters: dict | None) -> dict:
  """A call of tool `name` whose arguments match `parameters`; the parameters' own
  definitions ($defs, definitions) move to the call's root, renamed for the tool, and
  their references follow (a pydantic-made schema refers to #/$defs/...)."""
  params, defs = _hoisted(name, parameters if parameters else {"type": "object"})
  call = {"type": "object",
          "properties": {"name": {"const": name}, "arguments": params},
          "required": ["name", "arguments"], "additionalProperties": False}
  return dict(call, **({"$defs": defs} if defs else {}))


def _hoisted(name: str, schema: dict) -> tuple[dict, dict]:
  """(schema without its definitions, its definitions under "<name>.<def>"), every
  "#/$defs/<def>" or "#/definitions/<def>" inside rewritten to the new place."""
  defs = {**schema.get("definitions", {}), **schema.get("$defs", {})}
  if not defs:
    return schema, {}
  renamed = {f"#/{kind}/{d}": f"#/$defs/{name}.{d}"
             for kind in ("$defs", "definitions") for d in defs}

  def fix(node):
    if isinstance(node, dict):
      return {k: (renamed.get(v, v) if k == "$ref" and isinstance(v, str) else fix(v))
              for k, v in node.items()}
    return [fix(x) for x in node] if isinstance(node, list) else node

  body = fix({k: v for k, v in schema.items() if k not in ("$defs", "definitions")})
  return body, {f"{name}.{d}": fix(v) for d, v in defs.items()}


def _compiled(make, where: str) -> Grammar:
  try:
    return make()
  except (ValueError, TypeError, RuntimeError) as e:
    raise refuse(where, f"cannot be compiled into a grammar: {_first_line(e)}") from None


def _first_line(error: BaseException) -> str:
  return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
