"""Selection among k samples, run: score each sample by what each selector needs, then
selector@k (rlcode.evaluation.selection holds the arithmetic).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rlcode import sandbox
from rlcode.data.tasks import Task
from rlcode.errors import BadInput
from rlcode.rewards.tests import HUMANEVAL_STOP
from rlcode.evaluation import behaviour, scoring, selection

# (row tasks, texts, stop sequences, workers) -> one reward-model score per sample; the
# reward model's side builds it (rlcode.rm.scorer.selection_scorer), so evaluation does
# not import rm.
RewardScores = Callable[[Sequence[Task], Sequence[str], Sequence[str], int | None],
                        Sequence[float]]


def selection_groups(tasks: Sequence[Task], pairs: Sequence[tuple[str, str]],
                     selectors: Sequence[str], *, rm_scores: RewardScores | None = None,
                     behaviour_inputs: str = "tests", workers: int | None = None,
                     limits: sandbox.Limits | None = None,
                     stop_sequences: Sequence[str] = HUMANEVAL_STOP) -> dict[str, dict]:
  """Per task, what the selectors need of its samples: {"passed": [...], and "scores"
  (by `rm_scores`) for "rm", "signatures" (rlcode.behaviour on `behaviour_inputs`) for
  "majority"}, samples in file order."""
  unknown = sorted(set(selectors) - set(selection.SELECTORS))
  if unknown:
    raise BadInput(f"--select {','.join(selectors)}: unknown selector(s) {unknown}; choose "
                   f"from {','.join(selection.SELECTORS)}")
  if "rm" in selectors and rm_scores is None:
    raise BadInput("--select rm needs --rm: a reward model's workdir (rlcode train-rm)")
  by_id = {t.id: t for t in tasks}
  row_tasks = [by_id[tid] for tid, _ in pairs]
  texts = [text for _, text in pairs]
  per_sample: dict[str, list] = {}
  if "majority" in selectors:
    # One run per sample gives its verdict and its answers on the inputs.
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
    per_sample["scores"] = list(rm_scores(row_tasks, texts, stop_sequences, workers))
  for name, values in per_sample.items():
    for (tid, _), value in zip(pairs, values):
      groups[tid].setdefault(name, []).append(value)
  return groups


def evaluate_selection(tasks: Sequence[Task], pairs: Sequence[tuple[str, str]], *,
                       selectors: Sequence[str], ks: Sequence[int],
                       rm_scores: RewardScores | None = None,
                       behaviour_inputs: str = "tests", workers: int | None = None,
                       limits: sandbox.Limits | None = None, seed: int = 0) -> dict:
  """selector@k for every selector and k (rlcode.selection.selection_table), plus the
  sample counts; k larger than the fewest samples of a task is an error."""
  groups = selection_groups(tasks, pairs, selectors, rm_scores=rm_scores,
                            behaviour_inputs=behaviour_inputs, workers=workers, limits=limits)
  fewest = min(len(g["passed"]) for g in groups.values())
  if max(ks) > fewest:
    raise BadInput(f"--k {','.join(map(str, ks))}: a task has only {fewest} samples; "
                   f"selection at k needs at least k samples per task")
  table = selection.selection_table(groups, selectors, ks, seed=seed)
  return {**table, "n_samples": len(pairs), "selectors": list(selectors)}
