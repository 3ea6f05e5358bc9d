"""Continuous batching: requests join and leave a fixed set of decode slots between steps.

    submit(request) ─► waiting queue ─► admitted when n slots are free: one prefill of the
    prompt, copied into n slots (rlcode.serve.step.insert) ─► every step, each busy slot
    gets one token ─► a slot whose candidate stopped is freed at once ─► the next request

One thread (the engine loop) owns the device state: the KV cache, the weights and the
per-slot arrays. Other threads talk to it through `submit` (a request in), per-request
callbacks (tokens out, as they are sampled) and `publish` (new weights, swapped in
between two steps, so a request in flight is never dropped: its next tokens come from
the new weights). `mode="serial"` admits one request at a time into the same compiled
step: the one-request-at-a-time baseline of experiments/speed/serve_throughput.py.

A candidate stops on a stop token, on a stop string (matched in the decoded text), at its
max_tokens or at the context's end. This module must not know about HTTP or storage.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np
from flax import nnx

from rlcode.models.decoder import Decoder
from rlcode.sampling.generation import MIN_PROMPT_BUCKET, bucket
from rlcode.serve import step as step_lib

log = logging.getLogger(__name__)
MODES = ("continuous", "serial")


@dataclasses.dataclass
class Request:
  """What one call asks of the engine; `on_token(candidate, token, logprob, top)` is called
  from the engine thread for each token, `on_done(result)` once at the end (or with an
  exception as `result.error`)."""

  prompt: Sequence[int]
  max_tokens: int
  n: int = 1
  temperature: float = 1.0
  top_p: float = 1.0
  seed: int = 0
  stop_tokens: tuple[int, ...] = ()
  stop_check: Callable[[int, list[int]], bool] | None = None
  on_token: Callable | None = None
  on_done: Callable | None = None


@dataclasses.dataclass
class Candidate:
  tokens: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  top: list[list[tuple[int, float]]] = dataclasses.field(default_factory=list)
  finish_reason: str | None = None


@dataclasses.dataclass
class Result:
  candidates: list[Candidate]
  policy_version: int
  prompt_tokens: int
  error: BaseException | None = None


class _Live:
  """A request admitted into slots."""

  def __init__(self, request: Request, slots: list[int], version: int):
    self.request, self.slots, self.version = request, slots, version
    self.candidates = [Candidate() for _ in slots]
    self.open = len(slots)


class Engine:
  """The decode slots and the loop that steps them (see the module docstring).

  Args:
    model: the policy (sampled with `for_sampling`'s copy).
    slots: decode slots S: the most candidates decoded at once.
    version: the policy version of `model`'s weights.
    mode: "continuous" or "serial" (one request at a time).
  """

  def __init__(self, model: Decoder, *, slots: int, version: int = 0, mode: str = "continuous"):
    if mode not in MODES:
      raise ValueError(f"serve.batching={mode!r}; one of {MODES}")
    if "nsa" in model.cfg.layer_kinds:
      raise ValueError("serving models with NSA layers is not implemented (their cache is "
                       "per row, not the slots' cache)")
    self.cfg = model.cfg
    self.graphdef, self.state = nnx.split(model.for_sampling())
    self.version, self.mode, self.slots = version, mode, slots
    self.cache = step_lib.empty_cache(self.cfg, slots)
    self.tokens = np.zeros(slots, np.int32)
    self.active = np.zeros(slots, bool)
    self.seed = np.zeros(slots, np.uint32)
    self.candidate = np.zeros(slots, np.int32)
    self.position = np.zeros(slots, np.int32)
    self.temperature = np.ones(slots, np.float32)
    self.top_p = np.ones(slots, np.float32)
    self.owner: list[tuple[_Live, int] | None] = [None] * slots
    self.waiting: collections.deque[Request] = collections.deque()
    self.live: list[_Live] = []
    self._pending: tuple[int, object] | None = None
    self._cond = threading.Condition()
    self._stopping = False
    self.stats = {"steps": 0, "tokens": 0, "requests": 0, "swaps": 0, "busy_seconds": 0.0}
    self._thread = threading.Thread(target=self._loop, name="rlcode-engine", daemon=True)
    self._thread.start()

  # ------------------------------------------------------------ outside the loop
  def submit(self, request: Request) -> None:
    if request.n > self.slots:
      raise ValueError(f"n={request.n} exceeds the server's {self.slots} decode slots")
    with self._cond:
      if self._stopping:
        raise RuntimeError("the engine is stopping")
      self.waiting.append(request)
      self._cond.notify_all()

  def publish(self, version: int, state) -> None:
    """New weights (an nnx.State of the sampling model's graph), swapped in before the
    next step."""
    with self._cond:
      self._pending = (version, state)
      self._cond.notify_all()

  def queue_depth(self) -> int:
    return len(self.waiting)

  def busy_slots(self) -> int:
    return int(self.active.sum())

  def stop(self, timeout: float | None = None) -> None:
    """Finishes what is admitted and waiting, then ends the loop."""
    with self._cond:
      self._stopping = True
      self._cond.notify_all()
    self._thread.join(timeout)

  # ------------------------------------------------------------ the loop
  def _loop(self) -> None:
    while True:
      with self._cond:
        while not (self.waiting or self.live or self._pending or self._stopping):
          self._cond.wait()
        if self._stopping and not (self.waiting or self.live):
          return
        if self._pending is not None:
          self.version, self.state = self._pending
          self._pending = None
          self.stats["swaps"] += 1
        admit = self._admissible()
      start = time.perf_counter()
      for request in admit:
        self._admit(request)
      if self.live:
        self._step()
      self.stats["busy_seconds"] += time.perf_counter() - start

  def _admissible(self) -> list[Request]:
    """Waiting requests that fit the free slots now, first come first served."""
    free = self.slots - int(self.active.sum())
    out = []
    while self.waiting and self.waiting[0].n <= free:
      if self.mode == "serial" and (self.live or out):
        break
      out.append(self.waiting.popleft())
      free -= out[-1].n
    return out

  def _admit(self, request: Request) -> None:
    try:
      prompt = list(request.prompt)
      t = min(bucket(len(prompt), MIN_PROMPT_BUCKET), self.cfg.max_seq_len)
      padded = np.zeros((1, t), np.int32)
      padded[0, :len(prompt)] = prompt
      logits, kvs = step_lib.prefill(self.state, padded, np.int32(len(prompt)),
                                     graphdef=self.graphdef)
      free = [i for i in range(self.slots) if not self.active[i]][:request.n]
      live = _Live(request, free, self.version)
      firsts = []
      for c, slot in enumerate(free):
        self.cache, tok, lp, top_ids, top_lp = step_lib.insert(
            self.cache, kvs, logits, np.int32(slot), np.int32(len(prompt)),
            np.uint32(request.seed), np.int32(c), np.float32(request.temperature),
            np.float32(request.top_p))
        firsts.append((tok, lp, top_ids, top_lp))
        self.active[slot] = True
        self.owner[slot] = (live, c)
        self.seed[slot], self.candidate[slot] = request.seed, c
        self.temperature[slot], self.top_p[slot] = request.temperature, request.top_p
        self.position[slot] = 1
      self.live.append(live)
      self.stats["requests"] += 1
      firsts = jax.device_get(firsts)
      for slot, (tok, lp, top_ids, top_lp) in zip(free, firsts):
        self._emit(slot, int(tok), float(lp), top_ids, top_lp)
    except Exception as e:  # a bug: the request fails, the server goes on
      log.exception("admitting a request failed")
      self._fail(request, e)

  def _step(self) -> None:
    self.cache, tok, lp, top_ids, top_lp = step_lib.step(
        self.state, self.cache, self.tokens, self.active, self.seed, self.candidate,
        self.position, self.temperature, self.top_p, graphdef=self.graphdef)
    tok, lp, top_ids, top_lp = jax.device_get((tok, lp, top_ids, top_lp))
    self.stats["steps"] += 1
    for slot in np.flatnonzero(self.active):
      self.position[slot] += 1
      self._emit(int(slot), int(tok[slot]), float(lp[slot]), top_ids[slot], top_lp[slot])

  def _emit(self, slot: int, tok: int, lp: float, top_ids, top_lp) -> None:
    """Records a slot's new token; frees the slot when its candidate is done."""
    live, c = self.owner[slot]
    request, cand = live.request, live.candidates[c]
    cand.tokens.append(tok)
    cand.logprobs.append(lp)
    cand.top.append([(int(i), float(x)) for i, x in zip(top_ids, top_lp)])
    self.tokens[slot] = tok
    self.stats["tokens"] += 1
    reason = None
    if tok in request.stop_tokens:
      reason = "stop"
    elif request.stop_check is not None and request.stop_check(c, cand.tokens):
      reason = "stop"
    elif len(cand.tokens) >= request.max_tokens:
      reason = "length"
    elif len(request.prompt) + len(cand.tokens) >= self.cfg.max_seq_len:
      reason = "length"  # the last token sampled is never fed back
    if request.on_token is not None:
      try:
        request.on_token(c, tok, lp, cand.top[-1])
      except Exception:  # a client's callback never stops the loop
        log.exception("a request's token callback failed")
    if reason is None:
      return
    cand.finish_reason = reason
    self.active[slot] = False
    self.owner[slot] = None
    live.open -= 1
    if live.open == 0:
      self.live.remove(live)
      self._done(request, Result(live.candidates, live.version, len(request.prompt)))

  def _fail(self, request: Request, error: BaseException) -> None:
    self._done(request, Result([], self.version, len(request.prompt), error=error))

  @staticmethod
  def _done(request: Request, result: Result) -> None:
    if request.on_done is not None:
      try:
        request.on_done(result)
      except Exception:
        log.exception("a request's done callback failed")
