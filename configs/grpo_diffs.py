"""GRPO with SWE-RL's diff reward on a generated edit history, from scratch on CPU.

    rlcode train --config configs/grpo_diffs.py
    rlcode train --config configs/grpo_diffs.py --config.data.test_split=test   # once tuned

Tasks: data/repos/edit-history.bundle (data/make_edit_history.py: 360 commits
of small edits to a package of small modules: bug fixes, renames across files,
added parameters, changed constants, new modules), mined through
rlcode.data.git like any repository: every commit one PR, one task per hunk of
the package's sources (the test files are the hidden tests, not part of the
edit: commits that only add a test give no task). The request is the commit
message; the prompt shows the lines within 3 of the change
(`context_lines=3`) and names the answer format in one line
(`instructions=False`: the warm start teaches it); the reference answer is
SEARCH/REPLACE blocks holding only the changed lines, widened until unique
(`oracle_context_lines=0`). Splits by commit time: the latest 15% of the PRs
are the test split, the 15% before them the validation split (the eval rows,
what this config was tuned on), the rest train.

The policy: the ~1.3M-parameter decoder of configs/common.py over the code BPE
tokenizer (data/code_bpe.json, 4096 tokens) with a 768-token context (every
prompt is under 330 tokens, every reference under 410); a supervised warm
start on the training split's reference answers (the answer format), then GRPO
with the diff reward (-1 for an answer that does not parse or apply, else the
SWE-RL similarity of its patch to the real one). Eval rows carry
`eval/diff/format_valid`, `eval/diff/reward_mean`, `eval/diff/exact`.

Measured result (a miss; seed 0 only, this file unchanged, through
`experiments/grpo_diffs_seeds.py --seeds 0 --no-control` on 2 CPU cores shared
with ~15 other processes, load average 14-16): 200 train / 54 validation / 50
test hunk tasks, none dropped; the warm start's extra PR hunks 3388 kept (895
prompts and 159 references too long). Warm-start loss 8.33 -> 2.18 in 100 steps,
after which eval/diff/format_valid is 0.0 on validation and test (reward -1.0):
every answer is a format error (24 samples of 12 validation tasks: 11 no_edits,
11 tag_count, 2 search_not_found), so GRPO steps 1-6 had no group with signal
and zero gradients; the run was stopped there (32 min wall, 12 CPU-minutes).
Tuning on validation, also a miss: the warm start on the edit history's 200
training hunks alone (no PR hunks, 100 steps) takes the loss to 0.49 but leaves
validation format_valid at 0.0 (24 samples: 13 no_edits, 9 tag_count, 2
search_not_found): the answers have the tags and block markers roughly right but
garble the SEARCH lines, which the policy does not copy from the prompt.
"""

import ml_collections

from common import EDIT_HISTORY, PR_REPOS, edit_history_mining, optimizer, pr_mining, tiny_model


def get_config():
  config = ml_collections.ConfigDict()
  config.workdir = "workdirs/grpo_diffs"
  config.seed = 0
  config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=1, tensor=1))
  # "": sample on the trainer's devices; "tensor=4" (say): a sampler mesh of its own
  # on the devices after the trainer's (rlcode.distributed.meshes).
  config.sampler_mesh = ""
  config.model = tiny_model()
  config.model.tokenizer = "data/code_bpe.json"
  config.model.arch.vocab_size = 4096
  config.model.arch.max_seq_len = 768

  config.data = ml_collections.ConfigDict(dict(
      source="git", repo=EDIT_HISTORY, data_dir="", train_split="train",
      eval_split="validation", test_split="", max_eval_tasks=0, drop_too_long=True))
  # rlcode.data.git.MiningConfig; its `source` is config.data.repo.
  config.data.mining = edit_history_mining()

  config.rewards = ml_collections.ConfigDict({"diff": 1.0})
  config.reward_options = ml_collections.ConfigDict({"diff": {}})

  config.rl = ml_collections.ConfigDict(dict(
      group_size=4, prompts_per_step=8, temperature=1.0, top_p=1.0, top_k=0,
      max_new_tokens=384, num_passes=1, advantage="grpo", shared_prefix=False,
      loss_aggregation="seq_mean_token_mean", clip_eps_low=0.2, clip_eps_high=0.28,
      beta=0.0, length_multiple=64,
      # Asynchronous rollouts (rlcode.async_rollouts): sample up to max_staleness
      # policy versions ahead of the update; 0 is the synchronous loop.
      max_staleness=0, max_importance_weight=2.0, sample_version="latest"))
  config.optimizer = optimizer(lr=3e-4, warmup=3, decay=30)

  config.warmstart = ml_collections.ConfigDict(dict(
      steps=100, batch_size=16, cache_dir="", optimizer=optimizer(lr=3e-3, warmup=10, decay=100),
      # >= 0: the warm start's own seed, so runs of several seeds share one (with cache_dir,
      # trained once); -1: the run's seed.
      seed=-1))
  # The warm start also reads the real PRs' training hunks (configs/grpo_pr_diffs.py's
  # tasks and splits), whose variety teaches copying lines from the prompt.
  config.warmstart.data = ml_collections.ConfigDict(dict(
      source="git", repo=PR_REPOS, data_dir="", train_split="train"))
  config.warmstart.data.mining = pr_mining()

  config.train = ml_collections.ConfigDict(dict(
      steps=30, checkpoint_every=10, eval_every=10, keep_checkpoints=2,
      on_nonfinite="skip", progress_bar=True))
  config.eval = ml_collections.ConfigDict(dict(
      num_samples=2, temperature=1.0, max_new_tokens=384, ks=(1,), batch_prompts=32))
  return config
