"""Rollouts: tasks in, sampled completions and their rewards out.

Everything here runs on the host between jitted calls: fitting tasks to the model's
context, tokenising prompts, sampling G completions of each (rlcode.sampling), decoding
them, scoring them through the reward registry, and cutting each completion to the
tokens some reward reads (`loss_lengths`). Training batches are built from a Rollout by
rlcode.rl.sequences or rlcode.rl.shared_prefix.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any
import numpy as np
from rlcode import rewards
from rlcode.data import chat_prompts
from rlcode.data.tasks import Task
from rlcode.models.tokenizer import Tokenizer, bos_length
from rlcode.sampling import Generation, generate


@dataclasses.dataclass
class Rollout:
  """One step's samples: P tasks, G completions each, prompt-major.

  `loss_lengths` (set by `score`) is, per completion, how many of its tokens the
  update trains on: those that produced text some configured reward reads. Tokens
  sampled after a stop sequence every reward cuts away cannot change a reward, so
  they stay out of the loss.
  """

  tasks: list[Task]
  prompts: list[list[int]]
  generation: Generation
  texts: list[str]
  seconds: float
  tokenizer: Tokenizer
  reward: rewards.RewardOutput | None = None
  loss_lengths: np.ndarray | None = None
  grammar: Any = None  # the rlcode.engine.grammar.Grammar the completions were sampled under

  @property
  def group_size(self) -> int:
    return len(self.texts) // len(self.tasks)

  def row_tasks(self) -> list[Task]:
    return [t for t in self.tasks for _ in range(self.group_size)]


def encode_prompts(tokenizer: Tokenizer, tasks: Sequence[Task]) -> list[list[int]]:
  return [chat_prompts.prompt_ids(tokenizer, t) for t in tasks]


FIT_REASONS = ("prompt_too_long", "reference_too_long")


def fit_context(tasks: Sequence[Task], tokenizer: Tokenizer, *, max_seq_len: int,
                max_new_tokens: int) -> tuple[list[Task], dict[str, int]]:
  """The tasks that fit a context of `max_seq_len` tokens, and counts of the rest.

  A task fits when its prompt leaves room for `max_new_tokens` (generate()
  raises otherwise) and its reference plus an end-of-sequence token fits after
  the prompt (the warm start trains on prompt + reference; positions past the
  context are ones the model was never built for). Returns the fitting tasks
  in their order and {"kept", "prompt_too_long", "reference_too_long"}, each
  dropped task counted under the first reason that applies.
  """
  kept, counts = [], dict.fromkeys(("kept", *FIT_REASONS), 0)
  for task in tasks:
    n = len(chat_prompts.prompt_ids(tokenizer, task))
    if n + max_new_tokens > max_seq_len:
      counts["prompt_too_long"] += 1
    elif n + len(tokenizer.encode(task.reference)) - bos_length(tokenizer) + 1 > max_seq_len:
      counts["reference_too_long"] += 1
    else:
      kept.append(task)
      counts["kept"] += 1
  return kept, counts


def fit_tasks(tasks: Sequence[Task], tokenizer: Tokenizer, *, split: str, max_seq_len: int,
              max_new_tokens: int, drop_too_long: bool,
              prompt_format: str = "plain") -> tuple[list[Task], dict[str, int]]:
  """`fit_context`, with the policy for tasks that do not fit, and "data/<split>_*" counts.

  The tasks are first asked as `prompt_format` says (rlcode.data.chat_prompts: through the
  tokenizer's chat template, or as they are). Tasks that do not fit are an error unless
  `drop_too_long`; then they are dropped and counted (the training loop writes the counts
  into metrics.jsonl at step 0).
  """
  tasks = chat_prompts.apply(tasks, tokenizer, prompt_format)
  kept, counts = fit_context(tasks, tokenizer, max_seq_len=max_seq_len,
                             max_new_tokens=max_new_tokens)
  dropped = len(tasks) - len(kept)
  where = (f"the model's context of {max_seq_len} tokens with max_new_tokens={max_new_tokens} "
           f"({counts})")
  if dropped and not drop_too_long:
    raise ValueError(f"{dropped} of {len(tasks)} {split} tasks do not fit {where}; shorten "
                     "them or set --config.data.drop_too_long=true to drop and count them")
  if not kept:
    raise ValueError(f"none of the {len(tasks)} {split} tasks fits {where}")
  return kept, {f"data/{split}_{k}": v for k, v in counts.items()}


def sample(model, tokenizer: Tokenizer, tasks: Sequence[Task], *, group_size: int,
           max_new_tokens: int, temperature: float, seed: int, mesh=None,
           top_p: float = 1.0, top_k: int = 0, row_offset: int = 0,
           experts: bool = False, grammar=None, min_prompt_len: int = 0,
           num_pages: int | None = None) -> Rollout:
  """G completions of each task; `row_offset`, `experts` (routing replay's record),
  `grammar` (every completion constrained by it; the batch builders then recompute its
  masks), `min_prompt_len` (the longest prompt of the caller's run: one engine pool
  shape for all its batches) and `num_pages` (the engine pool's pages, default what the
  batch needs: rlcode.sampling.engines.shared_pool) as in rlcode.sampling.generate."""
  prompts = encode_prompts(tokenizer, tasks)
  start = time.perf_counter()
  gen = generate(model, prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                 top_p=top_p, top_k=top_k, group_size=group_size,
                 stop_tokens=tokenizer.eos_ids, seed=seed, pad_id=tokenizer.pad_id, mesh=mesh,
                 row_offset=row_offset, experts=experts, grammar=grammar,
                 min_prompt_len=min_prompt_len, num_pages=num_pages)
  seconds = time.perf_counter() - start
  texts = [tokenizer.decode([t for t in c if t not in tokenizer.eos_ids])
           for c in gen.completions()]
  return Rollout(list(tasks), prompts, gen, texts, seconds, tokenizer, grammar=grammar)


def score(rollout: Rollout, weights: Mapping[str, float],
          options: Mapping[str, Mapping[str, Any]] | None = None) -> rewards.RewardOutput:
  """Rewards of every completion; also sets `rollout.loss_lengths`."""
  row_tasks = rollout.row_tasks()
  rollout.reward = rewards.compute(weights, row_tasks, rollout.texts, options)
  ends = rewards.answer_ends(weights, row_tasks, rollout.texts, options)
  rollout.loss_lengths = np.array(
      [tokens_for_chars(rollout.tokenizer, c, text, int(end))
       for c, text, end in zip(rollout.generation.completions(), rollout.texts, ends)],
      np.int32)
  return rollout.reward


def tokens_for_chars(tokenizer: Tokenizer, tokens: Sequence[int], text: str, chars: int) -> int:
  """The fewest leading `tokens` whose decoded text covers text[:chars]; all of them
  (end-of-sequence included) when `chars` covers the whole text."""
  if chars >= len(text):
    return len(tokens)
  want = text[:chars]
  covers = lambda k: tokenizer.decode(
      [t for t in tokens[:k] if t not in tokenizer.eos_ids]).startswith(want)
  lo, hi = 0, len(tokens)
  while lo < hi:  # covers(k) is monotone in k: decoded prefixes only grow
    mid = (lo + hi) // 2
    if covers(mid):
      hi = mid
    else:
      lo = mid + 1
  return lo


def trained_completions(rollout: Rollout) -> tuple[list[list[int]], list[np.ndarray]]:
  """Each completion's tokens and behaviour log-probs cut to its loss length."""
  gen = rollout.generation
  lengths = rollout.loss_lengths if rollout.loss_lengths is not None else gen.lengths
  completions = [c[:n] for c, n in zip(gen.completions(), lengths)]
  return completions, [lp[:n] for lp, n in zip(gen.logprobs, lengths)]


def batch_widths(rollout: Rollout) -> tuple[int, int]:
  """(longest trained completion, longest prompt) of the rollout, in tokens: what its
  training batch is padded for."""
  completions, _ = trained_completions(rollout)
  return max(max(len(c) for c in completions), 1), max(len(p) for p in rollout.prompts)
