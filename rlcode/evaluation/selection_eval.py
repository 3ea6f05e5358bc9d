"""Selection among k samples, run: score each sample by what each selector needs, then
selector@k (rlcode.evaluation.selection holds the arithmetic).
"""

from __future__ import annotations

from collections.abc import Sequence
from rlcode import sandbox
from rlcode.data.tasks import Task
from rlcode.errors import BadInput
from rlcode.rewards.tests import HUMANEVAL_STOP
from rlcode.evaluation import policy_eval
from rlcode.evaluation import scoring


def selection_groups(tasks: Sequence[Task], pairs: Sequence[tuple[str, str]],
                     selectors: Sequence[str], *, rm_checkpoint: str = "",
                     behaviour_inputs: str = "tests", workers: int | None = None,
                     limits: sandbox.Limits | None = None,
                     stop_sequences: Sequence[str] = HUMANEVAL_STOP) -> dict[str, dict]:
  """Per task, what the selectors need of its samples: {"passed": [...], and "scores"
  (the reward model at `rm_checkpoint`) for "rm", "signatures" (rlcode.behaviour on
  `behaviour_inputs`) for "majority"}, samples in file order."""
  from rlcode.evaluation import selection
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
    from rlcode.evaluation import behaviour
    results = behaviour.run(row_tasks, texts, inputs=behaviour_inputs, workers=workers,
                            limits=limits, stop_sequences=stop_sequences)
    passed = [r.passed for r in results]
    per_sample["signatures"] = [behaviour.signature(r.outputs) for r in results]
  else:
    _, rows = scoring.evaluate_completions(tasks, pairs, k=[1], workers=workers, limits=limits,
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
  from rlcode.evaluation import selection
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
  mesh, model, tokenizer, step, directory, tasks = policy_eval._restored_with_eval_tasks(config, path)
  ev = config.eval
  row_tasks, texts = policy_eval.sample_completions(
      model, tokenizer, tasks, num_samples=max(max(ks), ev.num_samples),
      temperature=ev.temperature, max_new_tokens=ev.max_new_tokens, seed=config.seed + 7919,
      batch_prompts=ev.batch_prompts, mesh=mesh,
      progress=config.train.progress_bar)
  table = evaluate_selection(tasks, [(t.id, c) for t, c in zip(row_tasks, texts)],
                             selectors=selectors, ks=ks, rm_checkpoint=rm_checkpoint,
                             behaviour_inputs=behaviour_inputs, seed=config.seed)
  return {"step": step, "checkpoint": directory, **table}
