"""What playing episodes through the OpenAI API costs: the built-in agent loop against an
outside harness on the same tasks, policy, tools and budgets.

    python -m experiments.speed.harness_overhead [--batches 4] [--warmup 1]
        [--policy DIR] [--name harness_overhead] [--config.a.b=value ...]

configs/agent_tiny.py's episodes (its training tasks, tools, chat format, budgets,
rl.prompts_per_step x rl.group_size episodes a batch, at rl.temperature), played two ways,
side by side in one process, batch for batch on the same tasks:

- `built-in`: `rlcode.agent.sampler.run_episodes`, the agent trainer's own loop: every
  live episode's turn sampled together on the paged engine in process (each episode's
  earlier turns from its kept pages), the tools stepped on a thread pool.
- `harness`: `ApiAgent`, an agent that knows only the OpenAI API, plays the same tool
  environment (rlcode.agent.env.ToolEnv, the same chat format's text) as a harness of
  `rlcode.harness.rollouts.play`: one thread an episode, one openai client (its connection
  pool) for all, each turn a POST
  /v1/completions of the whole episode's text so far (stop at the closing call tag,
  max_tokens the turn's budget, counted with the tokenizer as the built-in loop counts),
  to `rlcode serve`'s app on a loopback port in this process (LocalServer: the engine with
  the same KV memory, as many rows as episodes, its prefix cache finding each episode's
  earlier turns), every call recorded per episode as a training run records it.

The policy is the config's model from its seed (random weights) unless --policy names a
run's warm_start/ or checkpoints/ directory: a random policy's turns run to the turn's
token cap and fail to parse, so every episode runs to its budgets, which is the most
decoding per episode. The first --warmup batches compile and are left out. Prints the
table and the grep-able line `harness/built-in: episodes per minute Nx, tokens per second
Nx`; writes results/speed/NAME.
"""

from __future__ import annotations

import argparse
import math
import os
import queue
import secrets
import threading
import time

import numpy as np

from experiments.lib import agent as agent_lib
from experiments.lib import results, runs
from experiments.lib.agent import CONFIG
from rlcode.agent import episodes as agent_episodes
from rlcode.agent import sampler
from rlcode.agent.calls import CALL_CLOSE, CALL_OPEN
from rlcode.config import loader
from rlcode.harness import HEADER, rollouts
from rlcode.models.build import build_model
from rlcode.parallel import sharding
from rlcode.sampling import engines as engines_lib
from rlcode.serve.local import LocalServer


