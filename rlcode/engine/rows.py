"""The engine's records of what it holds: an admitted request (a group of candidates) and
its rows (rlcode.engine.engine keeps them in its queues); the per-row sampling arrays of a
step, and the per-row checks of a sampled token (the grammar, the stop check)."""

from __future__ import annotations

import logging

import numpy as np

from rlcode.engine import grammar as grammar_lib
from rlcode.engine.requests import Candidate, Request

log = logging.getLogger("rlcode.engine")
RESTART_STRIDE = 1 << 20


def bucket(n: int, minimum: int = 1) -> int:
  """The smallest power of two >= max(n, minimum)."""
  return 1 << (max(n, minimum) - 1).bit_length()


class Group:
  """An admitted request: its candidates' records, and how many are still open."""

  def __init__(self, request: Request, version: int):
    self.request, self.version = request, version
    self.candidates = [Candidate() for _ in range(request.n)]
    self.rows = list(request.rows) if request.rows is not None else list(range(request.n))
    self.open = request.n
    self.cached_tokens = 0
    self.error: BaseException | None = None
    grammar = request.grammar
    self.matchers = [grammar.matcher() for _ in range(request.n)] if grammar else None
    self.prompt_experts = None  # [prompt tokens, moe layers, top_k], when recorded


class Row:
  """One row: the tokens it has (prompt, then its candidate's), the pages holding their
  keys and values, and how many positions those pages hold (`cached`). A group's leader
  prefills the prompt once and forks into the group's candidates."""

  def __init__(self, group: Group, c: int, tokens: list[int], order: int, leader: bool):
    self.group, self.c, self.tokens, self.order, self.leader = group, c, tokens, order, leader
    self.pages: list[int] = []
    self.spare: list[int] = []  # a leader's pages for its candidates' copies of the last page
    self.cached = 0
    self.kv_version = -1  # the weights its pages were computed with (if all the same)
    self.state = "waiting"  # then "prefill", "decode", "resume" (preempted) or "done"

  @property
  def candidate(self) -> Candidate:
    return self.group.candidates[self.c]


def rows(seq: Row) -> int:
  """The rows a live row stands for: a leader before its fork, its group's n."""
  return seq.group.request.n if seq.leader else 1


def sampling_arrays(seqs: list[Row], r: int, vocab_size: int):
  """Per-row sampling arrays of `seqs` padded to r rows: seed, row, position, temperature,
  top_k, top_p, and the grammar bitmask [r, words] (None when no row has a grammar)."""
  seed = np.zeros(r, np.uint32)
  row, position, top_k = (np.zeros(r, np.int32) for _ in range(3))
  temperature, top_p = np.ones(r, np.float32), np.ones(r, np.float32)
  masked = any(seq.group.matchers for seq in seqs)
  allow = (np.tile(grammar_lib.all_allowed(vocab_size), (r, 1)) if masked else None)
  for i, seq in enumerate(seqs):
    request = seq.group.request
    seed[i], row[i] = request.seed, seq.group.rows[seq.c]
    # A restarted candidate draws fresh keys: its restarts move it to positions no first
    # draw reaches.
    position[i] = len(seq.candidate.tokens) + seq.candidate.restarts * RESTART_STRIDE
    temperature[i], top_k[i], top_p[i] = request.temperature, request.top_k, request.top_p
    if seq.group.matchers:
      seq.group.matchers[seq.c].fill(allow[i])
  return seed, row, position, temperature, top_k, top_p, allow


def record_experts(seq: Row, start: int, experts_tlk) -> None:
  """Keeps the experts [T, moe layers, top_k] a forward chose for the row's tokens from
  position `start` on, when its request records them: a prompt position's in its group's
  record, a candidate token's in the candidate's (a later forward of the same position, a
  preempted row's recompute, overwrites)."""
  if not seq.group.request.experts:
    return
  group, cand = seq.group, seq.candidate
  n_prompt = len(group.request.prompt)
  experts_tlk = np.asarray(experts_tlk, np.int32)
  if group.prompt_experts is None:
    group.prompt_experts = np.full((n_prompt, *experts_tlk.shape[1:]), -1, np.int32)
  for t, chosen in enumerate(experts_tlk):
    p = start + t
    if p < n_prompt:
      group.prompt_experts[p] = chosen
    elif p - n_prompt < len(cand.experts):
      cand.experts[p - n_prompt] = chosen


def grammar_ends(seq: Row, tok: int) -> bool:
  """Advances the row's grammar; whether it is complete (or broken: only a bug sends a
  token the mask refused, and it ends its own request with the error)."""
  matcher = seq.group.matchers[seq.c]
  try:
    matcher.advance(tok)
  except RuntimeError as e:
    seq.group.error = e
    return True
  return matcher.done


def stops(seq: Row, tokens: list[int]) -> bool:
  """The request's stop check; one that raises ends its own request with the error."""
  try:
    return bool(seq.group.request.stop_check(seq.c, tokens))
  except Exception as e:  # a caller's check must not fail the other requests
    log.exception("a request's stop check failed")
    seq.group.error = e
    return True
