"""Evaluating a policy: sample completions of held-out tasks, then score them.

`Evaluation` is a run's evaluation (the training loops' eval rows): pass@k for code
tasks with tests, the configured rewards' means otherwise. `restore_policy` and
`evaluate_checkpoint` do the same for a saved policy (`rlcode eval --checkpoint`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from flax import nnx
from tqdm import tqdm

from rlcode import rewards, sandbox
from rlcode.config import record
from rlcode.data import sources
from rlcode.data.tasks import Task
from rlcode.errors import MissingInput
from rlcode.policy.training import PolicyTraining
from rlcode.evaluation import scoring, selection_eval
from rlcode.models.build import build_model
from rlcode.parallel import sharding
from rlcode.rewards.tests import HUMANEVAL_STOP
from rlcode.rl import rollout
from rlcode.runs import checkpoint


def sample_completions(model, tokenizer, tasks: Sequence[Task], *, num_samples: int,
                       temperature: float, max_new_tokens: int, seed: int = 0,
                       batch_prompts: int = 32, mesh=None, progress: bool = False,
                       num_pages: int | None = None) -> tuple[list[Task], list[str]]:
  """`num_samples` completions per task, sampled `batch_prompts` tasks at a time (on an
  engine pool of `num_pages` pages; default: what the batches need).

  Returns (the task of each completion, the completion texts), task-major.
  """
  row_tasks, texts = [], []
  starts = range(0, len(tasks), batch_prompts)
  # Every batch's engine pool sized for the longest prompt: one shape, compiled once.
  longest = max((len(p) for p in rollout.encode_prompts(tokenizer, tasks)), default=0)
  for start in tqdm(starts, desc="eval: sampling", unit="batch", leave=False,
                    disable=not progress or len(starts) < 2):
    ro = rollout.sample(model, tokenizer, list(tasks[start:start + batch_prompts]),
                        group_size=num_samples, max_new_tokens=max_new_tokens,
                        temperature=temperature, seed=seed + start, mesh=mesh,
                        min_prompt_len=longest, num_pages=num_pages)
    row_tasks += ro.row_tasks()
    texts += ro.texts
  return row_tasks, texts


def evaluate_policy(model, tokenizer, tasks: Sequence[Task], *, num_samples: int,
                    temperature: float, max_new_tokens: int, ks: Sequence[int] = (1,),
                    seed: int = 0, batch_prompts: int = 32, mesh=None,
                    reward_options: Mapping | None = None, progress: bool = False,
                    num_pages: int | None = None) -> dict:
  """Samples `num_samples` completions per task and scores them in the sandbox.

  Returns {"pass@k": ... for each k <= num_samples, "n_tasks", "n_samples"};
  at temperature 0 use num_samples=1 (greedy pass@1).
  """
  options = dict(reward_options or {})  # the tests reward's (rlcode.rewards.config)
  options.pop("mode", None)
  options.pop("test_set", None)  # pass@k is always on the hidden tests
  row_tasks, texts = sample_completions(
      model, tokenizer, tasks, num_samples=num_samples, temperature=temperature,
      max_new_tokens=max_new_tokens, seed=seed, batch_prompts=batch_prompts, mesh=mesh,
      progress=progress, num_pages=num_pages)
  pairs = [(t.id, text) for t, text in zip(row_tasks, texts)]
  report, _ = scoring.evaluate_completions(
      tasks, pairs, k=[k for k in ks if k <= num_samples], workers=options.pop("workers", None),
      limits=sandbox.Limits(**{k: v for k, v in options.items() if k != "stop_sequences"}),
      stop_sequences=options.get("stop_sequences", HUMANEVAL_STOP), progress=progress)
  return {**report["pass_at_k"], "n_tasks": report["n_tasks"], "n_samples": report["n_samples"]}


def evaluate_rewards(model, tokenizer, tasks: Sequence[Task], *, weights: Mapping[str, float],
                     options: Mapping[str, Mapping] | None = None, num_samples: int,
                     temperature: float, max_new_tokens: int, seed: int = 0,
                     batch_prompts: int = 32, mesh=None, progress: bool = False,
                     num_pages: int | None = None) -> dict:
  """Samples `num_samples` completions per task and averages the configured rewards.

  For tasks without unit tests (diffs, sections). Returns {"reward_mean",
  "reward_std", and each reward's metrics as "<name>/<metric>"}.
  """
  row_tasks, texts = sample_completions(
      model, tokenizer, tasks, num_samples=num_samples, temperature=temperature,
      max_new_tokens=max_new_tokens, seed=seed, batch_prompts=batch_prompts, mesh=mesh,
      progress=progress, num_pages=num_pages)
  out = rewards.compute(weights, row_tasks, texts, options)
  scores = np.asarray(out.scores)
  return {"reward_mean": float(scores.mean()), "reward_std": float(scores.std()),
          "n_tasks": len(tasks), "n_samples": len(texts), **out.metrics}


@dataclasses.dataclass(frozen=True)
class Evaluation:
  """A run's evaluation of a policy (the training loops' eval rows, `rlcode eval`): the
  sampling of `ev` (config.eval), the rewards it scores (config.rewards' weights and
  config.reward_options), its seed (the run's) and progress bar, and the engine pool's
  pages (`num_pages`, default what each batch needs; a training loop passes the pool its
  rollouts use, rlcode.sampling.engines.shared_pool, so both share compiled programs).
  Called on a policy and tasks: pass@k for code tasks with tests, the rewards' means
  otherwise."""
  ev: Any
  rewards: Mapping[str, float]
  reward_options: Any
  seed: int
  progress: bool = False
  num_pages: int | None = None

  def __call__(self, model, tokenizer, tasks: Sequence[Task], mesh, ks=None) -> dict:
    ev = self.ev
    common = dict(num_samples=ev.num_samples, temperature=ev.temperature,
                  max_new_tokens=ev.max_new_tokens, seed=self.seed + 7919,
                  batch_prompts=ev.batch_prompts, mesh=mesh, progress=self.progress,
                  num_pages=self.num_pages)
    options = rewards.options(self.reward_options)
    if all(t.kind == "code" and t.tests for t in tasks):
      return evaluate_policy(model, tokenizer, tasks, ks=tuple(ks or ev.ks),
                             reward_options=options.get("tests", {}), **common)
    return evaluate_rewards(model, tokenizer, tasks, weights=dict(self.rewards),
                            options=options, **common)


@dataclasses.dataclass(frozen=True)
class Recipe:
  """How a run built its policy, which restoring it repeats: its model section
  (config.model), its optimiser section (a training checkpoint holds the optimiser's state),
  whether it kept a reference policy (rl.beta > 0 or rl.log_kl), and its seed."""
  model: Any
  optimizer: Any
  keeps_reference: bool
  seed: int

  @classmethod
  def of(cls, model, optimizer, rl, seed: int) -> "Recipe":
    """The recipe of a run with these sections (config.model, config.optimizer,
    config.rl) and seed."""
    return cls(model, optimizer, bool(rl.beta > 0 or rl.log_kl), seed)  # LossConfig's


def restore_policy(recipe: Recipe, path: str, mesh, step: int | None = None):
  """(model, tokenizer, step, checkpoint directory) of the checkpoint at `step` (None:
  the latest) under `path`, of a run that built its policy by `recipe`.

  `path` is a workdir, its checkpoints/ directory, or another checkpoint directory
  (a workdir's warm_start/ holds the policy right after its warm start, as does an
  entry of a `warmstart.cache_dir`, which keeps the parameters alone).
  """
  nested = os.path.join(path, "checkpoints")
  directory = nested if os.path.isdir(nested) else path
  with checkpoint.Checkpointer(directory, create=False) as ckpt:
    step = ckpt.latest_step() if step is None else step
    if step is None:
      raise MissingInput(f"no checkpoint under {directory}")
    if step not in ckpt.all_steps():
      raise MissingInput(f"no checkpoint at step {step} under {directory}")
    model, tokenizer = build_model(recipe.model, mesh, recipe.seed)
    graphdef, params = nnx.split(model, nnx.Param)
    if ckpt.saved_shapes(step) == checkpoint.saved_shapes_of(params):
      params, _, step = ckpt.restore(checkpoint.abstract_like(params), step)
    else:  # a training checkpoint: the train state (and the reference, if kept)
      trained = PolicyTraining(model, recipe.optimizer, mesh,
                               keeps_reference=recipe.keeps_reference,
                               base_reloads=bool(recipe.model.hf_path))
      restored, _, step = ckpt.restore(trained.abstract_bundle(), step)
      params = trained.from_bundle(restored)[0].params
  return nnx.merge(graphdef, params), tokenizer, step, directory


def restore_run(path: str, mesh, what: str, step: int | None = None):
  """restore_policy of the run at `path` (a workdir or a checkpoint directory in one) by
  the recipe in its recorded config (`what` names the path in errors)."""
  recorded = record.recorded_config(path, what)
  recipe = Recipe.of(recorded.model, recorded.optimizer, recorded.rl, recorded.seed)
  return restore_policy(recipe, path, mesh, step)


def _restored_with_eval_tasks(recipe: Recipe, mesh_cfg, data, ev, path: str):
  """(mesh, model, tokenizer, step, directory, tasks): a saved policy on the mesh of
  `mesh_cfg` (config.mesh), and the tasks of the eval split of `data` (config.data) that
  fit its context with ev.max_new_tokens (config.eval)."""
  mesh = sharding.mesh_from_config(mesh_cfg)
  model, tokenizer, step, directory = restore_policy(recipe, path, mesh)
  tasks, _ = rollout.fit_tasks(sources.load_eval(data), tokenizer, split="eval",
                               max_seq_len=model.cfg.max_seq_len,
                               max_new_tokens=ev.max_new_tokens,
                               drop_too_long=data.drop_too_long,
                               prompt_format=data.prompt_format)
  return mesh, model, tokenizer, step, directory, tasks


def evaluate_checkpoint(config, path: str, ks=(1,)) -> dict:
  """Held-out evaluation (config.eval, config.data.eval_split) of a saved policy.

  `path` is a workdir or its checkpoints/ directory; the latest step is used.
  """
  mesh, model, tokenizer, step, directory, tasks = _restored_with_eval_tasks(
      Recipe.of(config.model, config.optimizer, config.rl, config.seed), config.mesh,
      config.data, config.eval, path)
  evaluation = Evaluation(config.eval, config.rewards, config.reward_options, config.seed,
                          config.train.progress_bar)
  result = evaluation(model, tokenizer, tasks, mesh, ks=ks)
  return {"step": step, "checkpoint": directory, **result}


def sample_and_select(config, path: str, *, selectors: Sequence[str], ks: Sequence[int],
                      rm_scores: selection_eval.RewardScores | None = None,
                      behaviour_inputs: str = "tests") -> dict:
  """`selection_eval.evaluate_selection` of a saved policy on its config's eval split, with
  max(max(ks), config.eval.num_samples) samples per task."""
  mesh, model, tokenizer, step, directory, tasks = _restored_with_eval_tasks(
      Recipe.of(config.model, config.optimizer, config.rl, config.seed), config.mesh,
      config.data, config.eval, path)
  ev = config.eval
  row_tasks, texts = sample_completions(
      model, tokenizer, tasks, num_samples=max(max(ks), ev.num_samples),
      temperature=ev.temperature, max_new_tokens=ev.max_new_tokens, seed=config.seed + 7919,
      batch_prompts=ev.batch_prompts, mesh=mesh,
      progress=config.train.progress_bar)
  table = selection_eval.evaluate_selection(
      tasks, [(t.id, c) for t, c in zip(row_tasks, texts)], selectors=selectors, ks=ks,
      rm_scores=rm_scores, behaviour_inputs=behaviour_inputs, seed=config.seed)
  return {"step": step, "checkpoint": directory, **table}
