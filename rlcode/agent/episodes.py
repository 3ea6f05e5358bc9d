"""Groups of episodes in, training batches and metrics out.

Everything here runs on the host between jitted calls: building the run's
environments from a config, laying trajectories out for the shared-prompt GRPO
update (each task's prompt once, its G trajectories after it, the loss mask 0 on
observations and, when `mask_cut`, on every token of a trajectory cut by a budget
or a timeout), supervised batches of expert trajectories, and episode metrics.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Sequence

import numpy as np

from rlcode.kernels.tiling import round_up
from rlcode import rewards
from rlcode.rl import shared_prefix
from rlcode.rl import sequences
from rlcode.agent import sampler
from rlcode.agent.chat import ChatFormat
from rlcode.agent.env import STATUSES, Scorer, ToolEnv
from rlcode.agent.memory import Memory
from rlcode.agent.tools import make_tools
from rlcode.sandbox.session import SessionLimits

# Batches are padded to multiples of 128 tokens: an episode's length varies widely, and
# each distinct padded length compiles the update (or the warm-start step) again.
LENGTH_MULTIPLE = 128


def budgets(agent) -> sampler.Budgets:
  return sampler.Budgets(max_total_tokens=agent.max_total_tokens,
                         max_turn_tokens=agent.max_turn_tokens,
                         max_observation_tokens=agent.max_observation_tokens,
                         max_observation_bytes=agent.max_observation_bytes)


def make_envs(agent, n: int, *, rewards_cfg=None, reward_options=None,
              memory: Memory | None = None, embed=None,
              scorer: Scorer | None = None) -> list[ToolEnv]:
  """n environments over the tools of `agent` (config.agent), sharing one scorer (and its
  caches): `scorer`, or a new one of `rewards_cfg` (config.rewards' weights) and
  `reward_options` (config.reward_options)."""
  if scorer is None:
    if rewards_cfg is None:
      raise ValueError("make_envs: pass a scorer, or the rewards to build one of")
    scorer = Scorer(dict(rewards_cfg), rewards.options(reward_options))
  limits = SessionLimits(command_seconds=agent.bash_seconds)
  return [ToolEnv(make_tools(tuple(agent.tools)), scorer, max_turns=agent.max_turns,
                  memory=memory, embed=embed, session_limits=limits,
                  bash_seconds=agent.bash_seconds, episode_seconds=agent.episode_seconds)
          for _ in range(n)]


@contextlib.contextmanager
def closing(envs: Sequence[ToolEnv]):
  """Closes every environment (and its sandbox session) when the block is left."""
  try:
    yield envs
  finally:
    for env in envs:
      env.close()


def chat_format(agent, tokenizer) -> ChatFormat:
  """The episode's format: agent.chat_format (config.agent), "auto" being the tokenizer's
  chat template when it has one, else the compact format."""
  name = agent.chat_format
  if name == "auto":
    name = "template" if getattr(tokenizer, "chat_template", None) is not None else "compact"
  return ChatFormat(name, tokenizer)


def trained_masks(trajs: Sequence[sampler.Trajectory], mask_cut: bool) -> list[list[int]]:
  """Each trajectory's loss mask: its sampled tokens, none of a cut one when mask_cut."""
  return [[0] * len(t.mask) if (mask_cut and t.cut) else list(t.mask) for t in trajs]


def grpo_batch(trajs: Sequence[sampler.Trajectory], group_size: int, adv: np.ndarray, *,
               pad_id: int, max_len: int, mask_cut: bool) -> shared_prefix.GroupedBatch:
  """The shared-prompt batch: prompts once per group, trajectories after them."""
  prompts = [trajs[i].prompt for i in range(0, len(trajs), group_size)]
  longest = max(max(len(t.tokens) for t in trajs), 1)
  length = min(round_up(longest, LENGTH_MULTIPLE), max_len)
  return shared_prefix.grouped_batch(
      prompts, [t.tokens for t in trajs], pad_id=pad_id, completion_len=length,
      old_logp=[t.logprobs for t in trajs], adv=adv, masks=trained_masks(trajs, mask_cut))


def sft_batch(trajs: Sequence[sampler.Trajectory], pad_id: int) -> sequences.SequenceBatch:
  """Prompt + trajectory rows; the targets are the trajectory's sampled (expert) tokens.

  A row is as long as its batch's longest prompt + trajectory, rounded up: the target
  window (`width`) may run past a row's end, where it is clipped and masked
  (rlcode.grpo.sequence_logprobs), so the longest prompt and the longest trajectory
  need not both fit (about a fifth fewer positions for the agent's warm start)."""
  n = len(trajs)
  width = round_up(max(max(len(t.tokens) for t in trajs), 1), LENGTH_MULTIPLE)
  seq_len = round_up(max(len(t.prompt) + len(t.tokens) for t in trajs), LENGTH_MULTIPLE)
  tokens = np.full((n, seq_len), pad_id, np.int32)
  mask = np.zeros((n, width), np.float32)
  for i, t in enumerate(trajs):
    tokens[i, :len(t.prompt)] = t.prompt
    tokens[i, len(t.prompt):len(t.prompt) + len(t.tokens)] = t.tokens
    mask[i, :len(t.mask)] = t.mask
  starts = np.array([len(t.prompt) - 1 for t in trajs], np.int32)
  return sequences.SequenceBatch(tokens=tokens, start=starts, mask=mask,
                            old_logp=np.zeros_like(mask), ref_logp=np.zeros_like(mask),
                            adv=np.zeros((n,), np.float32), weight=np.ones_like(mask))


def episode_metrics(trajs: Sequence[sampler.Trajectory], success_reward: float) -> dict:
  """Means over episodes: success, reward, tool calls, turns, context tokens, statuses,
  tool use, call errors and per-turn test signals; success per task family
  ("success/<family>", the second component of ids like "agent/search/sub/k6/LIMIT").
  A data set's own metrics are its own module's (rlcode.agent.expert.hint_metrics)."""
  n = max(len(trajs), 1)
  turns = [x for t in trajs for x in t.turns]
  tools = collections.Counter(x["tool"] for x in turns if "tool" in x)
  tests = [x["tests_passed"] for x in turns if x.get("tool") == "run_tests"
           and "tests_passed" in x]
  out = {
      "success": float(np.mean([t.reward >= success_reward for t in trajs])),
      "reward_mean": float(np.mean([t.reward for t in trajs])),
      "tool_calls_per_episode": sum(t.tool_calls for t in trajs) / n,
      "turns_per_episode": len(turns) / n,
      "context_tokens": float(np.mean([t.context_tokens for t in trajs])),
      "sampled_tokens": float(np.mean([sum(t.mask) for t in trajs])),
      "cut_rate": float(np.mean([t.cut for t in trajs])),
      "call_error_rate": sum("call_error" in x for x in turns) / max(len(turns), 1),
      "observation_cut_rate": sum(bool(x.get("observation_cut")) for x in turns)
                              / max(len(turns), 1),
      "run_tests_pass_rate": float(np.mean(tests)) if tests else 0.0,
  }
  out.update({f"status/{s}": sum(t.status == s for t in trajs) / n for s in STATUSES})
  out.update({f"tool/{name}": c / n for name, c in sorted(tools.items())})
  families = collections.defaultdict(list)
  for t in trajs:
    parts = t.task.id.split("/")
    if len(parts) > 2:
      families[parts[1]].append(t.reward >= success_reward)
  out.update({f"success/{f}": float(np.mean(v)) for f, v in sorted(families.items())})
  return out


def embedder(agent):
  """MiniLM embeddings for semantic search when agent.semantic_search, else None."""
  if not agent.semantic_search:
    return None
  from rlcode.rewards import semantic  # deferred: the encoder model, for agents that search
  return lambda texts: semantic.embed(list(texts))
