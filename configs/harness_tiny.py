"""GRPO on an outside harness's episodes: the tiny policy served in the trainer's process
through the OpenAI API, an agent that knows only that API playing the episodes.

    rlcode train --config configs/harness_tiny.py           # 30 steps of 8 tasks x 8
    rlcode train --config configs/harness_tiny.py:smoke     # 2 steps of 2 tasks x 4, ~1 min

The harness is rlcode.harness.examples.two_call_agent (an openai client, two calls of
/v1/completions a task: a body, the task's tests run on it, the result told and a second
body asked for); the reward is the task's tests on the final body (tests_reward: rlcode's
rewards registry, the sandbox). The tasks are data/tiny_tasks.jsonl's training split.

Result: none to report. The policy is the ~1M-parameter byte-level decoder from scratch
(the harness trainer has no warm start), which writes random bytes: the reward is 0 and
the groups carry no signal; its random bytes do not survive a round trip through text
(invalid UTF-8), so the second call's prompt does not extend the first's tokens and each
episode is two segments (splits/prefix_mismatch). The job shows the path (a real loopback server, the openai
client, token-exact segments, the shared-prompt update, published versions, checkpoints
and resume); a harness of your own goes in harness.harness.
"""

import ml_collections

from common import optimizer, tiny_model


def get_config(arg: str | None = None):
  """The job; arg "smoke": 2 steps of 2 tasks x 4 episodes (tests/test_harness_train.py)."""
  config = ml_collections.ConfigDict()
  config.trainer = "harness"
  config.workdir = "workdirs/harness_tiny"
  config.model = tiny_model()
  config.data = ml_collections.ConfigDict(dict(source="jsonl", path="data/tiny_tasks.jsonl"))
  config.harness = ml_collections.ConfigDict(dict(
      harness="rlcode.harness.examples:two_call_agent",
      reward="rlcode.harness.examples:tests_reward", workers=8, timeout_seconds=120.0))
  config.rl = ml_collections.ConfigDict(dict(group_size=8, prompts_per_step=8))
  config.optimizer = optimizer(lr=3e-4, warmup=5)
  # The server's engine: every episode of a step at once; no idle warm-up (the trainer
  # shares the CPU with it).
  config.serve = ml_collections.ConfigDict(dict(slots=16, warmup=False))
  config.train = ml_collections.ConfigDict(dict(steps=30, checkpoint_every=10))
  if arg == "smoke":
    config.workdir = "workdirs/harness_smoke"
    config.rl.update(group_size=4, prompts_per_step=2)
    config.serve.update(slots=8)
    config.train.update(steps=2, checkpoint_every=1)
  elif arg is not None:
    raise ValueError(f"configs/harness_tiny.py:{arg}: the argument is 'smoke'")
  return config
