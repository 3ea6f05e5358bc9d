"""What callers hand the engine and get back: requests, candidates, results."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("rlcode.engine")


@dataclasses.dataclass
class Request:
  """One prompt and how to continue it n times.

  `rows` name the candidates' randomness (default 0..n-1): candidate c draws from
  (seed, rows[c], position), so a GRPO group passes its rows' global indices and gets
  the samples `rlcode.sampling.generation.generate` would draw. `experts`: record the
  experts each MoE layer chose for every token (routing replay: Result.prompt_experts,
  Candidate.experts). `stop_check(c, tokens)`
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
  experts: bool = False


@dataclasses.dataclass
class Candidate:
  """One continuation: its tokens, each token's behaviour log-probability (under the
  distribution it was drawn from) and the policy version that sampled it; when its request
  records experts, each token's [moe layers, top_k] experts from the latest forward that
  processed it (None for a token no forward processed yet: the last one sampled)."""

  tokens: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  versions: list[int] = dataclasses.field(default_factory=list)
  top: list[list[tuple[int, float]]] = dataclasses.field(default_factory=list)
  experts: list = dataclasses.field(default_factory=list)
  finish_reason: str | None = None
  restarts: int = 0  # times a weight swap sent it back to its prompt (rlcode.engine.engine)


@dataclasses.dataclass
class Result:
  """A finished request: its candidates, the policy version it was admitted under, its
  prompt's length and how many of those positions came from the prefix cache; when it
  recorded experts, its prompt's [prompt tokens, moe layers, top_k] (-1 for a position
  the prefix cache served, which no forward of this request processed)."""

  candidates: list[Candidate]
  policy_version: int
  prompt_tokens: int
  cached_tokens: int = 0
  error: BaseException | None = None
  prompt_experts: Any = None


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


def check(request: Request, max_seq_len: int, max_rows: int, page_size: int,
          num_pages: int) -> None:
  """A ValueError naming what an engine of these sizes cannot take from `request`."""
  n_prompt = len(request.prompt)
  if n_prompt == 0:
    raise ValueError("the prompt is empty")
  if n_prompt >= max_seq_len:
    raise ValueError(f"the prompt has {n_prompt} tokens; the model's context is "
                     f"{max_seq_len}")
  if not 1 <= request.n <= max_rows:
    raise ValueError(f"n={request.n} must be between 1 and the engine's {max_rows} rows")
  if request.rows is not None and len(request.rows) != request.n:
    raise ValueError(f"rows has {len(request.rows)} entries for n={request.n}")
  if request.max_tokens < 1:
    raise ValueError(f"max_tokens={request.max_tokens} must be at least 1")
  if not 0 <= request.seed < 2 ** 32:
    raise ValueError(f"seed={request.seed} must be in [0, 2**32)")
  need = math.ceil(min(n_prompt + request.max_tokens, max_seq_len) / page_size)
  if need > num_pages - 1:
    raise ValueError(f"a candidate of this request needs {need} pages of "
                     f"{page_size}; the pool has {num_pages - 1}")
  s = page_size
  group = math.ceil(n_prompt / s) + (request.n - 1 if n_prompt % s else 0)
  if group > num_pages - 1:
    raise ValueError(f"the prompt and its n={request.n} candidates' copies of its last "
                     f"page need {group} pages of {s}; the pool has "
                     f"{num_pages - 1}")
