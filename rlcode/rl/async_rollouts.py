"""Rollouts produced while the trainer updates: versioned weights, bounded staleness.

    sampler thread: acquire weights v >= k - eta ─► produce(k) ─► bounded queue
    trainer:        take batch k ─► update ─► version k + 1 ─► publish (WeightSync)

A sampler thread produces the rollouts of steps k = start, start + 1, ... in order
into a queue of at most eta + 1 entries (eta = rl.max_staleness), while the trainer
takes them one by one. Step k may only be sampled with weights of version >= k - eta
(AReaL's capacity rule; version v is the policy after v updates), so with eta = 0 the
sampler waits for each update and the loop is the synchronous one, exactly. Each
entry carries the version it was sampled with; the loss corrects for the lag
(rlcode.grpo.make_proximal_fn).

Which allowed version the sampler takes is a policy: "latest" (the newest published,
as AReaL: lag at most eta, often less; which one depends on timing) or "oldest"
(exactly max(start, k - eta): every run, on any mesh, sees the same lags, so it
reproduces its numbers; it may hold up to eta + 1 versions).

`WeightSync` moves the trainer's parameters to the sampler's devices and layout with
JAX resharding (jax.device_put to the sampler's shardings; across processes, one
all-gather into a whole copy per process first). The trainer's buffers are donated
to its next update, so the sampler always gets its own copy.

Everything here is host-side orchestration: it must not know about models, rewards
or losses (the caller's `produce` does the sampling and scoring).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import Mesh

from rlcode.parallel import distributed, sharding

POLICIES = ("latest", "oldest")


class Closed(Exception):
  """The rollouts were closed while a thread waited on them."""


class WeightStore:
  """Published weights by version; the sampler acquires them under the capacity rule."""

  def __init__(self, max_staleness: int, policy: str = "latest"):
    if max_staleness < 0:
      raise ValueError(f"rl.max_staleness={max_staleness} must be >= 0")
    if policy not in POLICIES:
      raise ValueError(f"rl.sample_version={policy!r}; expected one of {POLICIES}")
    self.max_staleness, self.policy = max_staleness, policy
    self._versions: dict[int, Any] = {}
    self._first: int | None = None
    self._closed = False
    self._cond = threading.Condition()

  def publish(self, version: int, weights: Any) -> None:
    with self._cond:
      if self._versions and version <= max(self._versions):
        raise ValueError(f"version {version} published after version {max(self._versions)}")
      if self._first is None:
        self._first = version
      if self.policy == "latest":
        self._versions.clear()
      self._versions[version] = weights
      self._cond.notify_all()

  def wanted(self, index: int) -> int:
    """The oldest version step `index` may be sampled with."""
    first = 0 if self._first is None else self._first
    return max(first, index - self.max_staleness)

  def acquire(self, index: int) -> tuple[int, Any]:
    """(version, weights) for sampling step `index`; blocks until a version allowed for it
    is published. Raises Closed if the store is closed meanwhile."""
    with self._cond:
      while True:
        if self._closed:
          raise Closed()
        want = self.wanted(index)
        if self.policy == "latest" and self._versions and max(self._versions) >= want:
          version = max(self._versions)
          return version, self._versions[version]
        if self.policy == "oldest" and want in self._versions:
          for old in [v for v in self._versions if v < want]:
            del self._versions[old]  # later steps want later versions
          return want, self._versions[want]
        self._cond.wait()

  def latest(self) -> tuple[int, Any]:
    """The newest published (version, weights)."""
    with self._cond:
      version = max(self._versions)
      return version, self._versions[version]

  def close(self) -> None:
    with self._cond:
      self._closed = True
      self._versions.clear()
      self._cond.notify_all()


@dataclasses.dataclass
class Produced:
  """One step's rollouts as the sampler handed them over.

  index: the step that trains on them. version: the policy version they were sampled
  with. value: what `produce` returned. sampler_idle_seconds: how long the sampler
  waited (for weights, or for room in the queue) since it handed over the step before.
  """

  index: int
  version: int
  value: Any
  sampler_idle_seconds: float


class AsyncRollouts:
  """A sampler thread running `produce(index, version, weights)` for steps start..stop-1.

  Use as a context manager (or call `close`): closing stops the thread and drops what
  it produced ahead. An exception in `produce` is raised again by `next`.
  """

  def __init__(self, produce: Callable[[int, int, Any], Any], store: WeightStore, *,
               start: int, stop: int):
    self._produce, self._store = produce, store
    self._next, self._stop = start, stop
    self._queue: queue.Queue[Produced] = queue.Queue(maxsize=store.max_staleness + 1)
    self._error: BaseException | None = None
    self._closing = threading.Event()
    self._thread = threading.Thread(target=self._run, name="rlcode-sampler", daemon=True)
    self._thread.start()

  def _run(self) -> None:
    idle = 0.0
    try:
      for index in range(self._next, self._stop):
        start = time.perf_counter()
        version, weights = self._store.acquire(index)
        idle += time.perf_counter() - start
        value = self._produce(index, version, weights)
        del weights  # let a superseded version go as soon as the trainer drops it too
        item = Produced(index, version, value, idle)
        start = time.perf_counter()
        while not self._closing.is_set():
          try:
            self._queue.put(item, timeout=0.1)
            break
          except queue.Full:
            continue
        idle = time.perf_counter() - start
    except Closed:
      pass
    except BaseException as e:  # handed to the trainer, which raises it
      self._error = e

  def next(self) -> tuple[Produced, float]:
    """(the next step's rollouts, seconds the trainer waited for them)."""
    start = time.perf_counter()
    while True:
      try:
        item = self._queue.get(timeout=0.1)
      except queue.Empty:
        if self._error is not None:
          raise self._error
        if not self._thread.is_alive():
          raise RuntimeError("the sampler thread ended before producing step "
                             f"{self._next} (its last step is {self._stop - 1})")
        continue
      if item.index != self._next:
        raise RuntimeError(f"sampler produced step {item.index}, expected {self._next}")
      self._next += 1
      return item, time.perf_counter() - start

  def close(self) -> None:
    self._closing.set()
    self._store.close()
    self._thread.join()

  def __enter__(self) -> AsyncRollouts:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


class WeightSync:
  """Copies the trainer's parameters into the sampler's devices and layout.

  `sampler_mesh` is this process's sampler mesh (rlcode.distributed.meshes): the
  trainer's own block of devices, or a disjoint set. Across processes the parameters
  are first all-gathered into one whole copy per process (laid out over its block of
  the trainer's devices); then one jax.device_put places them in the sampler's
  shardings. Calls are collective when there are several processes: every process
  calls at the same point of the loop.
  """

  def __init__(self, trainer_mesh: Mesh, sampler_mesh: Mesh, params: Any):
    self._multi = jax.process_count() > 1
    if self._multi:
      self._gathered = sharding.state_shardings(params, distributed.process_mesh(trainer_mesh))
      self._block = distributed.local_block(trainer_mesh)
      self._local = sharding.state_shardings(params, self._block)
    self._target = sharding.state_shardings(params, sampler_mesh)

  def __call__(self, params: Any) -> tuple[Any, float]:
    """(the sampler's copy of `params`, seconds it took, until the copy is ready)."""
    start = time.perf_counter()
    if self._multi:
      params = distributed.to_local(jax.device_put(params, self._gathered), self._block,
                                    self._local)
    copy = jax.device_put(params, self._target, may_alias=False)
    jax.block_until_ready(copy)
    return copy, time.perf_counter() - start
