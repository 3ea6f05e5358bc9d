"""A checkpoint's chat template: messages (and tools) to the prompt text its model was tuned on.

Hugging Face checkpoints ship a Jinja template in `tokenizer_config.json` ("chat_template":
a string, or a list of named templates such as "default" and "tool_use") or in a
`chat_template.jinja` file beside it. `ChatTemplate.render` runs it as transformers'
`apply_chat_template(..., tokenize=False)` does: a sandboxed, immutable Jinja environment
(templates come with downloaded checkpoints: untrusted code), trim_blocks and
lstrip_blocks, the loop-controls extension, `raise_exception`, `tojson` (unescaped, keys
in order), `strftime_now`, and the checkpoint's special tokens (bos_token, eos_token, ...)
as variables. `encode` tokenises the text without adding special tokens again, as
`apply_chat_template(..., tokenize=True)` does.

Training templates mark the assistant's text with `{% generation %}...{% endgeneration %}`.
The block renders its body unchanged; `render_spans` also returns where each such body
starts and ends in the text, and `assistant_mask` turns those spans into a mask over the
text's tokens, as `apply_chat_template(..., return_assistant_tokens_mask=True)` does
(`assistant_masks`: a token counts when it overlaps a span).

Tokenizers without a template (the tiny byte-level ones) use `fallback_prompt`: the
compact format of rlcode.agent.chat, role by role. This module must not know about
serving or sampling.
"""

from __future__ import annotations

import contextvars
import dataclasses
import datetime
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rlcode.errors import BadInput

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token",
                      "cls_token", "mask_token")
TEMPLATE_FILE = "chat_template.jinja"


class TemplateError(BadInput):
  """The template refused the messages (its raise_exception), or failed on them."""


def _raise_exception(message):
  raise TemplateError(f"the chat template refused the messages: {message}")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
  # transformers' tojson: unescaped (Jinja's own escapes for HTML), keys in their order.
  return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                    sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
  return datetime.datetime.now().strftime(fmt)


class _Tracker:
  """The characters a render has produced so far, and the generation spans seen."""

  def __init__(self):
    self.length = 0
    self.spans: list[tuple[int, int]] = []


# The render in progress on this thread that wants spans (None: a plain render).
_TRACKER: contextvars.ContextVar[_Tracker | None] = contextvars.ContextVar(
    "chat_template_tracker", default=None)
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


def _generation_extension():
  from jinja2 import nodes
  from jinja2.ext import Extension

  class Generation(Extension):
    """`{% generation %}body{% endgeneration %}`: the body as is; during `render_spans`,
    its (start, end) in the output. The output before the block is counted as it is
    streamed out, so a block inside a `set` block or a macro is placed where that
    block was evaluated, as transformers places it."""

    tags = {"generation"}

    def parse(self, parser):
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
      return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
      text = caller()
      tracker = _TRACKER.get()
      if tracker is not None:
        tracker.spans.append((tracker.length, tracker.length + len(text)))
      return text

  return Generation


def _environment():
  from jinja2.ext import loopcontrols
  from jinja2.sandbox import ImmutableSandboxedEnvironment
  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                      extensions=[loopcontrols, _generation_extension()])
  env.filters["tojson"] = _tojson
  env.globals["raise_exception"] = _raise_exception
  env.globals["strftime_now"] = _strftime_now
  return env


def _token_text(value) -> str | None:
  """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
  if isinstance(value, Mapping):
    value = value.get("content")
  return value if isinstance(value, str) else None


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
  """The template source(s) and the special tokens a render sees.

  Attributes:
    templates: name -> Jinja source ("default" always; "tool_use" where the checkpoint has
      one, used when tools are given).
    special_tokens: bos_token, eos_token, ... -> their text.
  """

  templates: Mapping[str, str]
  special_tokens: Mapping[str, str]

  def __post_init__(self):
    if "default" not in self.templates:
      raise BadInput(f"a chat template set needs a 'default' template; it has "
                     f"{sorted(self.templates)}")

  def _name(self, tools) -> str:
    return "tool_use" if tools and "tool_use" in self.templates else "default"

  def marks_generation(self, tools: Sequence | None = None) -> bool:
    """Whether the template used with `tools` marks the assistant's text with
    `{% generation %}`."""
    return bool(_GENERATION_TAG.search(self.templates[self._name(tools)]))

  def render(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence | None = None,
             add_generation_prompt: bool = True, **kwargs) -> str:
    """The prompt text of `messages` (and `tools`), as the checkpoint's template writes it."""
    return self._render(messages, tools, add_generation_prompt, kwargs, None)

  def render_spans(self, messages: Sequence[Mapping[str, Any]], *,
                   tools: Sequence | None = None, add_generation_prompt: bool = True,
                   **kwargs) -> tuple[str, list[tuple[int, int]]]:
    """The text `render` gives, and the (start, end) characters of each
    `{% generation %}` block in it, in order. A template without the tag has none: ask
    `marks_generation` first where that matters."""
    tracker = _Tracker()
    text = self._render(messages, tools, add_generation_prompt, kwargs, tracker)
    return text, tracker.spans

  def _render(self, messages, tools, add_generation_prompt, kwargs, tracker):
    import jinja2
    try:
      template = _compiled(self.templates[self._name(tools)])
      variables = dict(messages=list(messages), tools=list(tools) if tools else None,
                       add_generation_prompt=add_generation_prompt,
                       **self.special_tokens, **kwargs)
      if tracker is None:
        return template.render(**variables)
      token = _TRACKER.set(tracker)
      try:
        out = []
        for chunk in template.generate(**variables):
          out.append(chunk)
          tracker.length += len(chunk)
        return "".join(out)
      finally:
        _TRACKER.reset(token)
    except TemplateError:
      raise
    except jinja2.exceptions.SecurityError as e:
      raise TemplateError(f"the chat template did something its sandbox forbids: {e}") from None
    except jinja2.exceptions.TemplateError as e:
      raise TemplateError(f"the chat template failed: {e}") from None
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
      # What a template does with malformed messages (a missing key, a wrong type).
      raise TemplateError(f"the chat template failed on these messages: "
                          f"{type(e).__name__}: {e}") from None


