"""From sampled tokens to the OpenAI response objects: text, stop strings, tool calls,
log-probs (streamed with their chunks when asked), streamed deltas.

A candidate's text is its tokens decoded without the stop token, cut before the first
stop string. A chat turn's Hermes tool calls (`<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`, the tags of rlcode.agent.chat) become `tool_calls`; a call whose JSON
does not parse stays in the content (the client sees what the model wrote). Streaming
holds back what could still turn out to be the start of a stop string or an unfinished
UTF-8 character. This module must not know about HTTP or the engine's threads.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence

from rlcode.agent.chat import CALL_CLOSE, CALL_OPEN

_CALL = re.compile(re.escape(CALL_OPEN) + r"\s*(.*?)\s*" + re.escape(CALL_CLOSE), re.DOTALL)


class Text:
  """Decodes one candidate's tokens, cutting at stop strings."""

  def __init__(self, tokenizer, stop_tokens: Sequence[int], stops: Sequence[str]):
    self.tokenizer, self.stop_tokens, self.stops = tokenizer, set(stop_tokens), list(stops)
    self.hold = max((len(s) for s in self.stops), default=1) - 1

  def raw(self, tokens: Sequence[int]) -> str:
    return self.tokenizer.decode([t for t in tokens if t not in self.stop_tokens])

  def cut(self, text: str) -> tuple[str, bool]:
    """The text before the first stop string, and whether one was found."""
    ends = [i for i in (text.find(s) for s in self.stops) if i >= 0]
    return (text[:min(ends)], True) if ends else (text, False)

  def stopped(self, tokens: Sequence[int]) -> bool:
    return bool(self.stops) and self.cut(self.raw(tokens))[1]

  def final(self, tokens: Sequence[int]) -> str:
    return self.cut(self.raw(tokens))[0]

  def safe(self, tokens: Sequence[int]) -> str:
    """What may be streamed so far: no partial character, nothing that may begin a stop."""
    text, found = self.cut(self.raw(tokens))
    if found:
      return text
    text = text.rstrip("\ufffd")
    return text[:len(text) - self.hold] if self.hold else text


def tool_calls(text: str) -> tuple[str | None, list[dict]]:
  """(the content outside the calls, or None when nothing is left; the parsed calls)."""
  calls, kept, at = [], [], 0
  for m in _CALL.finditer(text):
    try:
      call = json.loads(m.group(1))
    except ValueError:
      continue
    if not (isinstance(call, dict) and isinstance(call.get("name"), str)):
      continue
    args = call.get("arguments", {})
    kept.append(text[at:m.start()])
    at = m.end()
    calls.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                  "function": {"name": call["name"], "arguments": json.dumps(args)}})
  if not calls:
    return text, []
  content = ("".join(kept) + text[at:]).strip()
  return content or None, calls


def completion_logprobs(tokenizer, tokens, logprobs, tops, top_n: int, offset: int = 0) -> dict:
  """The legacy completions API's logprobs object, of tokens whose text starts at character
  `offset` of the completion (a streamed chunk's tokens follow the earlier chunks')."""
  strings = [tokenizer.decode([t]) for t in tokens]
  offsets, at = [], offset
  for s in strings:
    offsets.append(at)
    at += len(s)
  top = ([{tokenizer.decode([i]): lp for i, lp in row[:top_n]} for row in tops]
         if top_n else None)
  return {"tokens": strings, "token_logprobs": list(logprobs), "top_logprobs": top,
          "text_offset": offsets}


def chat_logprobs(tokenizer, tokens, logprobs, tops, top_n: int) -> dict:
  """The chat API's logprobs object. A token's `bytes` are the raw bytes it stands for:
  a byte token inside a UTF-8 character is its own byte, not U+FFFD's encoding."""
  def entry(t, lp):
    return {"token": tokenizer.decode([t]), "logprob": lp,
            "bytes": list(tokenizer.token_bytes(t))}
  return {"content": [dict(entry(t, lp), top_logprobs=[entry(i, x) for i, x in row[:top_n]])
                      for t, lp, row in zip(tokens, logprobs, tops)]}


def usage(prompt_tokens: int, candidates) -> dict:
  """OpenAI's usage object: the prompts' tokens (each counted once, whatever n) and every
  candidate's."""
  completion = sum(len(c.tokens) for c in candidates)
  return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
          "total_tokens": prompt_tokens + completion}
