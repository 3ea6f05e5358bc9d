"""GRPO rollouts from any harness that speaks the OpenAI API.

A harness is a Python callable `harness(task, base_url, api_key, episode_id) -> result`: it
works on `task` by calling the policy's OpenAI-compatible endpoint at `base_url` (an
openai client's base_url, "/v1" included) with `api_key`, naming every call's episode
with the header `X-Episode-Id: episode_id` (the openai client's `default_headers` or a
call's `extra_headers`), and returns what its environment made of the episode. The reward
is `reward(task, result)` when a reward function is given, else the result's own: a
number, a mapping with "reward", or an object with a `reward` attribute.

`rollout` runs G episodes of each task at once on a bounded number of threads (at most
`workers` episodes live; an episode that outlives `timeout` seconds is given up), then
takes each episode's recorded segments (rlcode.harness.recorder: the tokens the engine
sampled, their log-probs, the prompts as the engine saw them) from the server's recorder
and the reward from the environment, and lays the groups out as one batch of the
shared-prompt GRPO update (rlcode.rl.shared_prefix) through the built-in agent's
`rlcode.agent.episodes.grpo_batch`.

Failed episodes. An episode fails when its harness raises ("error"), outlives the timeout
("timeout"), made no recorded call ("no_calls"), or its reward cannot be read or is not a
finite number ("reward"). Each failure is logged (a warning naming the episode, the task
and the cause) and counted in the metrics (failed_episodes, failed/<reason>). A group with
a failed episode is dropped whole (dropped_groups): its other episodes' advantages would
be measured against a group that is not the policy's, and nothing of a failed episode is
trained, not even the calls it made before it failed. A step where every episode failed
raises (`AllFailed`, naming the causes and the first error): that is a broken harness or
server, not a policy to train. A harness given up by the timeout keeps its thread until it
returns (Python cannot stop a thread): its later calls are answered and recorded under its
id, which nothing reads; the recorder bounds what it holds.

The batch. An episode is one or more segments (a harness that rewrote its history started
a new one: rlcode.harness.segments). Every segment of a group's G episodes is a row with
its episode's advantage; the group's prompt is the longest prefix all its segments'
prompts share (computed once in the update), the rest of each segment's prompt leads its
row as observation tokens (mask 0). Groups whose segments share no token are laid out a
segment per group. Every group is padded with empty rows (mask 0, advantage 0) to the
largest group's row count. A segment is a sequence of the loss (rl.loss_aggregation's
per-sequence means weigh an episode of k segments k times); padding rows count as rows
in "seq_mean_token_sum_norm"'s denominator.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlcode.harness import segments as segments_lib
from rlcode.harness.segments import Segment

log = logging.getLogger(__name__)

FAILURES = ("error", "timeout", "no_calls", "reward")
Harness = Callable[[Any, str, str, str], Any]
Reward = Callable[[Any, Any], float]


class AllFailed(RuntimeError):
  """Every episode of a step failed."""


@dataclasses.dataclass
class Played:
  """One episode: its task (group `group`, index `index` in it), its id, what the harness
  returned, its reward, its segments and split counts, its calls, and why it failed (None:
  it did not)."""

  task: Any
  group: int
  index: int
  id: str
  result: Any = None
  reward: float = 0.0
  segments: list[Segment] = dataclasses.field(default_factory=list)
  splits: dict[str, int] = dataclasses.field(default_factory=dict)
  calls: int = 0
  seconds: float = 0.0
  failure: str | None = None
  error: str = ""


@dataclasses.dataclass
class Rollout:
  """A step's episodes (task-major, G a task), the groups kept, and what trains.

  Attributes:
    episodes: every episode played, failed ones included.
    kept: the indices of the groups with no failed episode.
    batch: the kept groups' shared-prompt batch (None when no group was kept).
    rewards, adv: per episode of the kept groups (group-major).
    rows: per batch row, (index into `episodes`, segment index), None on padding rows.
    metrics: the step's rollout metrics (`metrics`).
  """

  episodes: list[Played]
  kept: list[int]
  batch: Any
  rewards: np.ndarray
  adv: np.ndarray
  rows: list[tuple[int, int] | None]
  metrics: dict[str, float]


def episode_id(step: int, group: int, index: int) -> str:
  """An unguessable episode id that names where it belongs (rlcode.harness.check_id)."""
  return f"s{step}-g{group}-e{index}-{uuid.uuid4().hex}"


def reward_of(task, result, reward: Reward | None = None) -> float:
  """The episode's reward: reward(task, result), else the result's own; ValueError naming
  what is wrong when there is none or it is not a finite number."""
  if reward is not None:
    value = reward(task, result)
  elif isinstance(result, (int, float, np.number)) and not isinstance(result, bool):
    value = result
  elif isinstance(result, Mapping) and "reward" in result:
    value = result["reward"]
  elif hasattr(result, "reward"):
    value = result.reward
  else:
    raise ValueError(f"the harness returned a {type(result).__name__}, which carries no "
                     "reward (a number, a mapping with 'reward' or an object with a reward "
                     "attribute); give a reward function")
  if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
    raise ValueError(f"the reward is a {type(value).__name__}, not a number")
  if not math.isfinite(float(value)):
    raise ValueError(f"the reward is {float(value)}, not a finite number")
  return float(value)


_TIMED_OUT = object()


def run_bounded(jobs: Sequence[Callable[[], Any]], workers: int, timeout: float | None):
  """Runs `jobs` with at most `workers` live at once, each on a thread of its own (a job
  given up by the timeout no longer counts as live, so it cannot stall the rest). Returns
  per job (value, exception, seconds); the exception is TimeoutError when it was given up."""
  if workers < 1:
    raise ValueError(f"workers={workers} must be >= 1")
  if timeout is not None and not timeout > 0:
    raise ValueError(f"timeout={timeout} must be > 0 seconds (or None: no timeout)")
  n, cond = len(jobs), threading.Condition()
  done: list[Any] = [None] * n
  live: dict[int, float] = {}

  def body(i: int) -> None:
    try:
      out = (jobs[i](), None)
    except BaseException as e:  # noqa: BLE001 - every failure is the episode's, counted
      out = (None, e)
    with cond:
      if done[i] is None:
        done[i] = (*out, time.monotonic() - live.pop(i))
        cond.notify_all()

  started = 0
  with cond:
    while True:
      while started < n and len(live) < workers:
        live[started] = time.monotonic()
        threading.Thread(target=body, args=(started,), daemon=True,
                         name=f"harness-episode-{started}").start()
        started += 1
      if not live:
        break
      wait = None if timeout is None else max(min(live.values()) + timeout - time.monotonic(), 0)
      cond.wait(wait)
      if timeout is not None:
        now = time.monotonic()
        for i, t0 in list(live.items()):
          if now - t0 >= timeout:
            del live[i]
            done[i] = (None, TimeoutError(f"the episode ran past {timeout} s"), now - t0)
  return done


def play(harness: Harness, tasks: Sequence, group_size: int, *, base_url: str,
         api_key: str | None, recorder, reward: Reward | None = None, workers: int = 8,
         timeout: float | None = None, step: int = 0) -> list[Played]:
  """G episodes of each task (task-major), each collected from `recorder` (and dropped
  there) once its harness returned; failures marked, logged, never raised."""
  if group_size < 1:
    raise ValueError(f"group_size={group_size} must be >= 1")
  played = [Played(task=task, group=g, index=i, id=episode_id(step, g, i))
            for g, task in enumerate(tasks) for i in range(group_size)]
  key = api_key or "EMPTY"  # the openai client wants a key; a server without one ignores it
  jobs = [lambda p=p: harness(p.task, base_url, key, p.id) for p in played]
  for p, (result, error, seconds) in zip(played, run_bounded(jobs, workers, timeout)):
    p.seconds = seconds
    recorded = recorder.get(p.id)
    recorder.drop(p.id)
    if error is not None:
      p.failure = "timeout" if isinstance(error, TimeoutError) else "error"
      p.error = f"{type(error).__name__}: {error}"
    elif recorded is None or not recorded.calls:
      p.failure, p.error = "no_calls", (f"no call carried X-Episode-Id: {p.id} (a harness "
                                        "names each call's episode with that header)")
    else:
      p.result, p.segments, p.calls = result, recorded.segments, len(recorded.calls)
      p.splits = recorded.split_counts()
      try:
        p.reward = reward_of(p.task, result, reward)
      except Exception as e:  # noqa: BLE001 - the reward function's failure is the episode's
        p.failure, p.error = "reward", f"{type(e).__name__}: {e}"
    if p.failure is not None:
      p.segments = []  # nothing of a failed episode trains
      log.warning("harness episode %s (task %s) failed (%s): %s", p.id, _task_name(p.task),
                  p.failure, p.error)
  return played


def write_episodes(path: str, played: Sequence[Played]) -> None:
  """The step's episodes as JSON lines at `path` (replaced): each one's id, task, group,
  index, reward, failure, calls, seconds, split counts, its segments (token-exact: prompt,
  tokens, mask, behaviour log-probs, versions) and what its harness returned (JSON as it
  is; what JSON cannot say, as its repr)."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  tmp = f"{path}.tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    for p in played:
      row = {"id": p.id, "task": _task_name(p.task), "group": p.group, "index": p.index,
             "reward": p.reward, "failure": p.failure, "error": p.error, "calls": p.calls,
             "seconds": p.seconds, "splits": p.splits,
             "segments": [s.to_json() for s in p.segments], "result": p.result}
      f.write(json.dumps(row, default=repr) + "\n")
  os.replace(tmp, path)