_CACHE: dict[str, Any] = {}


def _compiled(source: str):
  if source not in _CACHE:
    _CACHE[source] = _environment().from_string(source)
  return _CACHE[source]


def load_chat_template(path: str) -> ChatTemplate | None:
  """The chat template of a checkpoint or tokenizer directory, or None when it has none."""
  if not os.path.isdir(path):
    return None
  config_path = os.path.join(path, "tokenizer_config.json")
  saved: dict = {}
  if os.path.isfile(config_path):
    with open(config_path, encoding="utf-8") as f:
      saved = json.load(f)
  templates: dict[str, str] = {}
  raw = saved.get("chat_template")
  if isinstance(raw, str):
    templates["default"] = raw
  elif isinstance(raw, list):
    templates = {t["name"]: t["template"] for t in raw
                 if isinstance(t, Mapping) and "name" in t and "template" in t}
  file = os.path.join(path, TEMPLATE_FILE)
  if os.path.isfile(file):  # the file wins, as in transformers
    with open(file, encoding="utf-8") as f:
      templates["default"] = f.read()
  if not templates:
    return None
  specials = {k: t for k in SPECIAL_TOKEN_KEYS if (t := _token_text(saved.get(k))) is not None}
  return ChatTemplate(templates, specials)


def fallback_prompt(messages: Sequence[Mapping[str, Any]], tools: Sequence | None = None) -> str:
  """The prompt of a tokenizer without a template: the compact format of rlcode.agent.chat
  (the tools named in one line, a system turn as a line, each user turn as "task: ...", a
  tool's result inside <tool_response></tool_response>, the assistant's turns as they
  are)."""
  out = []
  if tools:
    names = [t.get("function", t).get("name", "") for t in tools if isinstance(t, Mapping)]
    out.append("tools: " + ", ".join(names) + "\n")
  for m in messages:
    content = m.get("content") or ""
    role = m.get("role")
    if role == "user":
      out.append(f"task: {content}\n")
    elif role == "tool":
      out.append(f"<tool_response>{content}</tool_response>")
    else:
      out.append(content if role == "assistant" else f"{content}\n")
  return "".join(out)


def encode(tokenizer, text: str) -> list[int]:
  """`text` as token ids without special tokens added (the template wrote them)."""
  return tokenizer.encode(text, add_special_tokens=False)


def span_mask(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[int]:
  """1 for each token (its (start, end) characters, in order) that overlaps one of `spans`
  (in order), else 0: transformers' `assistant_masks`, where a token cut by a span's edge
  counts as the assistant's."""
  mask, i = [0] * len(offsets), 0
  for t, (start, end) in enumerate(offsets):
    while i < len(spans) and start >= spans[i][1]:
      i += 1
    if i == len(spans):
      break
    mask[t] = int(end > spans[i][0])
  return mask


def assistant_mask(tokenizer, text: str, spans: Sequence[tuple[int, int]]
                   ) -> tuple[list[int], list[int]]:
  """`text`'s token ids (as `encode` gives them) and the mask of those inside `spans`
  (`render_spans`). The tokenizer must give offsets (`encode_offsets`: a tokenizer.json)."""
  if not hasattr(tokenizer, "encode_offsets"):
    raise BadInput(f"{type(tokenizer).__name__} gives no token offsets, which a mask from a "
                   "chat template's generation spans needs; use a tokenizer.json tokenizer")
  ids, offsets = tokenizer.encode_offsets(text)
  return ids, span_mask(offsets, spans)
