"""The chat format of a tool-calling episode: how text becomes the tokens the policy sees.

Three formats:
  "template": the checkpoint's own chat template (rlcode.models.chat_template): the
    prompt is its rendering of the task as the user turn with the tools' schemas, and
    the text around an observation is what the template writes between an assistant
    turn and the next one's generation prompt, found once by rendering a placeholder
    conversation (so a template must extend a conversation by appending to it, as the
    Qwen, Llama and Mistral templates do; one that rewrites earlier turns is refused).
  "hermes": the Qwen2.5 / Hermes tool-calling template, so a chat-tuned checkpoint
    reads its prompts as it was trained to: a system turn listing the tools' JSON
    schemas inside <tools></tools>, the task as the user turn, each call as
    `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in an assistant turn,
    each observation as a user turn inside <tool_response></tool_response>.
  "compact": the same tags without the chat turns, and the tools named in one line
    (no schemas), for byte-level policies trained from scratch: their context is
    short, and they learn the calls' arguments from their warm start's examples.

The assistant-token mask: a turn's own tokens are the assistant's. Where the template marks
the assistant's text with `{% generation %}` (a training template), the text it writes
around an observation is the assistant's where a generation block covers it (the
end-of-turn token after a call, typically): `observation_mask` gives those tokens 1, as
transformers' `return_assistant_tokens_mask` does on the rendered conversation. A
demonstration (rlcode.agent.expert) is trained so; the sampler keeps such tokens at 0,
since the policy did not sample them and they have no behaviour log-probability for the
clipped ratio. A template whose generation blocks miss the assistant's turn, or cover a
tool's result, is refused.

A turn of the policy ends at the closing call tag or at an end-of-sequence token,
so the closing tag must be one token of the tokenizer (it is in Qwen2.5's
vocabulary, and in the "bytes+tools" tokenizer). Observations are encoded alone and
appended to the trajectory's tokens: nothing is ever re-tokenised from text.

This module must not know about sandboxes, sampling or rewards.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from rlcode.errors import BadInput
from rlcode.models import chat_template as chat_template_lib

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
FORMATS = ("compact", "hermes", "template")
# Stand-ins rendered through a template to find where a turn's text and an observation go.
_TURN, _OBSERVATION = "\u2063TURN\u2063", "\u2063OBSERVATION\u2063"

_HERMES_SYSTEM = (
    "You are a coding agent working in a sandboxed workspace. You may call one or more "
    "functions to complete the task. The function signatures are inside <tools></tools>:\n"
    "<tools>\n{schemas}\n</tools>\n"
    "To call a function, reply with a JSON object naming it and giving its arguments, "
    "inside <tool_call></tool_call> tags:\n"
    "<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n"
    "</tool_call>")


def untrusted_text(text: str, max_bytes: int) -> tuple[str, bool]:
  """`text` as valid Unicode (lone surrogates, as undecodable file names come back,
  replaced) cut in the middle to at most `max_bytes` of UTF-8 with a marker saying how
  much went; and whether it was cut."""
  # A lone surrogate becomes its three bytes, decoded as replacement characters (U+FFFD),
  # as undecodable bytes of a file are.
  clean = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
  data = clean.encode("utf-8")
  if len(data) <= max_bytes:
    return clean, False
  marker = f"\n[... {len(data)} bytes, {len(data) - max_bytes} cut ...]\n"
  keep = max(max_bytes - len(marker), 0)
  # A character cut at either edge is dropped (never more bytes than kept).
  head = data[:keep - keep // 2].decode("utf-8", "ignore")
  tail = data[len(data) - keep // 2:].decode("utf-8", "ignore")
  return head + marker + tail, True


@dataclasses.dataclass(frozen=True)
class ChatFormat:
  """A named format bound to a tokenizer.

  Attributes:
    name: one of FORMATS.
    tokenizer: encodes and decodes; must have `special_id` (rlcode.models.tokenizer).
  """

  name: str
  tokenizer: object

  def __post_init__(self):
    if self.name not in FORMATS:
      raise BadInput(f"agent.chat_format={self.name!r}; known: {list(FORMATS)}")
    if self.name == "template" and self.template is None:
      raise BadInput("agent.chat_format='template': the tokenizer has no chat template "
                     "(its tokenizer_config.json or chat_template.jinja); use 'compact'")
    if self.close_id is None:
      raise BadInput(f"the tokenizer has no single token for {CALL_CLOSE!r}, which ends a "
                     "policy turn; use a tokenizer with the tool-calling tags "
                     "(for example 'bytes+tools', or a Qwen2.5 checkpoint's)")

  @property
  def template(self):
    return getattr(self.tokenizer, "chat_template", None)

  @property
  def close_id(self) -> int | None:
    return self.tokenizer.special_id(CALL_CLOSE)

  @property
  def stop_ids(self) -> tuple[int, ...]:
    """Tokens that end a policy turn: the closing call tag, and end-of-sequence."""
    return (self.close_id, *self.tokenizer.eos_ids)

  def system(self, tools: Sequence) -> str:
    """The tool listing: JSON schemas (hermes) or the tools' names (compact)."""
    if self.name == "hermes":
      schemas = "\n".join(json.dumps(t.schema(), sort_keys=True) for t in tools)
      return _HERMES_SYSTEM.format(schemas=schemas)
    return "tools: " + ", ".join(t.name for t in tools)

  def prompt_text(self, tools: Sequence, task_text: str) -> str:
    if self.name == "template":
      return self.template.render([{"role": "user", "content": task_text}],
                                  tools=[t.schema() for t in tools], add_generation_prompt=True)
    if self.name == "hermes":
      return (f"<|im_start|>system\n{self.system(tools)}<|im_end|>\n"
              f"<|im_start|>user\n{task_text}<|im_end|>\n<|im_start|>assistant\n")
    return f"{self.system(tools)}\ntask: {task_text}\n"

  def prompt_tokens(self, tools: Sequence, task_text: str) -> list[int]:
    """The episode's prompt (with the tokenizer's BOS, if it adds one; a template writes
    its own)."""
    text = self.prompt_text(tools, task_text)
    if self.name == "template":
      return self.tokenizer.encode(text, add_special_tokens=False)
    return self.tokenizer.encode(text)

  def _bare(self, text: str) -> list[int]:
    """`text` encoded without the BOS the tokenizer may prepend."""
    ids = self.tokenizer.encode(text)
    bos = len(self.tokenizer.encode(""))
    return ids[bos:]

  def observation_parts(self) -> tuple[str, str]:
    """The text around an observation (after the policy's closing tag)."""
    if self.name == "template":
      return _template_observation_parts(self.template)
    if self.name == "hermes":
      return ("<|im_end|>\n<|im_start|>user\n<tool_response>\n",
              "\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    return "<tool_response>", "</tool_response>"

  def observation_mask(self, n: int) -> list[int]:
    """The assistant-token mask of `n` observation tokens (as `observation_tokens` gives
    them): 1 on the text the template writes inside a generation block, 0 elsewhere and
    always on the observation itself."""
    head, tail = ([], []) if self.name != "template" else self._observation_part_masks()
    return head + [0] * (n - len(head) - len(tail)) + tail

  def _observation_part_masks(self) -> tuple[list[int], list[int]]:
    parts, spans = _template_observation_spans(self.template)
    if not spans:
      return [], []
    masks = []
    for text, part_spans in zip(parts, spans):
      ids, mask = chat_template_lib.assistant_mask(self.tokenizer, text, part_spans)
      if ids != self._bare(text):
        raise BadInput("agent.chat_format='template': the tokenizer adds tokens of its own "
                       "to the text around an observation, so its generation spans cannot "
                       "be placed on the episode's tokens")
      masks.append(mask)
    return masks[0], masks[1]

  def observation_tokens(self, text: str, max_tokens: int,
                         max_bytes: int = 16384) -> tuple[list[int], bool]:
    """The tokens appended after a turn, the observation cut in the middle to at most
    `max_bytes` of UTF-8 (before it is tokenised: tokenising megabytes costs seconds)
    and then to `max_tokens` of its own tokens; and whether it was cut. A tool's output
    is untrusted: text that is not valid Unicode is replaced, never raised on."""
    head, tail = self.observation_parts()
    text, cut_bytes = untrusted_text(text, max_bytes)
    body = self._bare(text)
    cut = cut_bytes or len(body) > max_tokens
    if len(body) > max_tokens:
      n = len(body)
      # The marker is sized for the largest count first; the true count is no longer.
      keep = max(max_tokens - len(self._bare(f"\n[... {n} tokens cut ...]\n")), 0)
      marker = self._bare(f"\n[... {n - keep} tokens cut ...]\n")
      body = body[:keep - keep // 2] + marker + body[n - keep // 2:]
    return self._bare(head) + body + self._bare(tail), cut

  def decode(self, ids: Sequence[int]) -> str:
    return self.tokenizer.decode(ids)


def _template_observation_parts(template) -> tuple[str, str]:
  """(head, tail): what `template` writes after an assistant turn's text and before a
  tool's result, and after the result up to the next assistant turn's text."""
  return _template_observation_spans(template)[0]


def _template_observation_spans(template):
  """((head, tail), (head's generation spans, tail's)); no spans when the template marks
  no generation."""
  user = {"role": "user", "content": "task"}
  start = template.render([user], add_generation_prompt=True)
  full, spans = template.render_spans(
      [user, {"role": "assistant", "content": _TURN}, {"role": "tool", "content": _OBSERVATION}],
      add_generation_prompt=True)
  if not full.startswith(start + _TURN) or full.count(_OBSERVATION) != 1:
    raise BadInput("agent.chat_format='template': this chat template does not extend a "
                   "conversation by appending to it (its rendering of the first turn is not "
                   "a prefix of the longer one), so an episode's tokens cannot be kept "
                   "across turns; use 'hermes' or 'compact'")
  head, tail = full[len(start) + len(_TURN):].split(_OBSERVATION)
  if not template.marks_generation():
    return (head, tail), ()
  turn = (len(start), len(start) + len(_TURN))
  observation = (full.index(_OBSERVATION), full.index(_OBSERVATION) + len(_OBSERVATION))
  if not any(a <= turn[0] and turn[1] <= b for a, b in spans):
    raise BadInput("agent.chat_format='template': the template marks generation, but no "
                   "{% generation %} block holds the assistant's turn, so its assistant mask "
                   "would leave out what the policy wrote; use 'hermes' or 'compact'")
  if any(a < observation[1] and observation[0] < b for a, b in spans):
    raise BadInput("agent.chat_format='template': a {% generation %} block holds a tool's "
                   "result, which is never trained on; use 'hermes' or 'compact'")

  def within(lo, hi):  # the spans cut to [lo, hi), from lo
    return [(max(a, lo) - lo, min(b, hi) - lo) for a, b in spans if a < hi and lo < b]
  return (head, tail), (within(turn[1], observation[0]), within(observation[1], len(full)))