class ApiAgent:
  """harness(task, base_url, api_key, episode_id): one episode of the tool environment
  through /v1/completions (module docstring); returns the final reward."""

  def __init__(self, chat, envs, budgets, temperature: float, model: str):
    self.chat, self.budgets, self.temperature, self.model = chat, budgets, temperature, model
    self.envs: queue.Queue = queue.Queue()
    for env in envs:
      self.envs.put(env)
    self.clients: dict = {}
    self.lock = threading.Lock()

  def client(self, base_url: str, api_key: str):
    """One openai client (its connection pool) for every episode, as a harness keeps one;
    each call names its episode in extra_headers."""
    import openai
    with self.lock:
      if (base_url, api_key) not in self.clients:
        self.clients[base_url, api_key] = openai.OpenAI(base_url=base_url, api_key=api_key,
                                                        max_retries=0, timeout=600)
      return self.clients[base_url, api_key]

  def __call__(self, task, base_url: str, api_key: str, episode_id: str) -> float:
    import openai
    env = self.envs.get()
    client, headers = self.client(base_url, api_key), {HEADER: episode_id}
    b, chat = self.budgets, self.chat
    try:
      tools = list(env.tools.values())
      first = env.reset(task)
      text, context = chat.prompt_text(tools, first), len(chat.prompt_tokens(tools, first))
      while True:
        # The server serves prompt + max_tokens within the context; the built-in loop's
        # one token past the budget (to see a turn would not fit) is left out here.
        budget = min(b.max_turn_tokens, b.max_total_tokens - context)
        if budget < 1:
          env.abort("max_tokens")
          break
        try:
          reply = client.completions.create(model=self.model, prompt=text, max_tokens=budget,
                                            temperature=self.temperature, stop=[CALL_CLOSE],
                                            extra_headers=headers)
        except openai.BadRequestError as e:
          # The text re-tokenised (the server's count) outgrew the context: a budget's end.
          if getattr(e, "code", None) != "context_length_exceeded":
            raise
          env.abort("max_tokens")
          break
        choice = reply.choices[0]
        ended = ("length" if choice.finish_reason == "length" else
                 "call" if CALL_OPEN in choice.text else "eos")
        turn = choice.text + (CALL_CLOSE if ended == "call" else "")
        context = reply.usage.prompt_tokens + reply.usage.completion_tokens
        text += turn
        step = env.step(turn, ended)
        if step.done:
          break
        obs, _ = chat.observation_tokens(step.observation, b.max_observation_tokens,
                                         b.max_observation_bytes)
        if context + len(obs) + 1 > b.max_total_tokens:
          env.abort("max_tokens")
          break
        context += len(obs)
        text += chat.decode(obs)
      return env.final_reward
    finally:
      env.close()
      self.envs.put(env)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batches", type=int, default=4)
  parser.add_argument("--warmup", type=int, default=1)
  parser.add_argument("--policy", default=None,
                      help="a run's warm_start/ or checkpoints/ (default: random weights)")
  parser.add_argument("--name", default="harness_overhead")
  args, overrides = parser.parse_known_args()
  config = loader.load_config(CONFIG, overrides)
  rl, agent = config.rl, config.agent
  mesh = sharding.mesh_from_config(config.mesh)
  if args.policy:
    model, tokenizer, _, _ = runs.restore_policy(config, args.policy, mesh)
  else:
    model, tokenizer = build_model(config.model, mesh, config.seed)
  chat = agent_episodes.chat_format(agent, tokenizer)
  budgets = agent_episodes.budgets(agent)
  n = rl.prompts_per_step * rl.group_size
  tasks = agent_lib.split_tasks(config, config.data.train_split)
  rng = np.random.default_rng(config.seed)
  batches = [list(rng.choice(len(tasks), rl.prompts_per_step, replace=False))
             for _ in range(args.warmup + args.batches)]

  per_row = math.ceil((budgets.max_total_tokens + 1) / sampler.PAGE_SIZE)
  serve = {"slots": n, "page_size": sampler.PAGE_SIZE, "kv_pages": 1 + n * per_row,
           "prefill_tokens": engines_lib.PREFILL_TOKENS, "prefix_cache": True,
           "default_max_tokens": budgets.max_turn_tokens}
  rows = []
  with LocalServer(model, tokenizer, api_key=secrets.token_urlsafe(16), name="policy",
                   serve=serve) as server:
    harness = ApiAgent(chat, agent_lib.make_envs(config, n), budgets, rl.temperature,
                       "policy")
    builtin_envs = agent_lib.make_envs(config, n)
    for i, picks in enumerate(batches):
      batch = [tasks[j] for j in picks]
      start = time.perf_counter()
      trajs = sampler.run_episodes(model, chat, builtin_envs, batch, group_size=rl.group_size,
                                   budgets=budgets, temperature=rl.temperature,
                                   seed=config.seed + i, mesh=mesh, workers=n)
      builtin_s = time.perf_counter() - start
      start = time.perf_counter()
      played = rollouts.play(harness, batch, rl.group_size, base_url=server.base_url,
                             api_key=server.api_key, recorder=server.recorder, workers=n,
                             timeout=600.0, step=i)
      harness_s = time.perf_counter() - start
      failed = [p for p in played if p.failure]
      if failed:
        raise SystemExit(f"batch {i}: {len(failed)} harness episodes failed; the first: "
                         f"{failed[0].error}")
      row = {"batch": i, "warmup": i < args.warmup,
             "builtin_seconds": builtin_s, "harness_seconds": harness_s,
             "builtin_tokens": int(sum(sum(t.mask) for t in trajs)),
             "harness_tokens": int(sum(sum(s.mask) for p in played for s in p.segments)),
             "builtin_turns": float(np.mean([len(t.turns) for t in trajs])),
             "harness_calls": float(np.mean([p.calls for p in played])),
             "harness_segments": float(np.mean([len(p.segments) for p in played])),
             "builtin_reward": float(np.mean([t.reward for t in trajs])),
             "harness_reward": float(np.mean([p.reward for p in played]))}
      rows.append(row)
      print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in row.items()), flush=True)

  timed = [r for r in rows if not r["warmup"]]
  total = {arm: {"seconds": sum(r[f"{arm}_seconds"] for r in timed),
                 "tokens": sum(r[f"{arm}_tokens"] for r in timed)}
           for arm in ("builtin", "harness")}
  for arm, t in total.items():
    t["episodes_per_minute"] = 60 * n * len(timed) / t["seconds"]
    t["tokens_per_second"] = t["tokens"] / t["seconds"]
  ratio = {k: total["harness"][k] / total["builtin"][k]
           for k in ("episodes_per_minute", "tokens_per_second")}
  print("\n| arm | episodes | seconds | episodes/min | sampled tokens | tokens/s |")
  print("|---|---:|---:|---:|---:|---:|")
  for arm, t in total.items():
    print(f"| {arm} | {n * len(timed)} | {t['seconds']:.1f} | {t['episodes_per_minute']:.1f} "
          f"| {t['tokens']} | {t['tokens_per_second']:.0f} |")
  print(f"harness/built-in: episodes per minute {ratio['episodes_per_minute']:.2f}x, "
        f"tokens per second {ratio['tokens_per_second']:.2f}x")
  print(f"load average: {os.getloadavg()}")
  results.write("speed", args.name, {"batches": rows, "total": total, "ratio": ratio,
                                     "episodes_per_batch": n, "policy": args.policy,
                                     "load_average": os.getloadavg()}, config=config)


if __name__ == "__main__":
  main()
