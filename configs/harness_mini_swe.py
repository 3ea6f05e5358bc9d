"""GRPO on mini-swe-agent's episodes: the PyPI package, unmodified, works on executable PR
tasks of attrs and more-itertools through the tiny policy served in the trainer's process.

    rlcode train --config configs/harness_mini_swe.py          # 10 steps of 2 tasks x 4
    rlcode train --config configs/harness_mini_swe.py:smoke    # 2 steps of 2 tasks x 2

The tasks (rlcode.swe, as configs/agent_swe.py mines them) are the PRs whose own tests go
from failing to passing. An episode (rlcode.harness.mini_swe) is mini-swe-agent's
DefaultAgent with its SWE-bench prompts and bash blocks (its `swebench_backticks` config),
its litellm model pointed at the policy's /v1/chat/completions, each of its commands run
in the task's workspace in rlcode's sandbox, at most 4 model calls of 96 tokens; the
reward is the task's tests on the workspace it leaves.

Result: none to report. The policy is the tiny decoder from scratch over the code BPE
(the harness trainer has no warm start): it never writes a bash block, so each episode is
the agent's format errors until its step limit, and the reward is 0. The job shows the
path: an unmodified outside agent, its every call recorded token-exactly, the sandbox,
the tests as the reward, the shared-prompt update.
"""

import ml_collections

from common import PR_REPOS, optimizer, tiny_model


def get_config(arg: str | None = None):
  """The job; arg "smoke": 2 steps of 2 tasks x 2 (tests/test_harness_mini_swe.py)."""
  config = ml_collections.ConfigDict()
  config.trainer = "harness"
  config.workdir = "workdirs/harness_mini_swe"
  config.model = tiny_model()
  config.model.tokenizer = "data/code_bpe.json"
  config.model.arch.vocab_size = 4100
  # mini-swe-agent's SWE-bench instructions are about 2,000 of these tokens.
  config.model.arch.max_seq_len = 4096
  config.data = ml_collections.ConfigDict(dict(
      source="swe", repo=PR_REPOS, train_split="train",
      swe=ml_collections.ConfigDict(dict(validation_fraction=0.1))))
  config.harness = ml_collections.ConfigDict(dict(
      mini_swe_agent=dict(config="swebench_backticks", step_limit=4, max_tokens=96,
                          command_seconds=60),
      workers=8, timeout_seconds=600.0))
  config.rl = ml_collections.ConfigDict(dict(group_size=4, prompts_per_step=2))
  config.optimizer = optimizer(lr=3e-4, warmup=2)
  config.serve = ml_collections.ConfigDict(dict(slots=8, warmup=False))
  config.train = ml_collections.ConfigDict(dict(steps=10, checkpoint_every=5))
  if arg == "smoke":
    config.workdir = "workdirs/harness_mini_swe_smoke"
    config.rl.update(group_size=2)
    config.harness.mini_swe_agent.update(step_limit=2, max_tokens=32)
    config.train.update(steps=2, checkpoint_every=2)
  elif arg is not None:
    raise ValueError(f"configs/harness_mini_swe.py:{arg}: the argument is 'smoke'")
  return config
