"""The OpenAI-compatible request bodies, checked, and the error object every refusal carries.

Every byte a client sends is untrusted. `parse` reads a body: JSON, an object, nested at
most MAX_DEPTH arrays and objects deep (the chat template, the log and pydantic all
recurse, and a tool's parameters nested ~1000 deep ran them out of stack), and text that
is valid Unicode: a lone surrogate ("\\ud800", which JSON's escapes can spell) is refused
with the path of the string that holds it, since no tokenizer, log or response can encode
it; either refusal names the path. Then each field has a type and a range here, and a body
that breaks them is a 400 whose OpenAI-style error names the field
({"error": {"message", "type", "param", "code"}}).

Every field of OpenAI's completions and chat-completions requests is honoured or refused
by name, never dropped: a field this server cannot honour (`logit_bias`, penalties other
than 0, `parallel_tool_calls` false with tool_choice "auto", ...) is accepted only at the
value that asks for nothing, and any other value is a 400 that says why; a field OpenAI
does not have is a 400 as well. `response_format` (a JSON object, or JSON under a schema)
and `tool_choice` "required" or naming a function are honoured by constrained decoding
(rlcode.serve.constrain).
`user` and `metadata` are kept with the completion in the interaction log. This module
must not know about the engine or storage.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from rlcode.serve.bodies import MAX_DEPTH, APIError, validation_error
from rlcode.serve.bodies import refuse as _refuse
from rlcode.serve.bodies import refused_shape as _refused_shape

__all__ = ["MAX_DEPTH", "APIError", "ChatRequest", "CompletionRequest", "FeedbackRequest",
           "parse", "validation_error"]

MAX_STOP = 4
MAX_STOP_CHARS = 256
MAX_SEED = 2**32 - 1
MAX_PROMPTS = 16
MAX_METADATA = 16


# OpenAI's fields this server cannot honour: the values that ask for nothing (accepted and
# dropped) and why any other value is refused.
_NOT_HONOURED = {
    "frequency_penalty": ((None, 0), "penalties are not implemented; only 0 is accepted"),
    "presence_penalty": ((None, 0), "penalties are not implemented; only 0 is accepted"),
    "logit_bias": ((None, {}), "biasing tokens is not implemented; only {} is accepted"),
}
_NOT_HONOURED_COMPLETIONS = {
    "echo": ((None, False), "echoing the prompt is not implemented; only false is accepted"),
    "suffix": ((None, ""), "completing before a suffix (insertion) is not implemented"),
}
_NOT_HONOURED_CHAT = {
    "audio": ((None,), "this model writes text only"),
    "modalities": ((None, ["text"]), "this model writes text only; only [\"text\"]"),
    "prediction": ((None,), "predicted outputs are not implemented"),
    "reasoning_effort": ((None,), "this model has no reasoning setting"),
    "web_search_options": ((None,), "this server has no web search"),
    "functions": ((None,), "deprecated by OpenAI; send tools"),
    "function_call": ((None,), "deprecated by OpenAI; send tool_choice"),
    "service_tier": ((None, "auto", "default"), "this server has one tier: auto or default"),
    "store": ((None, True), ("every completion is stored in the interaction log, which the "
                             "online learner reads; store=false cannot be honoured")),
}


def _asks_nothing(raw: dict, table: dict) -> dict:
  """`raw` without the fields of `table` once each holds a value that asks for nothing."""
  out = dict(raw)
  for key, (accepted, why) in table.items():
    if key not in out:
      continue
    value = out.pop(key)
    if not any(_same(value, a) for a in accepted):
      raise _refuse(key, f"{json.dumps(value)} is not supported: {why}")
  return out


def _same(value, accepted) -> bool:
  if accepted is None or isinstance(value, bool) or isinstance(accepted, bool):
    # bool is an int in Python: false must not pass as a penalty of 0, nor 0 as false.
    return value is accepted
  return value == accepted


# Sampling fields whose JSON null means "the default", as in OpenAI's API.
_NULL_IS_DEFAULT = frozenset({"n", "temperature", "top_p", "stream", "logprobs",
                              "top_logprobs", "tool_choice"})


class StreamOptions(BaseModel):
  model_config = ConfigDict(extra="forbid")
  include_usage: bool = False


class _Sampling(BaseModel):
  """What both endpoints share."""

  model_config = ConfigDict(extra="forbid")

  model: str
  n: int = Field(1, ge=1)
  temperature: float = Field(1.0, ge=0.0, le=2.0)
  top_p: float = Field(1.0, gt=0.0, le=1.0)
  stream: bool = False
  stream_options: StreamOptions | None = None
  stop: str | list[str] | None = Field(None, validate_default=True)
  seed: int | None = Field(None, ge=0, le=MAX_SEED)
  max_tokens: int | None = None
  user: str | None = Field(None, max_length=256)

  @model_validator(mode="before")
  @classmethod
  def _honoured(cls, raw):
    if not isinstance(raw, dict):
      return raw
    # OpenAI's API takes null for an optional field as its default, and clients send it so.
    raw = {k: v for k, v in raw.items() if not (v is None and k in _NULL_IS_DEFAULT)}
    return _asks_nothing(raw, _NOT_HONOURED)

  @field_validator("stop")
  @classmethod
  def _stop(cls, value):
    stops = [value] if isinstance(value, str) else list(value or [])
    if len(stops) > MAX_STOP:
      raise ValueError(f"at most {MAX_STOP} stop sequences")
    if any(not s or len(s) > MAX_STOP_CHARS for s in stops):
      raise ValueError(f"stop sequences must have 1 to {MAX_STOP_CHARS} characters")
    return stops

  @field_validator("max_tokens")
  @classmethod
  def _max_tokens(cls, value):
    if value is not None and value < 1:
      raise ValueError("max_tokens must be at least 1")
    return value

  @model_validator(mode="after")
  def _stream_options(self):
    if self.stream_options is not None and not self.stream:
      raise _refuse("stream_options", "only allowed when stream is true")
    return self

  @property
  def include_usage(self) -> bool:
    return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Sampling):
  """POST /v1/completions. `prompt` is a string, token ids, or a list of either (up to
  MAX_PROMPTS prompts, each answered by n choices: choice p*n + j is prompt p's j-th)."""

  prompt: str | list[int] | list[str] | list[list[int]]
  max_tokens: int | None = 16
  logprobs: int | None = Field(None, ge=0, le=5)
  best_of: int | None = Field(None, ge=1)

  @model_validator(mode="before")
  @classmethod
  def _honoured_here(cls, raw):
    return _asks_nothing(raw, _NOT_HONOURED_COMPLETIONS) if isinstance(raw, dict) else raw

  @field_validator("prompt", mode="before")
  @classmethod
  def _prompt_shape(cls, value):
    ids = lambda x: isinstance(x, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in x)
    if not (isinstance(value, str) or ids(value) or isinstance(value, list) and (
        all(isinstance(x, str) for x in value) or all(ids(x) for x in value))):
      raise ValueError("must be a string, a list of token ids, or a list of strings or of "
                       "token-id lists")
    return value

  @field_validator("prompt")
  @classmethod
  def _prompt(cls, value):
    many = isinstance(value, list) and bool(value) and not isinstance(value[0], int)
    prompts = value if many else [value]
    if len(prompts) > MAX_PROMPTS:
      raise ValueError(f"at most {MAX_PROMPTS} prompts in one request, got {len(prompts)}")
    for i, prompt in enumerate(prompts):
      where = f"prompt {i} " if many else ""
      if len(prompt) == 0:
        raise ValueError(f"the {where}is empty" if many else "the prompt is empty")
      if isinstance(prompt, list) and any(t < 0 for t in prompt):
        raise ValueError(f"{where}token ids must be non-negative")
    return value

  @model_validator(mode="after")
  def _best_of(self):
    if self.best_of is not None and self.best_of != self.n:
      raise _refuse("best_of", f"{self.best_of} with n={self.n}: choosing the best of more "
                    "candidates than are returned is not implemented; send best_of equal "
                    "to n or leave it out")
    return self

  def prompts(self) -> list[str | list[int]]:
    """The prompts, one or several."""
    many = isinstance(self.prompt, list) and not isinstance(self.prompt[0], int)
    return list(self.prompt) if many else [self.prompt]


class ToolFunction(BaseModel):
  model_config = ConfigDict(extra="allow")
  name: str
  arguments: Any = None


class ToolCall(BaseModel):
  model_config = ConfigDict(extra="allow")
  id: str | None = None
  type: str = "function"
  function: ToolFunction


class FunctionSpec(BaseModel):
  """A tool's function as OpenAI defines it (its name as OpenAI allows names)."""

  model_config = ConfigDict(extra="forbid")
  name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
  description: str | None = None
  parameters: dict[str, Any] | None = None
  strict: bool | None = None

  @field_validator("strict")
  @classmethod
  def _strict(cls, value):
    if value:
      raise ValueError("arguments that always match the schema are honoured when "
                       "tool_choice forces a call (\"required\" or this function), not per "
                       "tool; send strict false or leave it out")
    return value


class Tool(BaseModel):
  model_config = ConfigDict(extra="forbid")
  type: Literal["function"]
  function: FunctionSpec


class Message(BaseModel):
  model_config = ConfigDict(extra="allow")
  role: Literal["system", "developer", "user", "assistant", "tool"]
  content: str | list[dict[str, Any]] | None = None
  tool_calls: list[ToolCall] | None = None
  tool_call_id: str | None = None
  name: str | None = None

  def text(self) -> str:
    """The content as text (a list of parts: its text parts joined)."""
    if isinstance(self.content, list):
      parts = []
      for part in self.content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
          raise ValueError("only text content parts are supported")
        parts.append(part["text"])
      return "".join(parts)
    return self.content or ""


class NamedFunction(BaseModel):
  model_config = ConfigDict(extra="forbid")
  name: str


class NamedToolChoice(BaseModel):
  """tool_choice {"type": "function", "function": {"name": ...}}: that call, always."""

  model_config = ConfigDict(extra="forbid")
  type: Literal["function"]
  function: NamedFunction


class JsonSchemaFormat(BaseModel):
  model_config = ConfigDict(extra="forbid")
  name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
  description: str | None = None
  schema_: dict[str, Any] | None = Field(None, alias="schema")
  strict: bool | None = None


class ResponseFormat(BaseModel):
  """response_format: "text" (no constraint), "json_object" (one JSON object) or
  "json_schema" (JSON valid under json_schema.schema; without one, any JSON object)."""

  model_config = ConfigDict(extra="forbid")
  type: Literal["text", "json_object", "json_schema"]
  json_schema: JsonSchemaFormat | None = None

  @model_validator(mode="after")
  def _schema_with_its_type(self):
    if (self.type == "json_schema") != (self.json_schema is not None):
      raise ValueError("json_schema is required with type json_schema, and only then")
    return self


class ChatRequest(_Sampling):
  """POST /v1/chat/completions. `tool_choice` "auto" (the default) parses the tool calls
  the model writes; "none" returns its text as content, calls unparsed; "required" and a
  named function constrain the output to one call (of any tool, or of that one) whose
  arguments match the tool's parameters."""

  messages: list[Message] = Field(min_length=1)
  tools: list[Tool] | None = None
  tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
  response_format: ResponseFormat | None = None
  parallel_tool_calls: bool | None = None
  max_completion_tokens: int | None = None
  logprobs: bool = False
  top_logprobs: int | None = Field(None, ge=0, le=5)
  metadata: dict[str, str] | None = Field(None, max_length=MAX_METADATA)

  @model_validator(mode="before")
  @classmethod
  def _honoured_here(cls, raw):
    if not isinstance(raw, dict):
      return raw
    return _asks_nothing(raw, _NOT_HONOURED_CHAT)

  @field_validator("tool_choice", mode="before")
  @classmethod
  def _tool_choice_shape(cls, value):
    named = (isinstance(value, dict) and value.get("type") == "function"
             and isinstance(value.get("function"), dict)
             and isinstance(value["function"].get("name"), str))
    if not (value in ("auto", "none", "required") or named):
      raise ValueError('must be "auto", "none", "required" or {"type": "function", '
                       '"function": {"name": ...}}')
    return value

  @model_validator(mode="after")
  def _budget(self):
    if self.max_completion_tokens is not None:
      if self.max_completion_tokens < 1:
        raise _refuse("max_completion_tokens", "must be at least 1")
      if self.max_tokens is not None and self.max_tokens != self.max_completion_tokens:
        raise _refuse("max_completion_tokens", f"{self.max_completion_tokens} contradicts "
                      f"max_tokens={self.max_tokens}; send one of them")
      self.max_tokens = self.max_completion_tokens
    if self.top_logprobs and not self.logprobs:
      raise _refuse("top_logprobs", "needs logprobs: true")
    self._check_tool_choice()
    return self

  def _check_tool_choice(self) -> None:
    names = [t.function.name for t in self.tools or []]
    forced = self.forced_tools()
    if forced is not None and not names:
      raise _refuse("tool_choice", "forcing a tool call needs tools")
    if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
      raise _refuse("tool_choice.function.name", f"{self.tool_choice.function.name!r} is "
                    f"not one of the tools ({', '.join(names)})")
    if forced is not None and self.json_format() is not None:
      raise _refuse("response_format", "a JSON response_format contradicts a forced tool "
                    "call; send one of them")
    if self.parallel_tool_calls is False and forced is None and self.parses_tool_calls():
      raise _refuse("parallel_tool_calls", "false (at most one call) is honoured when "
                    "tool_choice forces a call; with \"auto\" every call the model writes "
                    "is returned")

  def forced_tools(self) -> list[str] | None:
    """The tools one of which the output must call (tool_choice "required" or a named
    function), or None."""
    if isinstance(self.tool_choice, NamedToolChoice):
      return [self.tool_choice.function.name]
    if self.tool_choice == "required":
      return [t.function.name for t in self.tools or []]
    return None

  def json_format(self) -> dict | None:
    """The JSON schema response_format asks for, or None (text)."""
    fmt = self.response_format
    if fmt is None or fmt.type == "text":
      return None
    if fmt.type == "json_object" or fmt.json_schema.schema_ is None:
      return {"type": "object"}
    return fmt.json_schema.schema_

  def parses_tool_calls(self) -> bool:
    return bool(self.tools) and self.tool_choice != "none"

  def template_tools(self) -> list[dict] | None:
    """The tools as a chat template reads them (OpenAI's objects, unset fields left out)."""
    return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None

  def template_messages(self) -> list[dict]:
    """The messages as a chat template reads them (content as text; a tool call's
    arguments as an object, which templates write with tojson)."""
    out = []
    for i, m in enumerate(self.messages):
      d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role,
                           "content": m.text()}
      if m.tool_calls:
        calls = []
        for j, call in enumerate(m.tool_calls):
          args = call.function.arguments
          if isinstance(args, str):
            where = f"messages.{i}.tool_calls.{j}.function.arguments"
            try:
              args = json.loads(args)
            except (ValueError, RecursionError):
              raise _refuse(where, "a tool call's arguments must be a JSON object") from None
            # Text the body's walk saw as one string: the template writes what it holds.
            refused = _refused_shape(args)
            if refused is not None:
              raise _refuse(where + ("." + refused[0] if refused[0] else ""), refused[1])
          calls.append({"id": call.id, "type": "function",
                        "function": {"name": call.function.name, "arguments": args}})
        d["tool_calls"] = calls
      if m.tool_call_id is not None:
        d["tool_call_id"] = m.tool_call_id
      if m.name is not None:
        d["name"] = m.name
      out.append(d)
    return out


