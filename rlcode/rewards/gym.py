"""The "gym" reward: a completion scored by its reasoning-gym task's own verifier.

Each completion of a "gym" task (rlcode.data.reasoning_gym) scores
`dataset.score_answer(answer, entry)`: `dataset` is the task's generator made again
from the keywords it was made with (GymExtra.config, seed and size included; cached),
`entry` the task's question, answer and metadata as the generator made them
(rlcode.data.reasoning_gym.from_json), `answer` the text `extract_answer` reads from the
completion:
  "auto" (default): inside the last <answer>...</answer> pair, else after the last
    `marker` ("Answer:"), else the whole completion;
  "tags", "marker": only that way (else no answer); "whole": the whole completion;
stripped of surrounding whitespace. An empty answer, or one longer than
`max_answer_chars`, is not scored (0). A plain prompt ends with "Answer:", so there the
whole completion is the answer; a chat prompt asks for the tags (rlcode.data.chat_prompts).

The completion is untrusted text: it is only searched and handed to score_answer as a
string. The generators whose score_answer evaluates that string (eval, sympy's parse_expr)
are refused (rlcode.data.gym_config.REFUSED), here too. A score_answer that raises scores
0 and is counted ("errors"); a score outside [0, 1] or not finite is clipped (to 0 when
not finite). score_answer gives partial credit in some generators (a formatted but wrong
answer 0.01, an answer holding the right one len(right)/len(answer)).

Metrics: "parsed" (an answer was scored), "marked" (the tags or the marker found it),
"correct" (score 1), "errors"; the registry adds "mean".
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence

import numpy as np

from rlcode.data.gym_config import REFUSED, generators
from rlcode.data.tasks import Task
from rlcode.errors import BadInput
from rlcode.rewards.config import GYM_EXTRACTIONS as EXTRACTIONS
from rlcode.rewards.registry import RewardOutput, register

OPEN, CLOSE = "<answer>", "</answer>"


def extract_answer(completion: str, extract: str = "auto",
                   marker: str = "Answer:") -> tuple[str | None, bool]:
  """(the answer `extract` reads from `completion` or None, whether the tags or the marker
  found it); linear in the completion's length."""
  if extract not in EXTRACTIONS:
    raise BadInput(f"reward_options.gym.extract={extract!r}; expected one of {EXTRACTIONS}")
  if extract in ("auto", "tags"):
    end = completion.rfind(CLOSE)
    start = completion.rfind(OPEN, 0, end) if end >= 0 else -1
    if start >= 0:
      return completion[start + len(OPEN):end].strip(), True
    if extract == "tags":
      return None, False
  if extract in ("auto", "marker") and marker:
    at = completion.rfind(marker)
    if at >= 0:
      return completion[at + len(marker):].strip(), True
    if extract == "marker":
      return None, False
  return completion.strip(), False


@functools.lru_cache(maxsize=64)
def _dataset(name: str, config_json: str):
  """reasoning-gym's dataset `name` made with the keywords of `config_json`."""
  import reasoning_gym  # deferred: a second or two
  from rlcode.data.reasoning_gym import from_json  # deferred: tfds
  generators()  # a missing reasoning-gym is one line
  try:
    return reasoning_gym.create_dataset(name, **from_json(json.loads(config_json)))
  except (ValueError, TypeError, AssertionError) as e:
    raise BadInput(f"reasoning-gym cannot make {name!r} again from a task's keywords: "
                   f"{' '.join(str(e).split())[:200]}") from None


def _check(task: Task) -> None:
  if task.kind != "gym":
    raise BadInput(f"task {task.id!r} has kind {task.kind!r}; the gym reward scores "
                   "reasoning-gym tasks (kind 'gym')")
  if task.extra.dataset in REFUSED:
    raise BadInput(f"task {task.id!r}: reasoning-gym's {task.extra.dataset!r} is refused: "
                   f"{REFUSED[task.extra.dataset]}")


def score_one(task: Task, answer: str) -> float:
  """The task's generator's score_answer of `answer` (raises what it raises)."""
  from rlcode.data.reasoning_gym import from_json  # deferred: tfds
  extra = task.extra
  dataset = _dataset(extra.dataset, json.dumps(extra.config, sort_keys=True))
  entry = {"question": extra.question, "answer": from_json(extra.answer),
           "metadata": from_json(extra.metadata)}
  return float(dataset.score_answer(answer, entry))


@register("gym")
def gym_reward(tasks: Sequence[Task], completions: Sequence[str], *, extract: str = "auto",
               marker: str = "Answer:", max_answer_chars: int = 4096) -> RewardOutput:
  """Per completion, its task's reasoning-gym score_answer of the extracted answer
  (module docstring)."""
  if len(tasks) != len(completions):
    raise ValueError(f"{len(tasks)} tasks but {len(completions)} completions")
  scores = np.zeros(len(completions), np.float32)
  details = []
  counts = {"parsed": 0, "marked": 0, "correct": 0, "errors": 0}
  for i, (task, completion) in enumerate(zip(tasks, completions)):
    _check(task)
    answer, marked = extract_answer(completion, extract, marker)
    counts["marked"] += marked
    detail = {"parsed": False, "score": 0.0}
    if answer and len(answer) <= max_answer_chars:
      detail["parsed"] = True
      counts["parsed"] += 1
      try:
        score = score_one(task, answer)
      except BadInput:
        raise
      except Exception as e:  # the generator's own code, on untrusted text
        counts["errors"] += 1
        detail["error"] = f"{type(e).__name__}: {str(e)[:120]}"
        score = 0.0
      score = min(max(score, 0.0), 1.0) if math.isfinite(score) else 0.0
      scores[i] = detail["score"] = score
      counts["correct"] += score == 1.0
    details.append(detail)
  n = max(len(completions), 1)
  return RewardOutput(scores, {k: v / n for k, v in counts.items()}, details)
