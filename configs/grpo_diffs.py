"""GRPO on real diffs (SWE-RL's reward) mined from a git repository, on CPU.

    rlcode train --config configs/grpo_diffs.py
    rlcode train --config configs/grpo_diffs.py --config.data.repo=/path/to/repo

Tasks: the PRs of the repository's first-parent history (each merge with the
commits it brings in, each other commit on its own; default: this project's
own repository, found from this file's location; a path that is not a
repository, or one without commits, is the miner's error) that touch Python
files, one task per hunk (rlcode.data.git): the PR's title and messages are
the request, the answer is SEARCH/REPLACE edits, the reward
the SWE-RL similarity of the predicted patch to the real one (-1 for an answer
that does not parse or apply). The latest quarter of the PRs is held out.

Fitting a byte-level context: whole files of a real repository are tens of
kilobytes, so prompts show excerpts (`context_lines=3`: the lines within 3
lines of the hunk, the rest of the file elided by a marker line; the reward
still applies answers to the whole files) and the commit-level size filters
are loose. A task whose prompt leaves less than `rl.max_new_tokens` of the
3072-token context, or whose reference answer does not fit after its prompt,
is dropped (`data.drop_too_long`; rlcode.rollout.fit_context), and the counts
kept and dropped per split are a step-0 row of metrics.jsonl
("data/train_kept", "data/train_prompt_too_long", ...).

The policy is configs/sample_tiny.py's ~1M-parameter decoder with a 3072-token
context, from scratch, given a supervised warm start on the training split's
oracle answers so that it can learn the answer format, then 6 GRPO steps of 2
tasks x 4 samples. Evaluation: the held-out tasks, eval.num_samples each;
eval/reward_mean and eval/diff/success_rate (similarity >= 0.9).

Expected result (measured before merges were mined as PRs, when they were
skipped, so the task counts below are of non-merge commits only; this file
otherwise unchanged, this repository at 39a8865, i.e. with
--config.data.mining.branch=39a8865cdd69 for a fixed history; two runs gave
identical metrics apart from timings): 115 training
and 30 held-out hunk tasks, of which 56 and 15 fit (15 and 5 prompts too
long, 44 and 10 answers too long); warm-start loss 5.64 -> 3.15 in 30 steps;
then every sampled answer is a format error (reward -1.0 at every step,
groups_with_signal 0.0, so every GRPO update is zero: grad_norm 0.0), and
eval/reward_mean -1.0, eval/diff/success_rate 0.0 at steps 0 and 6. So this
reproduces the pipeline on real history, not learning: a policy this small
and this briefly warm-started never writes an answer that applies. About 7
minutes on 2 shared CPU cores; a GRPO step took 6-22 s (sampling 2-7 s, update
4-15 s). experiments/decomposition.py measures this policy per granularity.
"""

import os

import ml_collections

from common import optimizer, tiny_model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def get_config():
  config = ml_collections.ConfigDict()
  config.workdir = "workdirs/grpo_diffs"
  config.seed = 0
  config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=1, tensor=1))
  # "": sample on the trainer's devices; "tensor=4" (say): a sampler mesh of its own
  # on the devices after the trainer's (rlcode.distributed.meshes).
  config.sampler_mesh = ""
  config.model = tiny_model()
  config.model.arch.max_seq_len = 3072

  config.data = ml_collections.ConfigDict(dict(
      source="git", repo=REPO, data_dir="", train_split="train", eval_split="test",
      max_eval_tasks=0, drop_too_long=True))
  # rlcode.data.git.MiningConfig; its `source` is config.data.repo.
  config.data.mining = ml_collections.ConfigDict(dict(
      branch="HEAD", granularity="hunk", edit_format="search_replace", max_commits=0,
      max_files=64, max_changed_lines=5000, max_file_bytes=200_000, languages=("python",),
      allow_added_files=True, related_bytes=0, context_lines=3, test_fraction=0.25))

  config.rewards = ml_collections.ConfigDict({"diff": 1.0})
  config.reward_options = ml_collections.ConfigDict({"diff": {}})

  # shared_prefix=False: with ~2k-byte prompts the shared-prefix update ran
  # slower on CPU than repeating the prompt (35 s against 20 s a step, measured
  # once each at 4 prompts x 4 samples, max_new_tokens=768, on a loaded machine,
  # while the shared batch still padded every completion to max_new_tokens; it
  # now pads to the longest completion, not measured again here).
  config.rl = ml_collections.ConfigDict(dict(
      group_size=4, prompts_per_step=2, temperature=1.0, top_p=1.0, top_k=0,
      max_new_tokens=1024, num_passes=1, advantage="grpo", shared_prefix=False,
      loss_aggregation="seq_mean_token_mean", clip_eps_low=0.2, clip_eps_high=0.28,
      beta=0.0,
      # Asynchronous rollouts (rlcode.async_rollouts): sample up to max_staleness
      # policy versions ahead of the update; 0 is the synchronous loop.
      max_staleness=0, max_importance_weight=2.0, sample_version="latest"))
  config.optimizer = optimizer(lr=1e-4, warmup=5, decay=100)

  config.warmstart = ml_collections.ConfigDict(dict(
      steps=30, batch_size=4, optimizer=optimizer(lr=3e-3, warmup=5, decay=30)))

  config.train = ml_collections.ConfigDict(dict(
      steps=6, checkpoint_every=6, eval_every=6, keep_checkpoints=2,
      on_nonfinite="skip", progress_bar=True))
  config.eval = ml_collections.ConfigDict(dict(
      num_samples=4, temperature=1.0, max_new_tokens=1024, ks=(1,), batch_prompts=8))
  return config
