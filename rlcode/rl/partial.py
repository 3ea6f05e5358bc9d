"""Partial rollouts: groups decode on a running engine while the trainer updates.

    feeder   keeps `in_flight` groups submitted, in the task stream's order, to the
             engines of the sampler mesh (one per data shard, each stepping in its own
             thread); a group that finishes makes room for the next
    trainer  next(): the first P groups to finish (scored and turned into advantages
             there) ─► update ─► publish(version, weights): swapped in between two engine
             steps; rows in flight are recomputed under the new weights and continue,
             each token keeping the version that sampled it (AReaL's interruptible,
             PipelineRL's in-flight swap)

So a step waits for the P fastest of its groups, not for the slowest row of a batch, and
the engine never drains between updates; groups decoding or waiting to be taken are kept
at `in_flight`, so a trainer slower than the engines does not pile up stale ones.
Staleness is bounded per token: a group is trained at step k only if every token it holds
came from version >= k - eta (eta = rl.max_staleness); a group with an older token is
dropped, counted (`partial_dropped_groups`) and its task sampled again, so the groups
trained lean towards those that finish within eta updates (long completions are the ones
dropped). The loss's correction reads each row's oldest version
(rlcode.rl.grpo.make_proximal_fn) and each token's own behaviour log-probability.
Randomness: group i of a run started at step s draws from (a seed of the run's seed, s
and i; row; position).

What is approximated: the rewards of a step's groups are computed when the trainer takes
them (on its thread, as the synchronous loop does); a resumed run continues the task
stream after the groups that were in flight at its checkpoint, which are not trained.
This module must not know about losses or models beyond their weights.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from rlcode.engine import Engine, Request
from rlcode.engine.service import RemoteEngine
from rlcode.rl import rollout
from rlcode.rl.async_rollouts import Produced
from rlcode.sampling import Generation, engines as engines_lib

PAGE_SIZE = 16


class PartialRollouts:
  """Rollouts of a GRPO run on running engines (see the module docstring).

  Args:
    model: the policy whose weights the engines start with (version `start`).
    next_tasks: the task stream's next batch (called whenever the feeder needs tasks).
    position: the stream's position (for checkpoints).
    tokenizer, group_size, max_new_tokens, temperature, seed: the rollouts'.
    prompts_per_step: groups the trainer takes a step.
    max_staleness: eta; in_flight: groups kept submitted (default (eta + 1) x P).
    score: (Rollout) -> (advantages, reward seconds): rewards and advantages of groups.
    mesh: the sampler mesh (one engine per data shard).
    max_prompt_tokens: the longest prompt (the pools hold in_flight groups at full length).
    engine_processes: > 0: that many engines, each in a process of its own
      (rlcode.engine.service: weights over a socket; a process that dies is started again
      and its unanswered groups resubmitted, so no finished group is lost and no partial
      one trained), in place of the sampler mesh's in-process engines.
  """

  def __init__(self, model, *, next_tasks: Callable[[], Sequence], position: Callable[[], int],
               tokenizer, group_size: int, max_new_tokens: int, temperature: float,
               seed: int, prompts_per_step: int, max_staleness: int, score: Callable,
               mesh=None, start: int = 0, in_flight: int | None = None,
               max_prompt_tokens: int, engine_processes: int = 0):
    self.tokenizer, self.g, self.p = tokenizer, group_size, prompts_per_step
    self.max_new, self.temperature, self.seed = max_new_tokens, temperature, seed
    self.eta, self.score, self.next_step, self.start = max_staleness, score, start, start
    self._next_tasks, self._position = next_tasks, position
    self.in_flight = in_flight or (max_staleness + 1) * prompts_per_step
    meshes = engines_lib.shard_meshes(mesh) if not engine_processes else [None] * engine_processes
    per_engine = math.ceil(self.in_flight / len(meshes))
    pages = 1 + per_engine * group_size * math.ceil(
        (max_prompt_tokens + max_new_tokens) / PAGE_SIZE)
    sizes = dict(num_pages=pages, page_size=PAGE_SIZE, max_rows=per_engine * group_size,
                 version=start, prefill_tokens=engines_lib.PREFILL_TOKENS, prefix_cache=False)
    self.engines = ([RemoteEngine(model, **sizes) for _ in meshes] if engine_processes else
                    [Engine(model, mesh=m, **sizes) for m in meshes])
    for e in self.engines:
      e.start()
    self._load = [0] * len(self.engines)
    self._cond = threading.Condition()
    self._ready: collections.deque = collections.deque()
    self._tasks: collections.deque = collections.deque()
    self._submitted = 0
    self._error: BaseException | None = None
    self._closing = False
    self.dropped = 0
    self._last = time.perf_counter()
    with self._cond:  # engines already run: a group may finish while the rest go in
      self._top_up()

  def _top_up(self) -> None:
    """Submits groups while fewer than `in_flight` are decoding or waiting to be taken
    (so a trainer slower than the engines does not pile up stale groups); `_cond` held."""
    while (not self._closing and self._error is None
           and sum(self._load) + len(self._ready) < self.in_flight):
      if not self._tasks:
        self._tasks.extend(self._next_tasks())
      self._submit(self._tasks.popleft())

  def _submit(self, task) -> None:
    """A group of `task` to the engine with the fewest groups; `_cond` held."""
    index = self._submitted
    self._submitted += 1
    prompt = rollout.encode_prompts(self.tokenizer, [task])[0]
    e = int(np.argmin(self._load))
    self._load[e] += 1
    self.engines[e].submit(Request(
        prompt, self.max_new, n=self.g, temperature=self.temperature,
        seed=engines_lib.derived_seed(self.seed, self.start, index),
        stop_tokens=self.tokenizer.eos_ids,
        on_done=lambda result: self._done(e, index, task, prompt, result)))

  def _done(self, e: int, index: int, task, prompt, result) -> None:
    """In an engine's thread: the group is ready; the next one goes in."""
    with self._cond:
      self._load[e] -= 1
      if result.error is not None:
        if not self._closing:
          self._error = result.error
      else:
        self._ready.append((index, task, prompt, result.candidates))
        try:
          self._top_up()
        except BaseException as err:  # handed to the trainer, which raises it
          self._error = err
      self._cond.notify_all()

  def next(self) -> tuple[Produced, float]:
    """(the step's rollouts: the first P groups to finish whose tokens are all recent
    enough, seconds the trainer waited)."""
    step, start = self.next_step, time.perf_counter()
    oldest = step - self.eta
    groups = []
    with self._cond:
      while len(groups) < self.p:
        if self._error is not None:
          raise self._error
        if not self._ready:
          self._cond.wait(timeout=1.0)
          continue
        group = self._ready.popleft()
        if min((min(c.versions) for c in group[3] if c.versions), default=step) < oldest:
          self.dropped += 1  # tokens older than the bound: not trained, its task again
          self._submit(group[1])
          continue
        groups.append(group)
      self._top_up()
    waited = time.perf_counter() - start
    self.next_step += 1
    ro, versions = self._rollout(groups)
    adv, reward_s = self.score(ro)
    idle = 0.0  # the engines never wait for the trainer
    return Produced(step, versions, (ro, adv, reward_s, self._position(), {}), idle), waited

  def _rollout(self, groups) -> tuple[rollout.Rollout, np.ndarray]:
    """One Rollout of the groups, prompt-major, and each row's oldest token version."""
    cands = [cand for group in groups for cand in group[3]]
    tokens, logprobs, lengths, finished = engines_lib.candidate_arrays(
        cands, self.max_new, self.tokenizer.pad_id)
    versions = np.array([min(c.versions) if c.versions else self.next_step - 1
                         for c in cands], np.int32)
    gen = Generation(tokens=tokens, logprobs=logprobs, lengths=lengths, finished=finished,
                     prompt_index=np.repeat(np.arange(len(groups)), self.g))
    eos = set(self.tokenizer.eos_ids)
    texts = [self.tokenizer.decode([t for t in c if t not in eos]) for c in gen.completions()]
    now = time.perf_counter()
    seconds, self._last = now - self._last, now
    ro = rollout.Rollout([g[1] for g in groups], [g[2] for g in groups], gen, texts, seconds,
                         self.tokenizer)
    return ro, versions

  def publish(self, version: int, state) -> None:
    """New weights (the sampling model's nnx.State) for every engine, between steps: the
    rows in flight continue on them (recomputed)."""
    for e in self.engines:
      e.publish(state, version)

  def stats(self) -> dict[str, float]:
    busy = sum(e.stats["busy_seconds"] for e in self.engines)
    return {"partial_dropped_groups": float(self.dropped),
            "engine_busy_seconds": busy,
            "engine_restarts": float(sum(getattr(e, "restarts", 0) for e in self.engines))}

  def close(self) -> None:
    """Stops the engines; the groups in flight are dropped."""
    with self._cond:
      self._closing = True
    for e in self.engines:
      e.stop(cancel=True)

  def __enter__(self) -> PartialRollouts:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
