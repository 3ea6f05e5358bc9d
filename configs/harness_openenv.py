"""GRPO on an OpenEnv environment (Meta's `openenv-core`) through the harness trainer:
rlcode's code tasks as an OpenEnv environment, served by openenv's own app on 127.0.0.1 in
the trainer's process (no container), played by a harness that asks the tiny policy,
served beside it, for each action through the OpenAI API.

    rlcode train --config configs/harness_openenv.py          # 30 steps of 8 tasks x 8
    rlcode train --config configs/harness_openenv.py:smoke    # 3 steps of 2 tasks x 4

The tasks are data/tiny_tasks.jsonl's training split (config.data, as for any harness).
An episode (rlcode.harness.openenv_env.Harness) opens a session of openenv's client,
resets it to its task (the observation: the task's prompt) and steps it with completions
of /v1/completions at rl.temperature, at most 40 tokens: the environment runs the task's
tests on each (rlcode's rewards registry, the sandbox) and rewards 1 when they pass,
which ends the episode; a failed attempt draws the feedback and the prompt again, and
the next call's prompt is the whole episode so far; at most 2 attempts
(harness.openenv.max_turns). The reward trained is the episode's return.

Result: none to report. The policy is the ~1M-parameter byte-level decoder from scratch
(the harness trainer has no warm start): it writes random bytes, the tests never pass,
the reward is ~0 and the groups carry no signal; its random bytes do not survive a round
trip through text (invalid UTF-8), so the second call's prompt does not extend the first's
tokens and an episode of two attempts is two segments (splits/prefix_mismatch; measured:
3 steps of 8 episodes, 2 calls and 2 segments each, reward 0, 578-621 trained tokens a
step). The job shows the path: openenv's server
and client, the policy's calls recorded token-exactly per episode, the shared-prompt
update, published versions, checkpoints.
"""

import ml_collections

from common import optimizer, tiny_model


def get_config(arg: str | None = None):
  """The job; arg "smoke": 3 steps of 2 tasks x 4 episodes (tests/test_harness_openenv.py)."""
  config = ml_collections.ConfigDict()
  config.trainer = "harness"
  config.workdir = "workdirs/harness_openenv"
  config.model = tiny_model()
  config.data = ml_collections.ConfigDict(dict(source="jsonl", path="data/tiny_tasks.jsonl"))
  config.harness = ml_collections.ConfigDict(dict(
      openenv=dict(max_turns=2, max_tokens=40), workers=8, timeout_seconds=120.0))
  config.rl = ml_collections.ConfigDict(dict(group_size=8, prompts_per_step=8))
  config.optimizer = optimizer(lr=3e-4, warmup=5)
  # The server's engine: every episode of a step at once; no idle warm-up (the trainer
  # shares the CPU with it).
  config.serve = ml_collections.ConfigDict(dict(slots=16, warmup=False))
  config.train = ml_collections.ConfigDict(dict(steps=30, checkpoint_every=10))
  if arg == "smoke":
    config.workdir = "workdirs/harness_openenv_smoke"
    config.rl.update(group_size=4, prompts_per_step=2)
    config.serve.update(slots=8)
    config.train.update(steps=3, checkpoint_every=3)
  elif arg is not None:
    raise ValueError(f"configs/harness_openenv.py:{arg}: the argument is 'smoke'")
  return config