def _task_name(task) -> str:
  name = task.get("id", task) if isinstance(task, Mapping) else getattr(task, "id", task)
  return str(name)[:80]


def common_prefix(prompts: Sequence[Sequence[int]]) -> int:
  """The length of the longest prefix every prompt shares."""
  first = prompts[0]
  return min((segments_lib.divergence(first, p) for p in prompts[1:]), default=len(first))


def segment_batch(groups: Sequence[Sequence[Played]], adv: np.ndarray, *, pad_id: int,
                  max_len: int):
  """(the shared-prompt batch, rows) of the groups' segments, each row its episode's
  advantage (`adv`: per episode, group-major); rows: (index of the episode in the flat
  list of `groups`' episodes, segment index) per row, None on padding rows."""
  from rlcode.agent import episodes as episodes_lib, sampler  # deferred: they import JAX
  flat = [p for group in groups for p in group]
  if len(adv) != len(flat):
    raise ValueError(f"{len(adv)} advantages for {len(flat)} episodes")
  units, start = [], 0  # (shared prompt length, [(episode, segment)])
  for group in groups:
    segs = [(start + j, s) for j, p in enumerate(group) for s in range(len(p.segments))]
    start += len(group)
    if not segs:
      continue
    shared = common_prefix([flat[e].segments[s].prompt for e, s in segs])
    if shared:
      units.append((shared, segs))
    else:  # nothing shared: each segment its own prompt
      units.extend((len(flat[e].segments[s].prompt), [(e, s)]) for e, s in segs)
  if not units:
    raise ValueError("no segment to train: the groups hold no recorded call")
  width = max(len(rows) for _, rows in units)
  trajs, adv_rows, where = [], [], []
  for shared, rows in units:
    for e, s in rows:
      p = flat[e]
      trajs.append(p.segments[s].trajectory(p.task, status="finished", reward=p.reward,
                                            shared=shared))
      adv_rows.append(adv[e])
      where.append((e, s))
    for _ in range(width - len(rows)):  # padding: nothing trained
      trajs.append(sampler.Trajectory(task=trajs[-1].task, prompt=trajs[-1].prompt))
      adv_rows.append(0.0)
      where.append(None)
  batch = episodes_lib.grpo_batch(trajs, width, np.asarray(adv_rows, np.float32),
                                  pad_id=pad_id, max_len=max_len, mask_cut=False)
  return batch, where


