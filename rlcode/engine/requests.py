"""What callers hand the engine and get back: requests, candidates, results."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("rlcode.engine")


@dataclasses.dataclass
class Request:
  """One prompt and how to continue it n times.

  `rows` name the candidates' randomness (default 0..n-1): candidate c draws from
  (seed, rows[c], position), so a GRPO group passes its rows' global indices and gets
  the samples `rlcode.sampling.generation.generate` would draw. `stop_check(c, tokens)`
  says whether candidate c's completion so far ends at a stop string. `on_token(c, token,
  logprob, top)` is called for each token as it is sampled, `on_done(result)` once at the
  end (with `result.error` set if the request failed); both from the engine's thread.
  """

  prompt: Sequence[int]
  max_tokens: int
  n: int = 1
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  seed: int = 0
  rows: Sequence[int] | None = None
  stop_tokens: tuple[int, ...] = ()
  stop_check: Callable[[int, list[int]], bool] | None = None
  top_logprobs: bool = False
  on_token: Callable | None = None
  on_done: Callable | None = None
  grammar: Any = None


@dataclasses.dataclass
class Candidate:
  """One continuation: its tokens, each token's behaviour log-probability (under the
  distribution it was drawn from) and the policy version that sampled it."""

  tokens: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  versions: list[int] = dataclasses.field(default_factory=list)
  top: list[list[tuple[int, float]]] = dataclasses.field(default_factory=list)
  finish_reason: str | None = None


@dataclasses.dataclass
class Result:
  """A finished request: its candidates, the policy version it was admitted under, its
  prompt's length and how many of those positions came from the prefix cache."""

  candidates: list[Candidate]
  policy_version: int
  prompt_tokens: int
  cached_tokens: int = 0
  error: BaseException | None = None


def with_done(request: Request, on_done) -> Request:
  """`request` with `on_done` in place of its own."""
  return dataclasses.replace(request, on_done=on_done)


def call_done(request: Request, result: Result) -> None:
  """The request's done callback, whose failure never stops the engine."""
  if request.on_done is not None:
    try:
      request.on_done(result)
    except Exception:
      log.exception("a request's done callback failed")
