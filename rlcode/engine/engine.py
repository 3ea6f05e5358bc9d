"""The inference engine: paged KV, continuous batching, shared prefixes.

    submit(request) ─► waiting ─► admitted when its rows and its prompt's pages fit ─►
    prefilled in chunks (a token budget per step, beside the decoding rows) ─► its n
    candidates forked from the one prompt (full pages shared, the last partial page
    copied) ─► one token per decoding row per step ─► a row that stops releases its pages
    at once, its full blocks kept in the prefix cache for the next prompt that starts
    with them

Each `step()` swaps in published weights, admits, runs one chunk of prefill and one decode
step over the busy rows only, rows of similar lengths together (row counts, chunk lengths
and page-table widths bucketed to powers of two, so a few shapes compile). When a decoding row needs a page and none is
free, the most recently admitted row is preempted: its pages are released and it is
recomputed from its tokens when it is admitted again (same tokens: randomness is keyed by
(seed, row, position)). Every token carries the policy version that sampled it and its
behaviour log-probability.

Synchronous callers (rollouts, evaluation, tests) call `generate`; the server runs `start`,
which steps in a thread of its own while other threads `submit` and `publish`.
This module must not know about HTTP, rewards or training.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from rlcode.engine import programs
from rlcode.engine import warmup as warmup_lib
from rlcode.engine.pages import PagePool
from rlcode.engine.requests import Request, Result, call_done, check, with_done
from rlcode.engine.rows import (Group, Row, bucket, grammar_ends, record_experts,
                                sampling_arrays, stops)
from rlcode.engine.rows import rows as rows_of
from rlcode.models.decoder import Decoder
from rlcode.models.paged import SCRATCH_PAGE
from rlcode.parallel import sharding

log = logging.getLogger(__name__)
MODES = ("continuous", "serial")
MIN_CHUNK = 16
# The smallest row count and page-table width a program is compiled for: a few wasted
# rows or pages cost less than compiling the many small shapes a stream of requests meets.
MIN_ROWS = 4
MIN_PAGES = 8


class Engine:
  """The engine (see the module docstring).

  Args:
    model: the policy (sampled with its `for_sampling` copy).
    num_pages: pages in each layer's pool (one is scratch).
    page_size: positions per page.
    max_rows: the most rows decoded at once.
    prefill_tokens: the most prompt tokens prefilled in one step.
    version: the policy version of `model`'s weights.
    prefix_cache: keep finished blocks for later prompts.
    mode: "continuous", or "serial" (one request at a time: a baseline).
    mesh: the devices of this engine (one data shard of a sampler mesh): the weights are
      placed by their axes on it and the pools' KV heads split over its `tensor` axis
      where that divides them; None: the default device.
    warmup: a started engine compiles the program shapes its steps meet (unconstrained,
      rlcode.engine.warmup) while it is idle, one at a time (what a server wants).
  """

  def __init__(self, model: Decoder, *, num_pages: int, page_size: int = 16,
               max_rows: int = 64, prefill_tokens: int = 512, version: int = 0,
               prefix_cache: bool = True, mode: str = "continuous", mesh: Mesh | None = None,
               warmup: bool = False):
    if mode not in MODES:
      raise ValueError(f"engine mode={mode!r}; one of {MODES}")
    self.cfg, self.mesh = model.cfg, mesh
    self.graphdef, self.state = nnx.split(model.for_sampling())
    if mesh is not None:
      self.state = jax.device_put(self.state, sharding.state_shardings(self.state, mesh))
    self.programs = programs.for_graph(self.graphdef, mesh)
    self.pools = programs.zero_pools(self.cfg, num_pages, page_size, mesh)
    self.pool = PagePool(num_pages, page_size, prefix_cache=prefix_cache)
    self.page_size, self.max_rows, self.mode = page_size, max_rows, mode
    self.prefill_tokens = max(prefill_tokens, MIN_CHUNK)
    self.max_pages = math.ceil(self.cfg.max_seq_len / page_size)
    self.version = version
    self.waiting: collections.deque[Group] = collections.deque()
    self.resume: list[Row] = []
    self.prefilling: list[Row] = []
    self.decoding: list[Row] = []
    self._order = 0
    self._pending: tuple[int, object] | None = None
    self._cond = threading.Condition()
    self._thread: threading.Thread | None = None
    self._stopping = self._cancel = False
    self.stats = collections.Counter()
    self.warm = collections.deque(
        warmup_lib.shapes(self, MIN_ROWS, MIN_PAGES, MIN_CHUNK) if warmup else ())

  # ------------------------------------------------------------ outside the loop
  def submit(self, request: Request) -> None:
    check(request, self.cfg.max_seq_len, self.max_rows, self.page_size, self.pool.num_pages)
    group = Group(request, self.version)  # a grammar's matchers are built outside the lock
    with self._cond:
      if self._stopping:
        raise RuntimeError("the engine is stopping")
      self.waiting.append(group)
      self._cond.notify_all()

  def publish(self, state, version: int, restart_before: int | None = None) -> None:
    """New weights (an nnx.State of the sampling model's graph), swapped in before the
    next step; the prefix cache is dropped. Rows in flight continue on them (partial
    rollouts: each token keeps the version that sampled it; their contexts are
    recomputed under the new weights), except that a row holding a token of a version
    below `restart_before` starts its candidate again from the prompt (abort and
    resample: `version` restarts every row that has sampled)."""
    if self.mesh is not None:
      state = jax.device_put(state, sharding.state_shardings(state, self.mesh))
    with self._cond:
      self._pending = (version, state, restart_before)
      self._cond.notify_all()

  def queue_depth(self) -> int:
    return len(self.waiting) + len(self.resume)

  def busy_rows(self) -> int:
    """Rows admitted: a leader still prefilling counts its group's n."""
    return sum(rows_of(seq) for seq in self.prefilling) + len(self.decoding)

  def idle(self) -> bool:
    return not (self.waiting or self.resume or self.prefilling or self.decoding)

  def generate(self, requests: Sequence[Request]) -> list[Result]:
    """Runs `requests` to the end on this thread (the engine must not be started)."""
    if self._thread is not None:
      raise RuntimeError("generate is for an engine that is not started")
    results: list[Result | None] = [None] * len(requests)
    for i, request in enumerate(requests):
      def done(result, i=i, callback=request.on_done):
        results[i] = result
        if callback is not None:
          callback(result)
      self.submit(with_done(request, done))
    while not self.idle():
      self.step()
    for result in results:
      if result.error is not None:
        raise result.error
    return results

  def start(self) -> Engine:
    """Steps in a thread of its own until `stop`."""
    self._thread = threading.Thread(target=self._loop, name="rlcode-engine", daemon=True)
    self._thread.start()
    return self

  def stop(self, timeout: float | None = None, cancel: bool = False) -> None:
    """Finishes what is admitted and waiting (with `cancel`: fails it, each request's
    on_done told), then ends the loop (a later `start` runs it again)."""
    with self._cond:
      self._stopping, self._cancel = True, cancel
      self._cond.notify_all()
    if self._thread is not None:
      self._thread.join(timeout)
      if not self._thread.is_alive():  # stopped: `start` may run it again
        self._thread, self._stopping, self._cancel = None, False, False

  def _loop(self) -> None:
    while True:
      with self._cond:
        while self.idle() and not (self._pending or self._stopping or self.warm):
          self._cond.wait()
        if self._stopping and (self.idle() or self._cancel):
          break
        warming = self.idle() and not self._pending
      if warming:  # nothing to do: compile a shape a later request may meet
        warmup_lib.run_next(self)
        continue
      start = time.perf_counter()
      try:
        self.step()
      except Exception as e:  # a bug: what is in flight fails, the loop goes on
        log.exception("an engine step failed")
        self._fail_all(e)
      self.stats["busy_seconds"] += time.perf_counter() - start
    if not self.idle():  # stopped with cancel
      self._fail_all(RuntimeError("the engine was stopped"))

  # ------------------------------------------------------------ one step
  def step(self) -> None:
    with self._cond:
      if self._pending is not None:
        self.version, self.state, restart_before = self._pending
        self._pending = None
        self.pool.clear_cache()
        self.stats["swaps"] += 1
        self._recompute(restart_before)
      self._admit()
    if self.prefilling:
      self._prefill()
    if self.decoding:
      self._decode()

  def _live(self) -> list[Row]:
    return self.prefilling + self.decoding

  def _admit(self) -> None:
    """Preempted rows first, then waiting requests in order, while rows and pages last."""
    while self.resume or self.waiting:
      if self.mode == "serial" and self._live():
        return
      if self.resume:
        seq = self.resume[0]
        rows = rows_of(seq)
      else:
        group = self.waiting[0]
        seq = Row(group, 0, list(group.request.prompt), -1, leader=True)
        rows = group.request.n
      if self.busy_rows() + rows > self.max_rows:
        return
      s = self.page_size
      hits = self.pool.lookup(seq.tokens, limit=(len(seq.tokens) - 1) // s)
      self.pool.share(hits)
      own = math.ceil(len(seq.tokens) / s) - len(hits)
      spare = seq.group.request.n - 1 if seq.leader and len(seq.tokens) % s else 0
      pages = self.pool.allocate(own + spare)
      if pages is None:
        self.pool.release(hits)
        return
      seq.pages, seq.spare, seq.cached = hits + pages[:own], pages[own:], len(hits) * s
      seq.kv_version = self.version
      if self.resume and seq is self.resume[0]:
        self.resume.pop(0)
        self.stats["resumed"] += 1
      else:
        self.waiting.popleft()
        seq.group.version = self.version
        seq.group.cached_tokens = seq.cached
        seq.order = self._next_order()
        self.stats["requests"] += 1
      self.stats["prefix_hit_tokens"] += seq.cached
      seq.state = "prefill"
      self.prefilling.append(seq)

  def _next_order(self) -> int:
    self._order += 1
    return self._order

  def _prefill(self) -> None:
    budget, batch = self.prefill_tokens, []
    for seq in self.prefilling:
      take = min(len(seq.tokens) - seq.cached, budget)
      if take <= 0:
        break
      batch.append((seq, take))
      budget -= take
    r = bucket(len(batch), MIN_ROWS)
    t = min(bucket(max(take for _, take in batch), MIN_CHUNK), bucket(self.prefill_tokens))
    tokens = np.zeros((r, t), np.int32)
    valid, lengths = np.zeros(r, np.int32), np.zeros(r, np.int32)
    table = self._table([seq for seq, _ in batch], r)
    for i, (seq, take) in enumerate(batch):
      tokens[i, :take] = seq.tokens[seq.cached:seq.cached + take]
      lengths[i], valid[i] = seq.cached, take
    self.pools, logits, experts = self.programs.forward(self.state, self.pools, tokens, table,
                                                        lengths, valid)
    self.stats["prefill_tokens"] += int(valid.sum())
    self._record([seq for seq, _ in batch], experts, [take for _, take in batch])
    ready = []
    for i, (seq, take) in enumerate(batch):
      seq.cached += take
      if seq.cached == len(seq.tokens):
        self.prefilling.remove(seq)
        self._register(seq)
        ready.append((i, seq))
    if ready:
      self._first_tokens(logits, ready)

  def _first_tokens(self, logits, ready: list[tuple[int, Row]]) -> None:
    """Forks each finished leader into its group's candidates, and samples every ready
    row's next token from its prompt's logits."""
    rows: list[tuple[int, Row]] = []
    copies: list[tuple[int, int]] = []
    for i, seq in ready:
      rows.append((i, seq))
      if seq.leader:
        seq.leader = False
        rows.extend((i, self._fork(seq, c, copies)) for c in range(1, seq.group.request.n))
    for _, seq in rows:  # decoding from here on, where a failure below finds them
      seq.state = "decode"
      self.decoding.append(seq)
    if copies:
      n = bucket(len(copies))
      src = np.full(n, SCRATCH_PAGE, np.int32)
      dst = np.full(n, SCRATCH_PAGE, np.int32)
      src[:len(copies)], dst[:len(copies)] = zip(*copies)
      self.pools = programs.copy_pages(self.pools, src, dst)
    index = np.array([i for i, _ in rows], np.int32)
    r = bucket(len(rows), MIN_ROWS)
    params = self._params([seq for _, seq in rows], r)
    index = np.pad(index, (0, r - len(index)))
    out = programs.sample(logits[index], *params)
    self._emit_all([seq for _, seq in rows], out)

  def _fork(self, leader: Row, c: int, copies: list[tuple[int, int]]) -> Row:
    """Candidate c of the leader's group: the prompt's full pages shared, its last partial
    page copied into a spare page (the candidates write their own tokens into it)."""
    twin = Row(leader.group, c, list(leader.group.request.prompt), leader.order, False)
    full = len(twin.tokens) // self.page_size
    self.pool.share(leader.pages[:full])
    twin.pages = leader.pages[:full]
    if full < len(leader.pages):
      page = leader.spare.pop()
      copies.append((leader.pages[full], page))
      twin.pages = twin.pages + [page]
    twin.cached = len(twin.tokens)
    twin.kv_version = leader.kv_version
    return twin

  def _decode(self) -> None:
    for seq in sorted(self.decoding, key=lambda s: s.order):
      if seq.state == "decode" and seq.cached // self.page_size >= len(seq.pages):
        page = self._page_for(seq)
        if page is not None:
          seq.pages.append(page)
    # Rows of similar lengths decode together: attention reads up to the longest row's
    # pages in a call, so one long row does not make every short one read as far.
    by_width: dict[int, list[Row]] = {}
    for seq in self.decoding:
      by_width.setdefault(self._width(len(seq.pages)), []).append(seq)
    done = []
    for seqs in by_width.values():
      r = bucket(len(seqs), MIN_ROWS)
      tokens = np.zeros(r, np.int32)
      lengths, valid = np.zeros(r, np.int32), np.zeros(r, np.int32)
      for i, seq in enumerate(seqs):
        tokens[i], lengths[i], valid[i] = seq.tokens[-1], seq.cached, 1
      self.pools, *out, experts = self.programs.decode(self.state, self.pools, tokens,
                                                       self._table(seqs, r), lengths, valid,
                                                       *self._params(seqs, r))
      done.append((seqs, out, experts))
    if done:
      self.stats["steps"] += 1
    for seqs, out, experts in done:
      self._record(seqs, experts, [1] * len(seqs))
      for seq in seqs:
        seq.cached += 1
      self._emit_all(seqs, out)

  def _record(self, seqs: list[Row], experts, counts: list[int]) -> None:
    """Routing replay's record: the experts a forward chose for each row's next `counts`
    tokens (from its `cached` position on), kept by the rows whose requests ask."""
    if experts is None or not any(seq.group.request.experts for seq in seqs):
      return
    experts = np.asarray(jax.device_get(experts))
    for i, (seq, count) in enumerate(zip(seqs, counts)):
      record_experts(seq, seq.cached, experts[i, :count])

  def _page_for(self, seq: Row) -> int | None:
    """A page for `seq`, preempting the most recently admitted rows while none is free;
    None if `seq` is the one preempted."""
    while True:
      pages = self.pool.allocate(1)
      if pages is not None:
        return pages[0]
      victim = max((s for s in self._live() + [seq] if s.pages or s is seq),
                   key=lambda s: (s.order, s.c))
      self._preempt(victim)
      if victim is seq:
        return None

  def _preempt(self, seq: Row, count: bool = True) -> None:
    self.pool.release(seq.pages + seq.spare)
    seq.pages, seq.spare, seq.cached = [], [], 0
    if seq.state == "prefill":
      self.prefilling.remove(seq)
    elif seq.state == "decode":
      self.decoding.remove(seq)
    seq.state = "resume"
    seq.tokens = list(seq.group.request.prompt) + seq.candidate.tokens
    self.resume.append(seq)
    self.resume.sort(key=lambda s: s.order)
    self.stats["preemptions"] += count

  def _recompute(self, restart_before: int | None) -> None:
    """After a swap: every row in flight gives up its pages (keys and values of the old
    weights) and is recomputed under the new ones when admitted again, so each token is
    drawn from the distribution its version's weights give its whole context; candidates
    holding a token sampled before version `restart_before` start again from the prompt."""
    for seq in self._live() + self.resume:
      cand = seq.candidate
      if restart_before is not None and cand.versions and min(cand.versions) < restart_before:
        cand.tokens, cand.logprobs, cand.versions, cand.top = [], [], [], []
        cand.experts = []
        cand.restarts += 1
        if seq.group.matchers:
          seq.group.matchers[seq.c] = seq.group.request.grammar.matcher()
        self.stats["restarted"] += 1
      if seq.state != "resume":
        self._preempt(seq, count=False)
      seq.tokens = list(seq.group.request.prompt) + cand.tokens

  def _register(self, seq: Row) -> None:
    """Offers a row's full blocks to later prompts, unless weights were swapped since it
    began (its pages then hold keys and values of the old weights)."""
    if seq.kv_version == self.version:
      self.pool.register(seq.tokens[:seq.cached], seq.pages)

  def _width(self, pages: int) -> int:
    """The page-table width a row of `pages` pages is called with."""
    return min(bucket(pages, MIN_PAGES), bucket(self.max_pages))

  def _table(self, seqs: list[Row], r: int) -> np.ndarray:
    m = self._width(max(len(seq.pages) for seq in seqs))
    table = np.full((r, m), SCRATCH_PAGE, np.int32)
    for i, seq in enumerate(seqs):
      table[i, :len(seq.pages)] = seq.pages
    return table

  def _params(self, seqs: list[Row], r: int):
    return sampling_arrays(seqs, r, self.cfg.vocab_size)

  # ------------------------------------------------------------ tokens out
  def _emit_all(self, seqs: list[Row], out) -> None:
    tok, lp, top_ids, top_lp = jax.device_get(out)
    for i, seq in enumerate(seqs):
      self._emit(seq, int(tok[i]), float(lp[i]), top_ids[i], top_lp[i])

  def _emit(self, seq: Row, tok: int, lp: float, top_ids, top_lp) -> None:
    group, cand = seq.group, seq.candidate
    request = group.request
    cand.tokens.append(tok)
    cand.logprobs.append(lp)
    cand.versions.append(self.version)
    if request.experts:
      cand.experts.append(None)  # processed (and recorded) when it is fed back
    # Tokens a grammar or top-p left out have no probability: not among the top ones.
    top = ([(int(i), float(x)) for i, x in zip(top_ids, top_lp) if math.isfinite(x)]
           if request.top_logprobs else [])
    if request.top_logprobs:
      cand.top.append(top)
    seq.tokens.append(tok)
    self.stats["tokens"] += 1
    reason = None
    if tok in request.stop_tokens or group.matchers and grammar_ends(seq, tok):
      reason = "stop" if group.error is None else "error"
    elif request.stop_check is not None and stops(seq, cand.tokens):
      reason = "stop" if group.error is None else "error"
    elif len(cand.tokens) >= request.max_tokens:
      reason = "length"
    elif len(seq.tokens) >= self.cfg.max_seq_len:
      reason = "length"  # the last token sampled is never fed back
    if request.on_token is not None:
      try:
        request.on_token(seq.c, tok, lp, top)
      except Exception:  # a client's callback never stops the loop
        log.exception("a request's token callback failed")
    if reason is None:
      return
    cand.finish_reason = reason
    if seq.state == "decode":
      self.decoding.remove(seq)
    seq.state = "done"
    self._register(seq)
    self.pool.release(seq.pages)
    seq.pages = []
    group.open -= 1
    if group.open == 0:
      call_done(request, Result(group.candidates, group.version, len(request.prompt),
                                 group.cached_tokens, error=group.error,
                                 prompt_experts=group.prompt_experts))

  def _fail_all(self, error: BaseException) -> None:
    groups = {id(s.group): s.group for s in self._live() + self.resume}
    with self._cond:
      groups.update({id(g): g for g in self.waiting})
      self.waiting.clear()
    for seq in self._live() + self.resume:
      self.pool.release(seq.pages + seq.spare)
      seq.pages, seq.spare = [], []
    self.prefilling, self.decoding, self.resume = [], [], []
    if any(x.is_deleted() for x in self.pools[0]):  # donated to the call that failed
      self.pools = programs.zero_pools(self.cfg, self.pool.num_pages, self.page_size,
                                        self.mesh)
      self.pool = PagePool(self.pool.num_pages, self.page_size,
                           prefix_cache=self.pool.prefix_cache)
    for group in groups.values():
      call_done(group.request, Result([], self.version, len(group.request.prompt),
                                       error=error))
