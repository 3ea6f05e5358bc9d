"""Multi-turn sampling with each trajectory's KV cache kept between turns.

`run_episodes` plays G episodes of each of P tasks at once. The task prompt of a
group is prefilled once and read by its G rows as a shared prefix (as in
rlcode.sampling); each row also has its own KV cache, which lives for the whole
episode. A turn is one `rlcode.sampling.decode` loop over all live rows (a row
stops at the closing call tag or end-of-sequence); the host then steps every live
row's environment (in threads: tools wait on their sandbox sessions), encodes the
observations and prefills only the new tokens of each row (the turn's last token,
which the decode loop sampled but did not feed back, and the observation) on top
of its cache, whose length is reset to the row's true length first (the loop
advanced every row by its step count). Peers resend the whole context every turn
and lean on an inference server's prefix cache; `reuse_kv=False` does exactly
that resend here, as the baseline of experiments/agent/kv.py.

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
import contextlib
import dataclasses
import functools
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlcode.kernels.tiling import round_up
from rlcode import sampling
from rlcode.parallel import sharding
from rlcode.agent.chat import ChatFormat
from rlcode.agent.env import CUT, ToolEnv
from rlcode.data.tasks import Task
from rlcode.models.decoder import Decoder, KVCache

MIN_EXTEND_BUCKET = 16
MIN_CACHE = 256
CACHE_MULTIPLE = 128


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


@functools.partial(jax.jit, static_argnames=("graphdef", "mesh"), donate_argnames=("cache",))
def _extend(state, prefix, cache, tokens_bt, n_new_b, *, graphdef, mesh):
  """Appends each row's first n_new tokens of tokens_bt to its cache; returns the logits
  after its last new token [B, V] and the cache (lengths advanced by n_new)."""
  with sharding.activate(mesh) if mesh is not None else contextlib.nullcontext():
    model: Decoder = nnx.merge(graphdef, state)
    start = cache.lengths
    h, cache = model.hidden(tokens_bt, cache=cache, prefix=prefix)
    last = jnp.maximum(n_new_b - 1, 0)
    h_last = jnp.take_along_axis(h, last[:, None, None], axis=1)
    logits = model.logits(h_last)[:, 0]
    return logits, dataclasses.replace(cache, lengths=start + n_new_b)


@dataclasses.dataclass
class Timing:
  """Seconds spent per phase of `run_episodes` (device work is synchronised per call)."""

  prefill: float = 0.0
  decode: float = 0.0
  extend: float = 0.0
  env: float = 0.0
  turns: int = 0
  shrinks: int = 0  # times the batch was cut down to its live rows


def record_end(traj: Trajectory, env: ToolEnv) -> None:
  """Copies how `env`'s ended episode ended into `traj`: status, reward, scored program."""
  traj.status, traj.reward, traj.program = env.status, env.final_reward, env.final_program


def run_episodes(model: Decoder, chat: ChatFormat, envs: Sequence[ToolEnv],
                 tasks: Sequence[Task], *, group_size: int, budgets: Budgets,
                 temperature: float, seed: int, mesh=None, reuse_kv: bool = True,
                 workers: int = 8, timing: Timing | None = None,
                 min_tasks: int = 0, shrink: bool = True) -> list[Trajectory]:
  """Plays len(tasks) * group_size episodes; envs[p * G + g] plays task p.

  The compiled batch holds at least `min_tasks` groups (a last, smaller batch of
  tasks then reuses the programs compiled for the full ones). With `shrink` (and
  kept KV), once the live rows fit in a quarter of the batch, the batch is cut down
  to them (their caches, their prompts' KV and their logits gathered; a quarter at a
  time, so that few shapes compile): the last turns of a few long episodes no longer
  decode the whole batch. Every row keeps its randomness, so the episodes are the
  same either way. Returns the trajectories, task-major (the order of `envs`).
  """
  g = group_size
  if len(envs) != len(tasks) * g:
    raise ValueError(f"{len(envs)} environments for {len(tasks)} tasks x {g} episodes")
  if "nsa" in model.cfg.layer_kinds:
    raise NotImplementedError("multi-turn sampling keeps a shared prompt prefix, which NSA "
                              "layers do not take")
  timing = timing if timing is not None else Timing()
  pool = concurrent.futures.ThreadPoolExecutor(max(1, min(workers, len(envs))))
  try:
    return _run(model, chat, envs, tasks, g, budgets, temperature, seed, mesh, reuse_kv,
                pool, timing, min_tasks, shrink and reuse_kv)
  finally:
    pool.shutdown(wait=True)


