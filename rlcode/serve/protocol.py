"""The OpenAI-compatible request bodies, checked, and the error object every refusal carries.

Every byte a client sends is untrusted: each field has a type and a range here, and a body
that breaks them is a 400 whose OpenAI-style error names the field
({"error": {"message", "type", "param", "code"}}). Fields the API has and this server
ignores (user, presence_penalty at 0, ...) are accepted and dropped, so existing clients
work unchanged. This module must not know about the engine or storage.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_STOP = 4
MAX_STOP_CHARS = 256
MAX_SEED = 2**32 - 1


class APIError(Exception):
  """A refusal: the HTTP status and the error object's fields."""

  def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
               param: str | None = None, code: str | None = None):
    super().__init__(message)
    self.status, self.message, self.type, self.param, self.code = (status, message, type,
                                                                    param, code)

  def body(self) -> dict:
    return {"error": {"message": self.message, "type": self.type, "param": self.param,
                      "code": self.code}}


class _Sampling(BaseModel):
  """What both endpoints share."""

  model_config = ConfigDict(extra="ignore")

  model: str
  n: int = Field(1, ge=1)
  temperature: float = Field(1.0, ge=0.0, le=2.0)
  top_p: float = Field(1.0, gt=0.0, le=1.0)
  stream: bool = False
  stop: str | list[str] | None = Field(None, validate_default=True)
  seed: int | None = Field(None, ge=0, le=MAX_SEED)
  max_tokens: int | None = None

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


class CompletionRequest(_Sampling):
  """POST /v1/completions."""

  prompt: str | list[int] | list[str]
  max_tokens: int | None = 16
  logprobs: int | None = Field(None, ge=0, le=5)
  echo: Literal[False] = False

  @field_validator("prompt")
  @classmethod
  def _prompt(cls, value):
    if isinstance(value, list) and value and isinstance(value[0], str):
      if len(value) != 1:
        raise ValueError("one prompt per request (send a list of one string)")
      value = value[0]
    if isinstance(value, list) and any(t < 0 for t in value):
      raise ValueError("token ids must be non-negative")
    if len(value) == 0:
      raise ValueError("the prompt is empty")
    return value


class ToolFunction(BaseModel):
  model_config = ConfigDict(extra="allow")
  name: str
  arguments: Any = None


class ToolCall(BaseModel):
  model_config = ConfigDict(extra="allow")
  id: str | None = None
  type: str = "function"
  function: ToolFunction


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


class ChatRequest(_Sampling):
  """POST /v1/chat/completions."""

  messages: list[Message] = Field(min_length=1)
  tools: list[dict[str, Any]] | None = None
  tool_choice: Any = None
  max_completion_tokens: int | None = None
  logprobs: bool = False
  top_logprobs: int | None = Field(None, ge=0, le=5)

  @model_validator(mode="after")
  def _budget(self):
    if self.max_tokens is None and self.max_completion_tokens is not None:
      if self.max_completion_tokens < 1:
        raise ValueError("max_completion_tokens must be at least 1")
      self.max_tokens = self.max_completion_tokens
    if self.top_logprobs and not self.logprobs:
      raise ValueError("top_logprobs needs logprobs: true")
    return self

  def template_messages(self) -> list[dict]:
    """The messages as a chat template reads them (content as text; a tool call's
    arguments as an object, which templates write with tojson)."""
    import json
    out = []
    for m in self.messages:
      d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role,
                           "content": m.text()}
      if m.tool_calls:
        calls = []
        for call in m.tool_calls:
          args = call.function.arguments
          if isinstance(args, str):
            try:
              args = json.loads(args)
            except ValueError:
              raise ValueError("a tool call's arguments must be a JSON object") from None
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


def validation_error(exc) -> APIError:
  """A pydantic or FastAPI validation error as one 400 naming the first bad field."""
  errors = exc.errors()
  first = errors[0] if errors else {}
  loc = [str(x) for x in first.get("loc", ()) if x != "body"]
  param = ".".join(loc) or None
  message = first.get("msg", "invalid request")
  if first.get("type") == "json_invalid":
    return APIError(400, "the body is not valid JSON", code="invalid_json")
  return APIError(400, f"{param + ': ' if param else ''}{message}", param=param,
                  code="invalid_value")
