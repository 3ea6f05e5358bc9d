"""GRPO with SWE-RL's diff reward on real PRs: attrs and more-itertools, hunk by hunk, on CPU.

    rlcode train --config configs/grpo_pr_diffs.py
    rlcode train --config configs/grpo_pr_diffs.py --config.data.mining.granularity=file

Tasks: the first-parent histories of data/repos/attrs.bundle (squash-merged
PRs) and data/repos/more-itertools.bundle (merge commits), mined alike
(rlcode.data.git; a tuple `data.repo` mines each and merges the tasks by id):
every PR touching at most 8 Python files and 400 changed lines, one task per
hunk (`granularity="file"` for one per file). The request is the PR's title
and commit messages; the prompt shows the lines within 3 of the change, each
with its number, and names the answer format in one line; the reference answer
is LINES blocks of the changed lines only (`edit_format="line_edit"`, as
configs/grpo_diffs.py). Files larger than 64 kB are cut to windows around their
changes (more-itertools' main module). Splits by PR time in each repository: the
latest 10% test, the 10% before them validation (the eval rows: 64 of its
tasks), the rest train.

The policy: configs/grpo_diffs.py's decoder (code BPE tokenizer, ~1.3M
parameters) with a 1024-token context; tasks whose prompt leaves no room for
384 new tokens, or whose reference does not fit after it, are dropped and
counted (a step-0 row). A 300-step supervised warm start on the training hunks'
reference answers and the edit history's, then 20 GRPO steps with the diff reward.

Measured once (2026-12-02, seed 0, this file unchanged but the workdir, through
experiments/decomposition.py; 63 minutes on 2 cores shared with another
experiment, the mined data already cached): 4148 training hunk tasks kept (212
prompts and 77 references too long, dropped and counted), 56 validation tasks (8
prompts too long); warm-start loss 8.33 -> 1.46. eval/diff/format_valid 0.009,
0.089, 0.089 at steps 0, 10 and 20 (112 samples each), reward_mean -0.991, -0.903,
-0.900, exact 0.0 throughout: GRPO turns a few format errors into valid edits, none
of them the real change. With SEARCH/REPLACE answers and a 100-step warm start
(this config until then) every answer was a format error (experiments/README.md,
grpo_diffs).
"""

import ml_collections

from common import EDIT_HISTORY, PR_REPOS, edit_history_mining, optimizer, pr_mining, tiny_model


def get_config():
  config = ml_collections.ConfigDict()
  config.workdir = "workdirs/grpo_pr_diffs"
  config.seed = 0
  config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=1, tensor=1))
  config.sampler_mesh = ""  # "": sample on the trainer's devices (see configs/grpo_tiny.py)
  config.model = tiny_model()
  config.model.tokenizer = "data/code_bpe.json"
  config.model.arch.vocab_size = 4096
  config.model.arch.max_seq_len = 1024

  config.data = ml_collections.ConfigDict(dict(
      source="git", repo=PR_REPOS, data_dir="", train_split="train", eval_split="validation",
      test_split="", max_eval_tasks=64, drop_too_long=True))
  config.data.mining = pr_mining()
  # LINES blocks over numbered prompt lines, as configs/grpo_diffs.py (README "Design notes").
  config.data.mining.edit_format = "line_edit"

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
  config.optimizer = optimizer(lr=3e-4, warmup=3, decay=20)

  config.warmstart = ml_collections.ConfigDict(dict(
      steps=300, batch_size=16, cache_dir="",
      optimizer=optimizer(lr=3e-3, warmup=10, decay=300)))
  # The warm start also reads the generated edit history's training hunks.
  config.warmstart.data = ml_collections.ConfigDict(dict(
      source="git", repo=EDIT_HISTORY, data_dir="", train_split="train"))
  config.warmstart.data.mining = edit_history_mining()
  config.warmstart.data.mining.edit_format = "line_edit"

  config.train = ml_collections.ConfigDict(dict(
      steps=20, checkpoint_every=10, eval_every=10, keep_checkpoints=2,
      on_nonfinite="skip", progress_bar=True))
  config.eval = ml_collections.ConfigDict(dict(
      num_samples=2, temperature=1.0, max_new_tokens=384, ks=(1,), batch_prompts=32))
  return config