def _run(model, chat, envs, tasks, g, budgets, temperature, seed, mesh, reuse_kv, pool,
         timing, min_tasks, shrink):
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
  if budgets.max_total_tokens > model.cfg.max_seq_len:
    raise ValueError(f"max_total_tokens={budgets.max_total_tokens} exceeds the model's "
                     f"context of {model.cfg.max_seq_len}")
  trajs = [Trajectory(tasks[i // g], prompts[i // g]) for i in range(len(envs))]
  n = len(envs)
  model = model.for_sampling()
  graphdef, state = nnx.split(model)
  decode_kw = dict(graphdef=graphdef, max_new_tokens=budgets.max_turn_tokens,
                   temperature=float(temperature), top_k=0, top_p=1.0,
                   stop_tokens=tuple(int(s) for s in chat.stop_ids), pad_id=int(tok.pad_id),
                   mesh=mesh)
  extend_max = _width(budgets.max_observation_tokens + 64)
  # A row's own cache (the prompt is the shared prefix) holds at most max_total_tokens
  # minus its prompt, plus what a turn or an extension writes past the row's length
  # (they write whole padded blocks). It starts small and grows by powers of two up to
  # that (a decode step reads the whole cache, so a cache sized for the end of the
  # longest episode would make every early step pay for it).
  max_cache = round_up(budgets.max_total_tokens - min(len(p) for p in prompts)
                       + max(extend_max, budgets.max_turn_tokens), CACHE_MULTIPLE)
  cache_size = min(sampling.bucket(budgets.max_turn_tokens, MIN_CACHE), max_cache)

  start = time.perf_counter()
  prefix = None
  if reuse_kv:
    first_logits, prefix, cache = sampling.prefill(
        model, prompts, group_size=g, cache_size=cache_size, pad_id=tok.pad_id, mesh=mesh,
        share_prompt=True, min_prompts=min_tasks)
    jax.block_until_ready(first_logits)
  timing.prefill += time.perf_counter() - start
  # The rows of the compiled batch: tasks padded to a power of two, G rows each (and,
  # re-prefilling, each row its own prompt, padded again).
  rows = (first_logits.shape[0] if reuse_kv
          else sampling.bucket(sampling.bucket(max(len(tasks), min_tasks)) * g))
  active = np.zeros((rows,), bool)
  active[:n] = True
  valid = np.zeros((rows,), np.int32)  # tokens of each row in its own cache
  pending = np.zeros((rows,), np.int32)  # each row's last sampled token, not yet fed
  # slots[i]: the row (of the `rows` above, the trajectories' order) that row i of the
  # device batch holds; the host arrays above stay indexed by row.
  slots = np.arange(rows)
  # A mesh's batch axes split the rows: the batch never shrinks below one row a shard.
  floor = sharding.batch_shards(mesh)
  key = jax.random.key(seed)
  turn = 0
  while active.any():
    if not reuse_kv:
      first_logits, cache = _reprefill(model, trajs, active, budgets, tok.pad_id, rows,
                                       mesh, timing)
    start = time.perf_counter()
    size = _shrunk_size(len(slots), int(np.count_nonzero(active)), floor)
    if shrink and size < len(slots):
      first_logits, prefix, cache, slots = _shrink(first_logits, prefix, cache, slots,
                                                   active, size)
      timing.shrinks += 1
    if reuse_kv:
      cache = _fit(cache, int(valid[slots].max()) + budgets.max_turn_tokens, max_cache)
    out_tok, out_lp, lengths, _, cache = sampling.decode(
        state, first_logits, prefix, cache, jax.random.fold_in(key, turn),
        jnp.asarray(~active[slots]), jnp.asarray(slots - np.arange(len(slots)), jnp.int32),
        **decode_kw)
    out_tok, out_lp, lengths = (np.asarray(x) for x in (out_tok, out_lp, lengths))
    timing.decode += time.perf_counter() - start
    turn += 1
    timing.turns += 1
    where = {int(b): i for i, b in enumerate(slots)}

    stepping = []
    for b in np.flatnonzero(active):
      t, k = trajs[b], int(lengths[where[b]])
      toks = out_tok[where[b], :k].tolist()
      room = budgets.max_total_tokens - t.context_tokens
      info = {"turn_tokens": min(k, room)}
      t.tokens += toks[:room]
      t.mask += [1] * min(k, room)
      t.logprobs += out_lp[where[b], :min(k, room)].tolist()
      t.turns.append(info)
      if k > room:
        stepping.append((b, None))
        continue
      ended = ("call" if toks[-1] == chat.close_id else
               "eos" if toks[-1] in tok.eos_ids else "length")
      stepping.append((b, (chat.decode(toks), ended)))
      valid[b] += k - 1
      pending[b] = toks[-1]

    def step(item):
      b, turn_text = item
      if turn_text is None:
        envs[b].abort("max_tokens")
        return b, None
      return b, envs[b].step(*turn_text)

    start = time.perf_counter()
    results = list(pool.map(step, stepping))
    timing.env += time.perf_counter() - start
    new = {}
    for b, result in results:
      t = trajs[b]
      if result is not None:
        t.turns[-1].update(result.info)
      if result is None or result.done:
        active[b] = False
        record_end(t, envs[b])
        continue
      obs, cut = chat.observation_tokens(result.observation, budgets.max_observation_tokens,
                                         budgets.max_observation_bytes)
      t.turns[-1].update(observation_tokens=len(obs), observation_cut=cut)
      if t.context_tokens + len(obs) + 1 > budgets.max_total_tokens:
        envs[b].abort("max_tokens")
        active[b] = False
        record_end(t, envs[b])
        continue
      t.tokens += obs
      t.mask += [0] * len(obs)
      t.logprobs += [0.0] * len(obs)
      new[b] = [int(pending[b])] + obs
    if not new or not reuse_kv:
      continue
    start = time.perf_counter()
    width = _width(max(len(x) for x in new.values()))
    tokens = np.full((len(slots), width), tok.pad_id, np.int32)
    n_new = np.zeros((len(slots),), np.int32)
    for b, x in new.items():
      tokens[where[b], :len(x)] = x
      n_new[where[b]] = len(x)
    cache = _fit(cache, int(valid[slots].max()) + width, max_cache)
    cache = dataclasses.replace(cache, lengths=jnp.asarray(valid[slots]))
    first_logits, cache = _extend(state, prefix, cache, jnp.asarray(tokens),
                                  jnp.asarray(n_new), graphdef=graphdef, mesh=mesh)
    jax.block_until_ready(first_logits)
    valid[slots] += n_new
    timing.extend += time.perf_counter() - start
  return trajs


def _shrunk_size(rows: int, live: int, floor: int) -> int:
  """The batch's rows cut by quarters while the live rows still fit, each size a multiple
  of `floor` (a mesh's batch shards): few sizes, so few compiled shapes."""
  size = rows
  while 4 * live <= size and (size // 4) % floor == 0 and size // 4 >= floor:
    size //= 4
  return size


def _shrink(first_logits, prefix, cache, slots, active, size):
  """The device batch cut to `size` rows that still hold every live row: (logits,
  prefix, cache, slots) of the kept rows, live rows first. The rows of a group no longer
  sit together, so the prefix becomes one per row (its group's): rows/4 prompt copies at
  most against the groups' P before, more prompt memory when G > 4, while the rows' own
  caches shrink by 4x."""
  live = np.flatnonzero(active[slots])
  rest = np.setdiff1d(np.arange(len(slots)), live)
  keep = np.concatenate([live, rest[:size - len(live)]]).astype(np.int32)
  return _gather_rows(first_logits, prefix, cache, jnp.asarray(keep)) + (slots[keep],)


@jax.jit
def _gather_rows(first_logits, prefix, cache, keep):
  group = first_logits.shape[0] // prefix.lengths.shape[0]
  take = lambda x, idx: jnp.take(x, idx, axis=0)
  owner = keep // group
  prefix = dataclasses.replace(prefix, k=tuple(take(k, owner) for k in prefix.k),
                               v=tuple(take(v, owner) for v in prefix.v),
                               lengths=take(prefix.lengths, owner))
  cache = KVCache(k=tuple(take(k, keep) for k in cache.k),
                  v=tuple(take(v, keep) for v in cache.v), lengths=take(cache.lengths, keep))
  return take(first_logits, keep), prefix, cache


def _width(n: int) -> int:
  """The padded width of an extension of n tokens: a power of two up to 64, then a
  multiple of 64 (observations are long; a power of two would waste up to half)."""
  return sampling.bucket(n, MIN_EXTEND_BUCKET) if n <= 64 else round_up(n, 64)


@functools.partial(jax.jit, static_argnames=("size",))
def _grow(cache, *, size):
  pad = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, size - x.shape[2]), (0, 0)))
  return KVCache(k=tuple(pad(k) for k in cache.k), v=tuple(pad(v) for v in cache.v),
                 lengths=cache.lengths)


def _fit(cache, need: int, max_size: int):
  """The cache, grown (by powers of two, at most max_size) to hold `need` positions."""
  size = cache.k[0].shape[2]
  if need <= size:
    return cache
  return _grow(cache, size=min(max(sampling.bucket(need), size), max_size))


def _reprefill(model, trajs, active, budgets, pad_id, rows, mesh, timing):
  """The baseline: every row's whole context so far, prefilled from scratch."""
  start = time.perf_counter()
  seqs = []
  for b in range(rows):
    t = trajs[b] if b < len(trajs) else trajs[0]
    seqs.append(t.prompt + t.tokens if active[b] or b >= len(trajs) else t.prompt)
  # Each row is its own prompt here (group of one), with a private cache.
  first_logits, _, cache = sampling.prefill(
      model, seqs, group_size=1, cache_size=budgets.max_turn_tokens, pad_id=pad_id,
      mesh=mesh, share_prompt=False)
  jax.block_until_ready(first_logits)
  timing.prefill += time.perf_counter() - start
  return first_logits, cache
