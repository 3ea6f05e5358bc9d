"""GRPO on a `verifiers` environment (prime-rl's Environments library) through the harness
trainer: the environment's own rollouts call the tiny policy, served in the trainer's
process, through the OpenAI API; its rubric scores them.

    rlcode train --config configs/harness_verifiers.py          # 30 steps of 8 rows x 8
    rlcode train --config configs/harness_verifiers.py:smoke    # 3 steps of 2 rows x 4

The environment is a vf.SingleTurnEnv of data/verifiers_tiny.jsonl (16 hand-written rows:
arithmetic and letter questions, one-word answers) whose rubric is the exact match of the
reply to the answer (rlcode.harness.verifiers_env.exact_match); every call is a
/v1/chat/completions of verifiers' OpenAIChatCompletionsClient at rl.temperature, at most
8 tokens. An environment by name goes in harness.verifiers.env (with its
load_environment's arguments in harness.verifiers.args) in place of rows.

Result: none to report. The policy is the ~1M-parameter byte-level decoder from scratch
(the harness trainer has no warm start): it writes random bytes, the rubric scores ~0 and
the groups carry no signal. The job shows the path: verifiers' rollout and rubric, the
engine's sampled tokens recorded per episode, the shared-prompt update, published
versions, checkpoints.
"""

import ml_collections

from common import optimizer, tiny_model


def get_config(arg: str | None = None):
  """The job; arg "smoke": 3 steps of 2 rows x 4 episodes (tests/test_harness_verifiers.py)."""
  config = ml_collections.ConfigDict()
  config.trainer = "harness"
  config.workdir = "workdirs/harness_verifiers"
  config.model = tiny_model()
  config.data = ml_collections.ConfigDict(dict(source="verifiers"))
  config.harness = ml_collections.ConfigDict(dict(
      verifiers=dict(rows="data/verifiers_tiny.jsonl", max_tokens=8), workers=8,
      timeout_seconds=120.0))
  config.rl = ml_collections.ConfigDict(dict(group_size=8, prompts_per_step=8))
  config.optimizer = optimizer(lr=3e-4, warmup=5)
  # The server's engine: every episode of a step at once; no idle warm-up (the trainer
  # shares the CPU with it).
  config.serve = ml_collections.ConfigDict(dict(slots=16, warmup=False))
  config.train = ml_collections.ConfigDict(dict(steps=30, checkpoint_every=10))
  if arg == "smoke":
    config.workdir = "workdirs/harness_verifiers_smoke"
    config.rl.update(group_size=4, prompts_per_step=2)
    config.serve.update(slots=8)
    config.train.update(steps=3, checkpoint_every=3)
  elif arg is not None:
    raise ValueError(f"configs/harness_verifiers.py:{arg}: the argument is 'smoke'")
  return config
