"""Rollouts: tasks in, sampled completions, rewards and training batches out.

Everything here runs on the host between jitted calls: tokenising prompts,
decoding completions, scoring them through the reward registry, and laying
rows out for the update. Lengths are bucketed to powers of two so the update
compiles for a handful of shapes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kernels.tiling import round_up
from rlcode import grpo, rewards
from rlcode.data.tasks import Task
from rlcode.models.tokenizer import Tokenizer
from rlcode.sampling import Generation, generate


class TaskStream:
  """An endless, seeded, resumable stream of task batches.

  Epoch e visits the tasks in the permutation drawn from (seed, e). The stream's
  whole state is `position`, the number of tasks handed out so far.
  """

  def __init__(self, tasks: Sequence[Task], batch_size: int, seed: int, position: int = 0):
    if not tasks:
      raise ValueError("TaskStream: no tasks")
    self.tasks, self.batch_size, self.seed, self.position = list(tasks), batch_size, seed, position

  def _order(self, epoch: int) -> np.ndarray:
    return np.random.default_rng([self.seed, epoch]).permutation(len(self.tasks))

  def next(self) -> list[Task]:
    out = []
    for i in range(self.position, self.position + self.batch_size):
      epoch, offset = divmod(i, len(self.tasks))
      out.append(self.tasks[self._order(epoch)[offset]])
    self.position += self.batch_size
    return out


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

  @property
  def group_size(self) -> int:
    return len(self.texts) // len(self.tasks)

  def row_tasks(self) -> list[Task]:
    return [t for t in self.tasks for _ in range(self.group_size)]


def encode_prompts(tokenizer: Tokenizer, tasks: Sequence[Task]) -> list[list[int]]:
  return [tokenizer.encode(t.prompt) for t in tasks]


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
    n = len(tokenizer.encode(task.prompt))
    if n + max_new_tokens > max_seq_len:
      counts["prompt_too_long"] += 1
    elif n + len(tokenizer.encode(task.reference)) - _bos_len(tokenizer) + 1 > max_seq_len:
      counts["reference_too_long"] += 1
    else:
      kept.append(task)
      counts["kept"] += 1
  return kept, counts


def fit_tasks(tasks: Sequence[Task], tokenizer: Tokenizer, *, split: str, max_seq_len: int,
              max_new_tokens: int, drop_too_long: bool) -> tuple[list[Task], dict[str, int]]:
  """`fit_context`, with the policy for tasks that do not fit, and "data/<split>_*" counts.

  Tasks that do not fit are an error unless `drop_too_long`; then they are dropped
  and counted (the training loop writes the counts into metrics.jsonl at step 0).
  """
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
           top_p: float = 1.0, top_k: int = 0, row_offset: int = 0) -> Rollout:
  """G completions of each task; `row_offset` as in rlcode.sampling.generate."""
  prompts = encode_prompts(tokenizer, tasks)
  start = time.perf_counter()
  gen = generate(model, prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                 top_p=top_p, top_k=top_k, group_size=group_size,
                 stop_tokens=tokenizer.eos_ids, seed=seed, pad_id=tokenizer.pad_id, mesh=mesh,
                 row_offset=row_offset)
  seconds = time.perf_counter() - start
  texts = [tokenizer.decode([t for t in c if t not in tokenizer.eos_ids])
           for c in gen.completions()]
  return Rollout(list(tasks), prompts, gen, texts, seconds, tokenizer)


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


LENGTH_MULTIPLE = 32


def sequence_batch(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                   prompt_index: Sequence[int], *, pad_id: int, old_logp=None,
                   adv=None, window: int | None = None,
                   multiple: int = LENGTH_MULTIPLE,
                   min_prompt_len: int = 0) -> grpo.SequenceBatch:
  """Host arrays of prompt + completion rows and each row's completion window.

  The window is `window` positions wide (default: the longest completion rounded up to
  a multiple of `multiple`); rows are right-padded to a multiple of `multiple` long
  enough for every row's window after its prompt, and after a prompt of
  `min_prompt_len` tokens (so processes that each build part of one batch agree on its
  length). Multiples rather than powers of two: the update's cost is linear in the
  padded lengths, and the few lengths a run meets compile once each (a larger
  multiple: fewer shapes to compile, more padding).

  old_logp[i] holds the behaviour log-probabilities of completion i's tokens
  (its first len(completions[i]) entries are used).
  """
  n = len(completions)
  longest = max(len(c) for c in completions)
  width = round_up(max(longest, 1), multiple) if window is None else window
  if longest > width:
    raise ValueError(f"a completion has {longest} tokens, more than the window of {width}")
  plens = [len(prompts[p]) for p in prompt_index]
  if min(plens) < 1:
    raise ValueError("sequence_batch: a prompt is empty")
  seq_len = round_up(max(max(plens), min_prompt_len) + width, multiple)
  tokens = np.full((n, seq_len), pad_id, np.int32)
  mask = np.zeros((n, width), np.float32)
  old = np.zeros((n, width), np.float32)
  for i, (p, c) in enumerate(zip(prompt_index, completions)):
    prompt = prompts[p]
    tokens[i, :len(prompt)] = prompt
    tokens[i, len(prompt):len(prompt) + len(c)] = c
    mask[i, :len(c)] = 1.0
    if old_logp is not None:
      old[i, :len(c)] = old_logp[i][:len(c)]
  adv = np.zeros((n,), np.float32) if adv is None else np.asarray(adv, np.float32)
  return grpo.SequenceBatch(tokens=tokens, start=np.asarray(plens, np.int32) - 1, mask=mask,
                            old_logp=old, ref_logp=np.zeros_like(old), adv=adv,
                            weight=np.ones_like(old))


def batch_widths(rollout: Rollout) -> tuple[int, int]:
  """(longest trained completion, longest prompt) of the rollout, in tokens: what its
  training batch is padded for."""
  completions, _ = trained_completions(rollout)
  return max(max(len(c) for c in completions), 1), max(len(p) for p in rollout.prompts)


def rl_batch(rollout: Rollout, adv: np.ndarray, pad_id: int, max_completion_len: int,
             multiple: int = LENGTH_MULTIPLE,
             widths: tuple[int, int] | None = None) -> grpo.SequenceBatch:
  """The rollout's batch of trained tokens (`trained_completions`); the window is the
  longest rounded up to a multiple of `multiple`, at most max_completion_len (as
  rlcode.shared_prefix.rl_batch). `widths` (default: `batch_widths(rollout)`) pads for
  longer completions and prompts: processes building parts of one batch pass the
  maximum of theirs."""
  completions, logprobs = trained_completions(rollout)
  longest, longest_prompt = widths or batch_widths(rollout)
  window = min(round_up(longest, multiple), max_completion_len)
  return sequence_batch(rollout.prompts, completions, rollout.generation.prompt_index,
                        pad_id=pad_id, old_logp=logprobs, adv=adv, window=window,
                        multiple=multiple, min_prompt_len=longest_prompt)


def sft_batch(tokenizer: Tokenizer, tasks: Sequence[Task],
              multiple: int = LENGTH_MULTIPLE) -> grpo.SequenceBatch:
  """Prompt + reference solution + end-of-sequence, for supervised warm starts; lengths
  padded to multiples of `multiple` (`sequence_batch`)."""
  prompts = encode_prompts(tokenizer, tasks)
  eos = list(tokenizer.eos_ids[:1])
  targets = [tokenizer.encode(t.reference)[_bos_len(tokenizer):] + eos for t in tasks]
  return sequence_batch(prompts, targets, range(len(tasks)), pad_id=tokenizer.pad_id,
                        multiple=multiple)


def _bos_len(tokenizer: Tokenizer) -> int:
  """How many tokens encode() prepends on its own (a BOS), which a continuation must drop."""
  return len(tokenizer.encode(""))
