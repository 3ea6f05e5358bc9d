"""The "rm" reward: a trained reward model's score of each completion.

    config.rewards = {"rm": 1.0}
    config.reward_options = {"rm": {"checkpoint": "workdirs/rm_choices"}}

The model scores the completion's code (cut at the first stop sequence, as the tests
reward cuts it) after the task's prompt; a model that takes ground-truth features gets
them computed the way the simulator computed them (rlcode.rm.features), which runs the
tests in the sandbox. Scores are raw model outputs: GRPO normalises them within groups.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlcode.data.tasks import Task
from rlcode.errors import BadInput
from rlcode.rewards.registry import RewardOutput, register, register_answer_end
from rlcode.rewards.tests import HUMANEVAL_STOP, tests_answer_end
from rlcode.rm import features as features_lib
from rlcode.rm import scorer as scorer_lib


@register_answer_end("rm")
def rm_answer_end(task: Task, completion: str, *,
                  stop_sequences: Sequence[str] = HUMANEVAL_STOP, **_) -> int:
  return tests_answer_end(task, completion, stop_sequences=stop_sequences)


@register("rm")
def rm_reward(tasks: Sequence[Task], completions: Sequence[str], *, checkpoint: str = "",
              stop_sequences: Sequence[str] = HUMANEVAL_STOP, workers: int | None = None,
              **limits) -> RewardOutput:
  """Scores completions with the reward model saved at `checkpoint` (a train-rm workdir).

  workers and **limits go to the sandbox when the model takes test features.
  Returns scores; metrics score_std.
  """
  if not checkpoint:
    raise BadInput("reward 'rm' needs reward_options.rm.checkpoint: a reward model's "
                   "workdir (rlcode train-rm)")
  if len(tasks) != len(completions):
    raise ValueError(f"{len(tasks)} tasks but {len(completions)} completions")
  scorer = scorer_lib.load(checkpoint)
  stops = tuple(stop_sequences)
  codes = [features_lib.shown_code(t, c, stops) for t, c in zip(tasks, completions)]
  feats = None
  if scorer.features:
    feats = features_lib.compute(tasks, completions, scorer.features, stop_sequences=stops,
                                 workers=workers, **limits)
  scores = scorer.score([t.prompt for t in tasks], codes, feats)
  return RewardOutput(scores, {"score_std": float(np.std(scores)) if len(scores) else 0.0})