def metrics(played: Sequence[Played], kept: Sequence[int], group_size: int, batch,
            rewards: np.ndarray, adv: np.ndarray) -> dict[str, float]:
  """The step's rollout metrics: episodes, failures (by cause) and dropped groups; over
  the episodes that did not fail: segments, splits (by cause), calls and sampled tokens
  per episode; over the kept groups: rewards and groups with a signal; the tokens the
  batch trains (mask 1) and its rows."""
  ok = [p for p in played if p.failure is None]
  n_ok = max(len(ok), 1)
  causes = collections.Counter(p.failure for p in played if p.failure is not None)
  splits = collections.Counter()
  for p in ok:
    splits.update(p.splits)
  out = {
      "episodes": float(len(played)),
      "failed_episodes": float(sum(causes.values())),
      **{f"failed/{c}": float(causes[c]) for c in FAILURES},
      "groups": float(len(played) // group_size),
      "dropped_groups": float(len(played) // group_size - len(kept)),
      "segments_per_episode": sum(len(p.segments) for p in ok) / n_ok,
      "splits_per_episode": sum(splits.values()) / n_ok,
      **{f"splits/{r}": float(splits[r]) for r in segments_lib.REASONS},
      "calls_per_episode": sum(p.calls for p in ok) / n_ok,
      "sampled_tokens_per_episode": sum(sum(s.mask) for p in ok for s in p.segments) / n_ok,
      "episode_seconds": float(np.mean([p.seconds for p in played])) if played else 0.0,
      "trained_tokens": float(np.asarray(batch.mask).sum()) if batch is not None else 0.0,
      "batch_rows": float(len(batch.adv)) if batch is not None else 0.0,
  }
  if len(rewards):
    out.update(reward_mean=float(rewards.mean()), reward_std=float(rewards.std()),
               groups_with_signal=float(np.mean(
                   np.abs(adv.reshape(-1, group_size)).max(1) > 0)))
  return out


def rollout(harness: Harness, tasks: Sequence, group_size: int, server, *,
            reward: Reward | None = None, advantage: Callable[[np.ndarray], np.ndarray] | None
            = None, pad_id: int, max_len: int, workers: int = 8, timeout: float | None = None,
            step: int = 0) -> Rollout:
  """G episodes of each task through `server` (a rlcode.serve.local.LocalServer, or
  anything with base_url, api_key and recorder; with an engine, its prefix-cache hits are
  counted), their groups without a failed episode laid out for the update.

  advantage: rewards [N] (group-major) -> advantages [N]; default GRPO's
  (rlcode.rl.advantages.group_advantages). max_len: the longest row (the model's context).
  """
  from rlcode.rl import advantages  # deferred: the rl package imports JAX
  if not tasks:
    raise ValueError("rollout: no tasks")
  if not callable(harness):
    raise TypeError(f"rollout: the harness is a {type(harness).__name__}, not a callable "
                    "harness(task, base_url, api_key, episode_id)")
  if reward is not None and not callable(reward):
    raise TypeError(f"rollout: the reward is a {type(reward).__name__}, not a callable "
                    "reward(task, result) or None")
  if advantage is None:
    advantage = lambda r: advantages.group_advantages(r, group_size)
  engine = getattr(server, "engine", None)
  cached0 = engine.stats["prefix_hit_tokens"] if engine is not None else 0
  prefill0 = engine.stats["prefill_tokens"] if engine is not None else 0
  start = time.perf_counter()
  played = play(harness, tasks, group_size, base_url=server.base_url, api_key=server.api_key,
                recorder=server.recorder, reward=reward, workers=workers, timeout=timeout,
                step=step)
  seconds = time.perf_counter() - start
  failed = [p for p in played if p.failure is not None]
  if len(failed) == len(played):
    causes = collections.Counter(p.failure for p in failed)
    raise AllFailed(f"every one of the {len(played)} harness episodes failed ("
                    + ", ".join(f"{c}: {k}" for c, k in sorted(causes.items()))
                    + f"); the first: {failed[0].error}")
  groups = [played[g * group_size:(g + 1) * group_size] for g in range(len(tasks))]
  kept = [g for g, group in enumerate(groups) if all(p.failure is None for p in group)]
  rewards = np.array([p.reward for g in kept for p in groups[g]], np.float32)
  adv = np.asarray(advantage(rewards), np.float32) if kept else np.zeros(0, np.float32)
  batch, rows = None, []
  if kept:
    batch, where = segment_batch([groups[g] for g in kept], adv, pad_id=pad_id,
                                 max_len=max_len)
    index = [g * group_size + i for g in kept for i in range(group_size)]
    rows = [None if w is None else (index[w[0]], w[1]) for w in where]
  out = metrics(played, kept, group_size, batch, rewards, adv)
  out["rollout_seconds"] = seconds
  if engine is not None:
    out["cached_prefix_tokens"] = float(engine.stats["prefix_hit_tokens"] - cached0)
    out["prefill_tokens"] = float(engine.stats["prefill_tokens"] - prefill0)
  return Rollout(episodes=played, kept=kept, batch=batch, rewards=rewards, adv=adv, rows=rows,
                 metrics=out)
