"""Multi-turn sampling on the inference engine, each episode's KV kept between turns.

`run_episodes` plays G episodes of each of P tasks at once, on one rlcode.engine.Engine
per data shard of the mesh (rlcode.sampling.engines). A turn is one request per live
episode: the first turn one request per task with n = G (the prompt prefilled once, its
pages shared by the G episodes), each later turn the episode's whole context so far. The
engine's prefix cache holds the episode's full pages from its last turn, so a turn
prefills only the tokens after them: the rest of the last page, the token the last turn
sampled and the observation. Rows stop at the closing call tag or end-of-sequence and
free their pages as they do; the engine steps only the busy rows, so the last turns of a
few long episodes do not pay for the finished ones. Between turns the host steps every
live episode's environment (in threads: tools wait on their sandbox sessions).
`reuse_kv=False` turns the prefix cache off: every turn prefills its whole context, as a
server without one would (the baseline of experiments/agent/kv.py).

A turn's randomness is keyed by (a seed of the episode seed and the turn, the episode's
row, the position in the turn), so an episode samples the same tokens whatever the
others in the batch do, the mesh, and whether the KV was kept.

Trajectories are tokens: the prompt, then the sampled tokens (mask 1, with their
behaviour log-probs under the tempered sampling distribution) and the appended
observation tokens (mask 0), never re-tokenised from text. Budgets: turns (the
environment's max_turns), total tokens (prompt included), tokens per turn, and
observation tokens (cut in the middle by rlcode.agent.chat). A turn or an
observation that would pass the total budget ends the episode (status
max_tokens); what fits of the turn is kept.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any

from rlcode.agent.chat import ChatFormat
from rlcode.agent.env import CUT, ToolEnv
from rlcode.data.tasks import Task
from rlcode.engine import Engine, Request
from rlcode.models.decoder import Decoder
from rlcode.sampling import engines as engines_lib

PAGE_SIZE = 16


@dataclasses.dataclass(frozen=True)
class Budgets:
  """Token budgets of an episode (turns are the environment's max_turns).

  max_total_tokens: prompt + every turn + every observation.
  max_turn_tokens: one policy turn.
  max_observation_tokens: one observation's own text (cut in the middle beyond).
  max_observation_bytes: one observation's UTF-8, cut in the middle before it is
    tokenised (a tool's output may be megabytes).
  """

  max_total_tokens: int = 1024
  max_turn_tokens: int = 192
  max_observation_tokens: int = 256
  max_observation_bytes: int = 16384

  def __post_init__(self):
    if self.max_turn_tokens < 1 or self.max_observation_tokens < 32:
      raise ValueError(f"budgets: max_turn_tokens={self.max_turn_tokens} must be >= 1 and "
                       f"max_observation_tokens={self.max_observation_tokens} >= 32 (room "
                       "for the cut marker)")
    if self.max_total_tokens <= self.max_turn_tokens:
      raise ValueError(f"budgets: max_total_tokens={self.max_total_tokens} must exceed "
                       f"max_turn_tokens={self.max_turn_tokens}")


@dataclasses.dataclass
class Trajectory:
  """One episode as tokens.

  Attributes:
    task: the task.
    prompt: the prompt's tokens (shared by the task's group).
    tokens: every token after the prompt, in order: turns and observations.
    mask: 1 where the policy sampled the token, 0 on observations.
    logprobs: behaviour log-probabilities of sampled tokens, 0 on observations.
    turns: per turn, the environment's info (tool, errors, tests) plus "turn_tokens",
      "observation_tokens" and "observation_cut".
    status: how it ended (rlcode.agent.env.STATUSES).
    reward: the final reward.
    program: the solution file's text that the final reward scored ("" if none).
  """

  task: Task
  prompt: list[int]
  tokens: list[int] = dataclasses.field(default_factory=list)
  mask: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  turns: list[dict[str, Any]] = dataclasses.field(default_factory=list)
  status: str = ""
  reward: float = 0.0
  program: str = ""

  @property
  def context_tokens(self) -> int:
    return len(self.prompt) + len(self.tokens)

  @property
  def tool_calls(self) -> int:
    return sum("tool" in t for t in self.turns)

  @property
  def cut(self) -> bool:
    """Ended by a budget or a timeout."""
    return self.status in CUT


@dataclasses.dataclass
class Timing:
  """Where `run_episodes`' time and tokens went."""

  sample: float = 0.0  # seconds in the engine: prefill and decode
  env: float = 0.0  # seconds stepping environments
  turns: int = 0
  prefill_tokens: int = 0  # context tokens computed
  cached_tokens: int = 0  # context tokens served from the episodes' kept pages


def record_end(traj: Trajectory, env: ToolEnv) -> None:
  """Copies how `env`'s ended episode ended into `traj`: status, reward, scored program."""
  traj.status, traj.reward, traj.program = env.status, env.final_reward, env.final_program


def run_episodes(model: Decoder, chat: ChatFormat, envs: Sequence[ToolEnv],
                 tasks: Sequence[Task], *, group_size: int, budgets: Budgets,
                 temperature: float, seed: int, mesh=None, reuse_kv: bool = True,
                 workers: int = 8, timing: Timing | None = None) -> list[Trajectory]:
  """Plays len(tasks) * group_size episodes; envs[p * G + g] plays task p. Returns the
  trajectories, task-major (the order of `envs`)."""
  g = group_size
  if len(envs) != len(tasks) * g:
    raise ValueError(f"{len(envs)} environments for {len(tasks)} tasks x {g} episodes")
  if "nsa" in model.cfg.layer_kinds:
    raise NotImplementedError("multi-turn sampling runs on the paged engine, whose cache "
                              "NSA layers (compressed per-row state) do not take")
  if budgets.max_total_tokens > model.cfg.max_seq_len:
    raise ValueError(f"max_total_tokens={budgets.max_total_tokens} exceeds the model's "
                     f"context of {model.cfg.max_seq_len}")
  timing = timing if timing is not None else Timing()
  pool = concurrent.futures.ThreadPoolExecutor(max(1, min(workers, len(envs))))
  try:
    return _run(model, chat, envs, tasks, g, budgets, temperature, seed, mesh, reuse_kv,
                pool, timing)
  finally:
    pool.shutdown(wait=True)


def turn_seed(seed: int, turn: int) -> int:
  """The engine seed of a turn (any integer seed; a 32-bit result)."""
  return engines_lib.derived_seed(seed, turn)


def _run(model, chat, envs, tasks, g, budgets, temperature, seed, mesh, reuse_kv, pool,
         timing):
  tok = chat.tokenizer
  start = time.perf_counter()
  first = list(pool.map(lambda pe: pe[0].reset(pe[1]),
                        [(env, tasks[i // g]) for i, env in enumerate(envs)]))
  timing.env += time.perf_counter() - start
  tools = list(envs[0].tools.values())
  prompts = [chat.prompt_tokens(tools, first[p * g]) for p in range(len(tasks))]
  for p, prompt in enumerate(prompts):
    if len(prompt) + budgets.max_turn_tokens > budgets.max_total_tokens:
      raise ValueError(f"task {tasks[p].id!r}: its prompt has {len(prompt)} tokens, which "
                       f"leaves less than max_turn_tokens={budgets.max_turn_tokens} of "
                       f"max_total_tokens={budgets.max_total_tokens}")
  trajs = [Trajectory(tasks[i // g], prompts[i // g]) for i in range(len(envs))]
  # One engine per data shard, each playing a contiguous run of the tasks; its pool holds
  # every one of its episodes at the whole token budget and one token past it (a turn
  # samples at most one token more than the budget leaves, to see that it would not fit).
  meshes = engines_lib.shard_meshes(mesh)
  shards = engines_lib.split(len(tasks), len(meshes))
  per_row = math.ceil((budgets.max_total_tokens + 1) / PAGE_SIZE)
  engines = [Engine(model, num_pages=1 + len(idx) * g * per_row, page_size=PAGE_SIZE,
                    max_rows=len(idx) * g, prefill_tokens=engines_lib.PREFILL_TOKENS,
                    prefix_cache=reuse_kv, mesh=m) if idx else None
             for m, idx in zip(meshes, shards)]
  shard_of = [s for s, idx in enumerate(shards) for _ in idx]
  live = set(range(len(envs)))
  turn = 0
  while live:
    outs: dict[int, tuple[list[int], list[float]]] = {}
    errors: list[BaseException] = []

    def keep(rows, result):
      if result.error is not None:
        errors.append(result.error)
      for b, cand in zip(rows, result.candidates):
        outs[b] = (cand.tokens, cand.logprobs)

    common = dict(temperature=float(temperature), seed=turn_seed(seed, turn),
                  stop_tokens=tuple(int(s) for s in chat.stop_ids))
    budget = lambda context: min(budgets.max_turn_tokens,
                                 budgets.max_total_tokens - context + 1)
    requests: list[list[Request]] = [[] for _ in engines]
    if turn == 0:  # one request a task: its prompt prefilled once for its G episodes
      for p, prompt in enumerate(prompts):
        requests[shard_of[p]].append(Request(
            list(prompt), budget(len(prompt)), n=g, rows=[p * g + c for c in range(g)],
            on_done=lambda res, p=p: keep(range(p * g, p * g + g), res), **common))
    else:
      for b in sorted(live):
        t = trajs[b]
        requests[shard_of[b // g]].append(Request(
            t.prompt + t.tokens, budget(t.context_tokens), rows=[b],
            on_done=lambda res, b=b: keep([b], res), **common))
    before = [e.stats.copy() if e is not None else None for e in engines]
    start = time.perf_counter()
    engines_lib.run_all(engines, requests)
    timing.sample += time.perf_counter() - start
    if errors:
      raise errors[0]
    for e, was in zip(engines, before):
      if e is None:
        continue
      timing.prefill_tokens += e.stats["prefill_tokens"] - was["prefill_tokens"]
      timing.cached_tokens += e.stats["prefix_hit_tokens"] - was["prefix_hit_tokens"]
    turn += 1
    timing.turns += 1

    stepping = []
    for b in sorted(live):
      t, (toks, lps) = trajs[b], outs[b]
      k = len(toks)
      room = budgets.max_total_tokens - t.context_tokens
      t.tokens += toks[:room]
      t.mask += [1] * min(k, room)
      t.logprobs += lps[:room]
      t.turns.append({"turn_tokens": min(k, room)})
      if k > room:
        stepping.append((b, None))
        continue
      ended = ("call" if toks[-1] == chat.close_id else
               "eos" if toks[-1] in tok.eos_ids else "length")
      stepping.append((b, (chat.decode(toks), ended)))

    def step(item):
      b, turn_text = item
      if turn_text is None:
        envs[b].abort("max_tokens")
        return b, None
      return b, envs[b].step(*turn_text)

    start = time.perf_counter()
    results = list(pool.map(step, stepping))
    timing.env += time.perf_counter() - start
    for b, result in results:
      t = trajs[b]
      if result is not None:
        t.turns[-1].update(result.info)
      if result is None or result.done:
        live.discard(b)
        record_end(t, envs[b])
        continue
      obs, cut = chat.observation_tokens(result.observation, budgets.max_observation_tokens,
                                         budgets.max_observation_bytes)
      t.turns[-1].update(observation_tokens=len(obs), observation_cut=cut)
      if t.context_tokens + len(obs) + 1 > budgets.max_total_tokens:
        envs[b].abort("max_tokens")
        live.discard(b)
        record_end(t, envs[b])
        continue
      t.tokens += obs
      t.mask += [0] * len(obs)
      t.logprobs += [0.0] * len(obs)
  return trajs
