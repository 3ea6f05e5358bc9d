"""GRPO over tool-use episodes on executable PR tasks of attrs and more-itertools.

    rlcode mine data/repos/attrs.bundle --tasks swe --out /tmp/swe      # optional: the same
    rlcode train --config configs/agent_swe.py                          # tasks, cached

The tasks (rlcode.swe) are the PRs of the two histories whose own tests go from failing
to passing; an episode's workspace is the repository at the PR's base commit (the test
patch withheld), its tools bash, editor, search, run_tests (the visible tests), lint
(ruff) and finish, and its reward the task's tests on the workspace's diff (resolved:
every FAIL_TO_PASS and PASS_TO_PASS test passes) plus a fifth of the SWE-RL similarity of
the diff to the gold patch. The loop evaluates on the validation split: the latest tenth of
each history's tasks by PR time before its test tenth (rlcode.swe.mining), so the test
split stays unread. The policy is agent_tiny's decoder, untrained: the run
measures the path (tool calls, tokens and seconds per episode), not a skill.

Result (docs/results.md, "Executable PR tasks: mining, decomposition and the agent"):
success 0 for the untrained policy, as expected; the scripted agent that applies the gold
patch through the editor resolves every task, 208 of attrs and 176 of more-itertools
(experiments/swe/agent.py).
"""

import ml_collections

from common import PR_REPOS, optimizer, tiny_model


def get_config():
  config = ml_collections.ConfigDict()
  config.trainer = "agent"
  config.workdir = "workdirs/agent_swe"
  config.model = tiny_model()
  config.model.tokenizer = "data/code_bpe.json+tools"
  config.model.arch.vocab_size = 4100
  config.model.arch.max_seq_len = 2048
  config.model.arch.num_kv_heads = 4
  config.data = ml_collections.ConfigDict(dict(
      source="swe", repo=PR_REPOS, train_split="train", eval_split="validation",
      max_eval_tasks=8, swe=ml_collections.ConfigDict(dict(validation_fraction=0.1))))
  config.rewards = ml_collections.ConfigDict({"swe_tests": 1.0, "diff": 0.2})
  config.agent = ml_collections.ConfigDict(dict(
      tools=("bash", "editor", "search", "run_tests", "lint", "finish"), max_turns=6,
      max_total_tokens=2048, max_turn_tokens=256, max_observation_tokens=256,
      bash_seconds=30.0, episode_seconds=600.0, workers=4))
  config.rl = ml_collections.ConfigDict(dict(group_size=4, prompts_per_step=2))
  config.optimizer = optimizer(lr=3e-4, warmup=1, decay=10)
  config.train = ml_collections.ConfigDict(dict(steps=3, checkpoint_every=3, eval_every=3))
  config.eval = ml_collections.ConfigDict(dict(num_samples=2, batch_prompts=4))
  return config