class FeedbackRequest(BaseModel):
  """POST /v1/feedback: what the user did with completion `id`."""

  model_config = ConfigDict(extra="forbid")

  id: str = Field(min_length=1, max_length=64)
  accepted: bool | None = None
  rejected: bool | None = None
  kept: float | None = Field(None, ge=0.0, le=1.0)
  chosen: int | None = Field(None, ge=0)
  index: int | None = Field(None, ge=0)
  final_text: str | None = Field(None, max_length=200_000)

  @model_validator(mode="after")
  def _something(self):
    if all(getattr(self, k) is None for k in ("accepted", "rejected", "kept", "chosen",
                                              "final_text")):
      raise ValueError("feedback needs at least one of accepted, rejected, kept, chosen, "
                       "final_text")
    if self.accepted is not None and self.rejected is not None and (
        self.accepted == self.rejected):
      raise ValueError("accepted and rejected contradict each other")
    return self


def parse(model: type[BaseModel], body: bytes) -> BaseModel:
  """`body` read as `model`, or an APIError (400) naming what was wrong."""
  try:
    data = json.loads(body)
  except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested past the parser
    raise APIError(400, "the body is not valid JSON", code="invalid_json") from None
  refused = _refused_shape(data)
  if refused is not None:
    bad, why = refused[0] or "body", refused[1]
    raise APIError(400, f"{bad}: {why}", param=bad, code="invalid_value")
  if not isinstance(data, dict):
    raise APIError(400, "the body must be a JSON object", code="invalid_value")
  try:
    return model.model_validate(data)
  except ValidationError as e:
    raise validation_error(e) from None
