"""The error object every refusal carries, and the checks of a body's shape before its
fields: no lone surrogate in any string or key, nesting at most MAX_DEPTH deep.
This module must not know about the engine or storage."""

from __future__ import annotations

from typing import Any

# Arrays and objects inside one another, the body itself the first: a JSON schema of tool
# parameters needs a handful, a body past this is an attack on the recursion limit.
MAX_DEPTH = 64


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


def refuse(param: str, message: str) -> APIError:
  return APIError(400, f"{param}: {message}", param=param, code="invalid_value")


def _escaped(key: str) -> str:
  return key.encode("utf-8", "backslashreplace").decode("utf-8")


def refused_shape(data) -> tuple[str, str] | None:
  """(path, why) of the first string or key in `data` that is not valid Unicode (a lone
  surrogate), or of the first array or object nested past MAX_DEPTH ("" for `data`
  itself); None when neither. Iterative: JSON nests as deep as it likes."""
  stack: list[tuple[str, Any, int]] = [("", data, 1)]
  while stack:
    path, value, depth = stack.pop()
    if isinstance(value, str):
      try:
        value.encode("utf-8")
      except UnicodeEncodeError:
        return path, "not valid Unicode text (a lone surrogate); send UTF-8 text"
      continue
    if not isinstance(value, (dict, list)):
      continue
    if depth > MAX_DEPTH:
      return path, (f"nested deeper than {MAX_DEPTH} arrays and objects; this server reads "
                    "no deeper")
    if isinstance(value, dict):
      for key, item in reversed(list(value.items())):
        sub = f"{path}.{_escaped(key)}" if path else _escaped(key)
        try:
          key.encode("utf-8")
        except UnicodeEncodeError:
          return sub, "not valid Unicode text (a lone surrogate); send UTF-8 text"
        stack.append((sub, item, depth + 1))
    else:
      stack.extend((f"{path}.{i}" if path else str(i), item, depth + 1)
                   for i, item in reversed(list(enumerate(value))))
  return None


def validation_error(exc) -> APIError:
  """A pydantic validation error as one 400 naming the first bad field."""
  errors = exc.errors()
  first = errors[0] if errors else {}
  loc = [str(x) for x in first.get("loc", ())]
  param = ".".join(loc) or None
  message = first.get("msg", "invalid request").removeprefix("Value error, ")
  if first.get("type") == "extra_forbidden":
    message = "unknown field: not one this endpoint has"
  return APIError(400, f"{param + ': ' if param else ''}{message}", param=param,
                  code="invalid_value")
