"""An episode's calls as token-exact segments of trajectory.

A call is one prompt (the token ids the engine saw) and the completion the harness used
(its sampled tokens, their behaviour log-probs and the policy version of each). Calls
are added in order. A call whose prompt starts with the current segment's whole context
(its prompt, then every token after it) continues that segment: the prompt's extra
tokens are appended as observation tokens (mask 0, log-prob 0, version -1), then the
completion's tokens as sampled ones (mask 1, their log-probs and versions). Any other
prompt starts a new segment whose prompt is that call's whole prompt: the harness
rewrote the history (a template that drops earlier reasoning, an edited or a dropped
turn), and what the policy saw at that call is only that prompt. A split is one of:

  prefix_mismatch   the prompt differs from the context at token `at` (the first
                    position where they differ)
  shorter_prompt    the prompt is a proper prefix of the context (the last completion or
                    observation left out, as a retry of the call sends)

A token is marked sampled only where the engine sampled it, in the position it was
sampled in: a segment's mask-1 tokens are exactly the completions of its calls, each
after exactly the context its call's prompt was. This module must not know about HTTP.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

PREFIX_MISMATCH = "prefix_mismatch"
SHORTER_PROMPT = "shorter_prompt"
REASONS = (PREFIX_MISMATCH, SHORTER_PROMPT)
# The version of an observation token: no policy sampled it.
OBSERVED = -1


@dataclasses.dataclass
class Segment:
  """A stretch of an episode the policy saw as one growing context; the fields
  `rlcode.agent.episodes.grpo_batch` reads of a `rlcode.agent.sampler.Trajectory`.

  Attributes:
    prompt: the first call's prompt tokens.
    tokens: every token after the prompt, in order: completions and observations.
    mask: 1 where the engine sampled the token, 0 on observations.
    logprobs: behaviour log-probs of sampled tokens, 0 on observations.
    versions: the policy version that sampled each token, OBSERVED (-1) on observations.
    calls: the episode's indices of the calls in this segment.
  """

  prompt: list[int]
  tokens: list[int] = dataclasses.field(default_factory=list)
  mask: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  versions: list[int] = dataclasses.field(default_factory=list)
  calls: list[int] = dataclasses.field(default_factory=list)

  @property
  def context(self) -> list[int]:
    """The prompt, then every token after it: what a continuing call's prompt starts with."""
    return self.prompt + self.tokens

  def add_observation(self, tokens: Sequence[int]) -> None:
    self.tokens += tokens
    self.mask += [0] * len(tokens)
    self.logprobs += [0.0] * len(tokens)
    self.versions += [OBSERVED] * len(tokens)

  def add_sampled(self, tokens: Sequence[int], logprobs: Sequence[float],
                  versions: Sequence[int]) -> None:
    if not len(tokens) == len(logprobs) == len(versions):
      raise ValueError(f"a completion of {len(tokens)} tokens has {len(logprobs)} log-probs "
                       f"and {len(versions)} versions")
    self.tokens += tokens
    self.mask += [1] * len(tokens)
    self.logprobs += [float(x) for x in logprobs]
    self.versions += [int(v) for v in versions]

  def trajectory(self, task, *, status: str = "", reward: float = 0.0,
                 shared: int | None = None):
    """The segment as a `rlcode.agent.sampler.Trajectory` of `task` (copies of its lists).

    shared: the trajectory's prompt is the segment's first `shared` prompt tokens (a prefix
    the segments of a group share, computed once in the update); the rest of the prompt
    leads its tokens as observations (mask 0, log-prob 0). None: the whole prompt."""
    from rlcode.agent import sampler  # deferred: the agent's sampler imports the engine
    shared = len(self.prompt) if shared is None else shared
    if not 1 <= shared <= len(self.prompt):
      raise ValueError(f"shared={shared}: a segment's prompt of {len(self.prompt)} tokens "
                       "keeps 1 to all of them as the trajectory's prompt")
    rest = self.prompt[shared:]
    return sampler.Trajectory(task=task, prompt=self.prompt[:shared],
                              tokens=rest + self.tokens, mask=[0] * len(rest) + self.mask,
                              logprobs=[0.0] * len(rest) + self.logprobs,
                              status=status, reward=reward)

  def to_json(self) -> dict:
    """Copies of the lists, safe to serialise while the segment grows."""
    return {"prompt": list(self.prompt), "tokens": list(self.tokens), "mask": list(self.mask),
            "logprobs": list(self.logprobs), "versions": list(self.versions),
            "calls": list(self.calls)}


@dataclasses.dataclass(frozen=True)
class Split:
  """Where a new segment began: the call, why, and the first differing position (`at`,
  the prompt's length for shorter_prompt) against a context of `context` tokens."""

  call: int
  reason: str
  at: int
  context: int
  prompt: int

  def to_json(self) -> dict:
    return dataclasses.asdict(self)


def divergence(prompt: Sequence[int], context: Sequence[int]) -> int:
  """The first position where `prompt` and `context` differ (the shorter's length when
  one is a prefix of the other)."""
  for i, (a, b) in enumerate(zip(prompt, context)):
    if a != b:
      return i
  return min(len(prompt), len(context))


def extend(segments: list[Segment], call: int, prompt: Sequence[int], tokens: Sequence[int],
           logprobs: Sequence[float], versions: Sequence[int]) -> Split | None:
  """Adds call number `call` to `segments` (in place): it continues the last segment, or
  starts a new one; returns the split, None when it continued (or was the first)."""
  if not len(tokens) == len(logprobs) == len(versions):
    raise ValueError(f"a completion of {len(tokens)} tokens has {len(logprobs)} log-probs "
                     f"and {len(versions)} versions")
  prompt, tokens = [int(t) for t in prompt], [int(t) for t in tokens]
  split = None
  if segments:
    context = segments[-1].context
    at = divergence(prompt, context)
    if at == len(context):
      segments[-1].add_observation(prompt[at:])
      segments[-1].add_sampled(tokens, logprobs, versions)
      segments[-1].calls.append(call)
      return None
    reason = SHORTER_PROMPT if at == len(prompt) else PREFIX_MISMATCH
    split = Split(call=call, reason=reason, at=at, context=len(context), prompt=len(prompt))
  segment = Segment(prompt=prompt, calls=[call])
  segment.add_sampled(tokens, logprobs, versions)
  segments.append(segment)
  return split
