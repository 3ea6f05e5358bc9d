"""Ground-truth features of completions: what execution and the reference know.

  tests_fraction  share of the task's tests the completion passes (sandbox; 0 on a crash)
  passed          1 when every test passes, else 0
  similarity      difflib's ratio between the completion's code and the reference solution
                  (the SWE-RL diff reward's similarity, on the code itself)
  length          characters of the completion's code / 100

The completion's code is the part a reward reads: cut at the first stop sequence for
prompt+completion tasks (rlcode.rewards.tests). The simulator (rlcode.rm.simulate) builds
its users' hidden utility from these, records them in each choice's extra["features"],
and a reward model may take some of them as inputs; the "rm" reward computes the ones its
model takes the same way. Running code is the sandbox's business (through the tests
reward); this module only combines results.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

import numpy as np

from rlcode.data.tasks import Task
from rlcode.rewards.tests import HUMANEVAL_STOP, tests_answer_end, tests_reward

FEATURES = ("tests_fraction", "passed", "similarity", "length")
_RUN = ("tests_fraction", "passed")


def shown_code(task: Task, completion: str,
               stop_sequences: Sequence[str] = HUMANEVAL_STOP) -> str:
  """The part of `completion` that is the answer (what a user sees and tests run)."""
  return completion[:tests_answer_end(task, completion, stop_sequences=stop_sequences)]


def compute(tasks: Sequence[Task], completions: Sequence[str], names: Sequence[str], *,
            stop_sequences: Sequence[str] = HUMANEVAL_STOP, workers: int | None = None,
            **limits) -> np.ndarray:
  """[N, len(names)] float32 features of N completions (tests run only when asked for)."""
  unknown = sorted(set(names) - set(FEATURES))
  if unknown:
    raise KeyError(f"unknown feature(s) {unknown}; known: {list(FEATURES)}")
  if len(tasks) != len(completions):
    raise ValueError(f"{len(tasks)} tasks but {len(completions)} completions")
  columns: dict[str, np.ndarray] = {}
  if set(names) & set(_RUN):
    out = tests_reward(tasks, completions, mode="fraction", stop_sequences=stop_sequences,
                       workers=workers, **limits)
    columns["tests_fraction"] = np.asarray(out.scores, np.float32)
    columns["passed"] = np.array([d["status"] == "passed" for d in out.details], np.float32)
  codes = [shown_code(t, c, stop_sequences) for t, c in zip(tasks, completions)]
  if "similarity" in names:
    columns["similarity"] = np.array(
        [difflib.SequenceMatcher(None, code, t.reference, autojunk=False).ratio()
         for t, code in zip(tasks, codes)], np.float32)
  if "length" in names:
    columns["length"] = np.array([len(code) / 100 for code in codes], np.float32)
  return np.stack([columns[n] for n in names], axis=1).reshape(len(completions), len(names))
