"""Demonstrations: scripted episodes played through real environments, and imitation of them.

The warm start of the agent loop and its cross-entropy controls train on these episodes'
sampled (call) tokens; the demonstrator is rlcode.agent.expert's, with the flaws the
config asks for (guessing, copying a decoy line, trusting a stale note).
"""

from __future__ import annotations

import concurrent.futures
import time
import numpy as np
from rlcode.policy import sft
from rlcode import optim
from rlcode.agent import expert, episodes, sampler
from rlcode.agent.workspace import workspace_for
from rlcode.errors import BadInput


def expert_episodes(agent, seed: int, tasks, envs, chat, budgets, guess_fraction: float = 0.0,
                    guess_families: tuple[str, ...] | None = None, decoy_copy: float = 0.0,
                    note_trust: float = 0.0) -> list[sampler.Trajectory | None]:
  """One scripted expert episode per task, None where the tool set cannot solve it;
  played on the environments side by side, each taking every len(envs)-th episode.
  guess_fraction > 0: that fraction of the tasks (expert.is_guess, by the run's seed;
  of the `guess_families` only, when given) get the episode of a demonstrator that
  does not look (expert.guess_calls) instead. decoy_copy > 0: on that fraction of the
  tasks with a decoy line (expert.copies_decoy, by the run's seed) the episode copies
  the decoy's value. note_trust > 0: on that fraction of the tasks with a stale note
  (expert.trusts_note, by the run's seed) the episode writes the note's value at once
  (expert.note_calls). A task whose workspace scripts its own agent (rlcode.agent.workspace:
  a real repository's gold patch) gets that agent's episode."""
  jobs = []
  for i, task in enumerate(tasks):
    scripted = workspace_for(task).scripted_calls(task)
    if scripted is not None:
      jobs.append((i, task, scripted))
      continue
    try:
      calls = expert.expert_calls(
          task, agent.toolset, agent.think,
          copy_decoy=expert.copies_decoy(task, decoy_copy, seed))
    except ValueError:
      continue
    if guess_fraction > 0 and expert.is_guess(task, guess_fraction, seed,
                                              guess_families):
      calls = expert.guess_calls(task, agent.toolset, seed)
    if expert.trusts_note(task, note_trust, seed):
      calls = expert.note_calls(task, agent.toolset)
    jobs.append((i, task, calls))
  out: list[sampler.Trajectory | None] = [None] * len(tasks)
  lanes = min(len(envs), len(jobs))

  def lane(k):
    for i, task, calls in jobs[k::lanes]:
      out[i] = expert.expert_trajectory(envs[k], chat, task, calls, budgets)

  with concurrent.futures.ThreadPoolExecutor(max(1, min(agent.workers, lanes))) as pool:
    list(pool.map(lane, range(lanes)))
  return out


def expert_trajectories(agent, seed: int, tasks, envs, chat, budgets,
                        guess_fraction: float = 0.0,
                        guess_families: tuple[str, ...] | None = None,
                        decoy_copy: float = 0.0, note_trust: float = 0.0
                        ) -> list[sampler.Trajectory]:
  """The expert episodes of the tasks its tool set can solve, in task order
  (guess_fraction, guess_families, decoy_copy, note_trust: as in expert_episodes)."""
  return [t for t in expert_episodes(agent, seed, tasks, envs, chat, budgets, guess_fraction,
                                     guess_families, decoy_copy, note_trust)
          if t is not None]


def demonstrations(agent, seed: int, tasks, envs, chat, budgets
                   ) -> list[sampler.Trajectory]:
  """The warm start's episodes (and a cross-entropy control's): the expert's, with
  `agent.guess_fraction` of them (of the `agent.guess_families` only, when set) a
  demonstrator's that does not look, and on `agent.decoy_copy` of the tasks with a decoy
  line the decoy's value copied, and on `agent.note_trust` of the tasks with a stale note
  the note believed without a look (agent: config.agent, seed: the run's)."""
  if agent.note_trust > 0 and not any("note" in t.extra.hint for t in tasks
                                      if t.kind == "code"):
    raise BadInput("agent.note_trust > 0 but no training task has a stale note: "
                   "use data/agent_tasks_notes.jsonl (python data/make_agent_tasks.py --notes)")
  return expert_trajectories(agent, seed, tasks, envs, chat, budgets, agent.guess_fraction,
                             agent.guess_families or None, agent.decoy_copy, agent.note_trust)


def warm_start(ws, agent, graphdef, params, tasks, envs, chat, budgets, mesh, log, *,
               seed: int, trainable, progress: bool = False):
  """Supervised steps on scripted expert episodes of the training tasks (their calls are
  the targets, observations are not) of what `trainable` selects (the warm start's:
  rlcode.policy.warm_start.warm_start_trainable); returns the params and logs one step-0
  row through `log(step, row)`. ws: config.warmstart, agent: config.agent (the
  demonstrator; agent.demo_tasks: only the first that many tasks, for quick runs), seed:
  the run's."""
  start = time.perf_counter()
  tasks = tasks[:agent.demo_tasks]
  trajs = demonstrations(agent, seed, tasks, envs, chat, budgets)
  expert_s = time.perf_counter() - start
  solved = float(np.mean([t.reward >= agent.success_reward for t in trajs]))
  params, stats = imitate(graphdef, params, trajs, chat.tokenizer.pad_id, mesh,
                          optimizer=optim.OptimizerConfig.from_config(ws.optimizer),
                          batch_size=ws.batch_size, seed=seed + 1, steps=ws.steps,
                          progress=progress, trainable=trainable)
  log(0, {"sft_loss_first": stats["loss_first"], "sft_loss_last": stats["loss_last"],
          "sft_steps": ws.steps, "expert_episodes": len(trajs),
          "expert_success": solved, "expert_seconds": expert_s})
  return params


def imitate(graphdef, params, trajs, pad_id, mesh, *, optimizer: optim.OptimizerConfig,
            batch_size: int, seed: int, steps: int | None = None,
            seconds: float | None = None, progress: bool = False, on_step=None,
            trainable=None):
  """Cross-entropy on the sampled (expert) tokens of `trajs`, batches drawn with
  replacement: `steps` steps, or steps until `seconds` of training time were spent (a
  control at another run's training time). on_step, trainable: as in
  sft.train_on_batches.
  Returns the params and {"steps", "seconds", "loss_first", "loss_last",
  "target_tokens"}."""
  rng = np.random.default_rng(seed)

  def next_batch():
    pick = rng.choice(len(trajs), batch_size, replace=len(trajs) < batch_size)
    return episodes.sft_batch([trajs[i] for i in pick], pad_id)
  return sft.train_on_batches(graphdef, params, next_batch, mesh, optimizer=optimizer,
                              batch_size=batch_size, steps=steps, seconds=seconds,
                              progress=progress, desc="imitate", on_step=on_step,
                              trainable=trainable)
