"""From logged interactions to training rows: rewards of feedback, baselines, advantages.

A feedback row of the interaction log (rlcode.serve.log) rewards the candidates of its
completion (`online.reward`):
  chosen    the user picked candidate `chosen`: it gets 1, the other candidates of its
            prompt 0
  accepted  accepted -> 1, rejected -> 0, for candidate `index` (default 0; a rejection
            without an index rejects every candidate of candidate 0's prompt)
  kept      the fraction of the candidate's text still there after a while
  feedback  chosen if given, else accepted/rejected, else kept
A request with a list of prompts logs all their candidates under one id (choice p*n+j is
prompt p's j-th); a user comparing candidates compared those of one prompt, so `chosen`
and an index-less rejection reach only the candidates with the same prompt tokens (two
equal prompts of one list are one group: their candidates are samples of one
distribution). Candidates the feedback says nothing about, that were sampled greedily
(temperature 0: the behaviour distribution is a point mass, so no importance weight
exists) or by a version too old (`online.max_lag`) are skipped and counted.

One sample per prompt has no group to compare against, so the advantage is the reward
minus a baseline (`online.baseline`): "ema", a moving average of the rewards seen, or
"loo", the mean of the other rewarded candidates of the same prompt (REINFORCE
leave-one-out; a request with a list of prompts logs them under one id), else the moving
average. This module must not know about
models or HTTP.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

REWARDS = ("feedback", "chosen", "accepted", "kept")


@dataclasses.dataclass(frozen=True)
class Row:
  """One candidate to train on."""

  prompt: list[int]
  tokens: list[int]
  logprobs: list[float]
  reward: float
  advantage: float
  policy_version: int


def rewards_of(feedback: Mapping, prompts: Sequence[Sequence[int]],
               kind: str) -> dict[int, float]:
  """Candidate index -> reward, for the candidates this feedback rewards; `prompts[i]` is
  candidate i's prompt tokens."""
  if kind not in REWARDS:
    raise ValueError(f"online.reward={kind!r}; one of {REWARDS}")
  chosen, accepted, kept = feedback.get("chosen"), feedback.get("accepted"), feedback.get("kept")
  index = feedback.get("index")

  def group(of: int) -> list[int]:
    return [i for i, p in enumerate(prompts) if list(p) == list(prompts[of])]

  if kind in ("feedback", "chosen") and chosen is not None:
    return {i: float(i == chosen) for i in group(chosen)}
  if kind in ("feedback", "accepted") and accepted is not None:
    if not accepted and index is None:
      return dict.fromkeys(group(0), 0.0)
    return {index or 0: float(accepted)}
  if kind in ("feedback", "kept") and kept is not None:
    return {index or 0: float(kept)}
  return {}


class Baseline:
  """The reward baseline, a moving average carried across updates (and checkpoints)."""

  def __init__(self, decay: float, value: float | None = None):
    self.decay, self.value = decay, value

  def advantage(self, reward: float) -> float:
    """reward - baseline, then the baseline moves toward the reward (the first reward
    starts it, so the first row's advantage is 0)."""
    if self.value is None:
      self.value = reward
    adv = reward - self.value
    self.value = self.decay * self.value + (1 - self.decay) * reward
    return adv


def rows_of(feedback: Mapping, *, kind: str, max_tokens: int, counts: dict,
            oldest_version: int = 0) -> list[Row]:
  """The training rows of one feedback row (with its "candidates"), advantages not yet
  set (`with_advantages`); candidates sampled by a version before `oldest_version` are
  skipped; `counts` gathers the skipped candidates by reason."""
  cands: Sequence[Mapping] = feedback["candidates"]
  rewards = rewards_of(feedback, [c["prompt_tokens"] for c in cands], kind)
  if len(rewards) < len(cands):
    counts["skipped_no_signal"] = (counts.get("skipped_no_signal", 0)
                                   + len(cands) - len(rewards))
  out = []
  for i, reward in sorted(rewards.items()):
    cand = cands[i]
    if cand["params"]["temperature"] <= 0:
      counts["skipped_greedy"] = counts.get("skipped_greedy", 0) + 1
      continue
    if cand["policy_version"] < oldest_version:
      counts["skipped_stale"] = counts.get("skipped_stale", 0) + 1
      continue
    out.append(Row(prompt=list(cand["prompt_tokens"]), tokens=list(cand["tokens"][:max_tokens]),
                   logprobs=list(cand["logprobs"][:max_tokens]), reward=reward, advantage=0.0,
                   policy_version=int(cand["policy_version"])))
  return out


def with_advantages(rows: Sequence[Row], baseline: Baseline, how: str) -> list[Row]:
  """The rows of one feedback row with their advantages; the baseline moves past them."""
  out = []
  for i, row in enumerate(rows):
    adv = baseline.advantage(row.reward)  # the moving average sees every reward
    # A request with a list of prompts logs them under one id: only candidates of the
    # same prompt are a baseline for each other.
    others = [r.reward for j, r in enumerate(rows) if j != i and r.prompt == row.prompt]
    if how == "loo" and others:
      adv = row.reward - sum(others) / len(others)
    out.append(dataclasses.replace(row, advantage=adv))
  return out
