"""GRPO with SWE-RL's diff reward on real PRs: attrs and more-itertools, hunk by hunk, on CPU.

    rlcode train --config configs/grpo_pr_diffs.py
    rlcode train --config configs/grpo_pr_diffs.py --config.data.mining.granularity=file

Tasks: the first-parent histories of data/repos/attrs.bundle and
data/repos/more-itertools.bundle mined alike (a tuple `data.repo` mines each and merges
the tasks by id): every PR touching at most 8 Python files and 400 changed lines, one task
per hunk, answers as line edits (as configs/grpo_diffs.py); splits by PR time, the latest
10% test, the 10% before them validation (64 tasks evaluated). The grpo_diffs decoder with
a 1024-token context gets a 300-step warm start on the training hunks' references and the
edit history's, then 20 GRPO steps.

Result (seed 0, docs/results.md): a miss: eval/diff/format_valid 0.009 -> 0.089 over 20
steps, exact 0.0 (4,148 training tasks).
"""

import ml_collections

from common import (EDIT_HISTORY, PR_REPOS, diff_grpo, diff_warmstart, edit_history_mining,
                    pr_mining, tiny_model)


def get_config():
  config = ml_collections.ConfigDict()
  config.trainer = "grpo"
  config.workdir = "workdirs/grpo_pr_diffs"
  config.model = tiny_model()
  config.model.tokenizer = "data/code_bpe.json"
  config.model.arch.vocab_size = 4096
  config.model.arch.max_seq_len = 1024
  config.data = ml_collections.ConfigDict(dict(source="git", repo=PR_REPOS, max_eval_tasks=64,
                                               drop_too_long=True))
  config.data.mining = pr_mining()
  config.data.mining.edit_format = "line_edit"
  config.update(diff_grpo())
  config.warmstart = diff_warmstart(300)
  # The warm start also reads the generated edit history's training hunks.
  config.warmstart.data = ml_collections.ConfigDict(dict(source="git", repo=EDIT_HISTORY))
  config.warmstart.data.mining = edit_history_mining()
  config.warmstart.data.mining.edit_format = "line_edit"
  config.train = ml_collections.ConfigDict(dict(steps=20, checkpoint_every=10, eval_every=10))
  config.eval = ml_collections.ConfigDict(dict(num_samples=2))
  return config
