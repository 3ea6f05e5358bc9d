"""Code and reasoning-gym tasks asked through a chat model's own template.

A chat-tuned checkpoint (Qwen2.5-Coder-Instruct, Qwen3) answers a conversation, not a bare
function head. `as_chat` turns a HumanEval-style task ("prompt+completion": the prompt is
the function's head and docstring) into the user turn of such a conversation, rendered by
the checkpoint's template with its generation prompt; the answer is expected to hold the
whole function in a python block, and the task's assembly becomes "chat"
(rlcode.rewards.tests: that block after the head's imports, against the same tests).
Whole-program tasks keep their prompt as the user turn and their assembly. A reasoning-gym
task ("gym", rlcode.data.reasoning_gym) is asked its question with GYM_INSTRUCTION, its
reference becoming the answer in <answer> tags, which the "gym" reward reads. A tokenizer
without a template (our byte-level ones) gets the tasks unchanged.

`data.prompt_format` chooses: "auto" (the template when the tokenizer has one), "chat"
(required) or "plain" (never). The rendered prompt holds the template's special tokens as
text: it is encoded without the tokenizer adding its own again (`prompt_ids`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rlcode.data.tasks import Task
from rlcode.errors import BadInput

FORMATS = ("auto", "chat", "plain")
INSTRUCTION = ("Complete the following Python function. Reply with the whole function, "
               "imports included, in one ```python code block.\n\n```python\n{head}```")
CHAT_STYLES = ("prompt+completion", "completion")
GYM_INSTRUCTION = ("\n\nThink it through if you need to, then give only the final answer "
                   "inside <answer></answer> tags.")


def uses_chat(tokenizer, prompt_format: str) -> bool:
  if prompt_format not in FORMATS:
    raise BadInput(f"data.prompt_format={prompt_format!r}; expected one of {FORMATS}")
  template = getattr(tokenizer, "chat_template", None)
  if prompt_format == "chat" and template is None:
    raise BadInput("data.prompt_format='chat': the tokenizer has no chat template (its "
                   "checkpoint's tokenizer_config.json or chat_template.jinja)")
  return prompt_format != "plain" and template is not None


def as_chat(task: Task, template) -> Task:
  """The task asked as the user turn of a conversation rendered by `template`."""
  if task.kind == "gym":
    text = template.render([{"role": "user", "content": task.extra.question + GYM_INSTRUCTION}],
                           add_generation_prompt=True)
    reference = task.reference.strip()
    return dataclasses.replace(task, prompt=text,
                               reference=f"<answer>{reference}</answer>" if reference else "",
                               extra=dataclasses.replace(task.extra, rendered=True))
  style = task.extra.assemble
  if task.kind != "code" or style not in CHAT_STYLES:
    raise BadInput(f"task {task.id!r}: data.prompt_format 'chat' asks code tasks "
                   f"({' or '.join(CHAT_STYLES)}) and gym tasks; this one is "
                   f"{task.kind}/{style}")
  if style == "prompt+completion":
    head = task.prompt if task.prompt.endswith("\n") else task.prompt + "\n"
    user = INSTRUCTION.format(head=head)
    extra = dataclasses.replace(task.extra, assemble="chat", code_prompt=task.prompt,
                                rendered=True)
  else:
    user, extra = task.prompt, dataclasses.replace(task.extra, rendered=True)
  text = template.render([{"role": "user", "content": user}], add_generation_prompt=True)
  reference = task.reference
  if reference and style == "prompt+completion":  # a warm start's target: the answer's form
    reference = f"```python\n{task.prompt}{reference}\n```"
  return dataclasses.replace(task, prompt=text, reference=reference, extra=extra)


def apply(tasks: Sequence[Task], tokenizer, prompt_format: str) -> list[Task]:
  """`tasks` as the policy will be asked them (module docstring)."""
  if not uses_chat(tokenizer, prompt_format):
    return list(tasks)
  return [as_chat(t, tokenizer.chat_template) for t in tasks]


def prompt_ids(tokenizer, task: Task) -> list[int]:
  """The prompt's tokens: a rendered conversation without the tokenizer's own specials
  (the template wrote them), any other prompt as the tokenizer encodes it."""
  rendered = task.kind in ("code", "gym") and task.extra.rendered
  return tokenizer.encode(task.prompt, add_special_tokens=not rendered)
