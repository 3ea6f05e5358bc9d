"""Pieces the config files share (configs import this as `common`)."""

import ml_collections


def tiny_model() -> ml_collections.ConfigDict:
  """A ~1M-parameter Qwen2-style decoder over bytes, initialised from scratch."""
  return ml_collections.ConfigDict(dict(arch=dict(
      vocab_size=264, hidden_size=128, intermediate_size=352, num_layers=4,
      num_heads=4, num_kv_heads=2, head_dim=32, rope_theta=10000.0, rms_norm_eps=1e-6,
      qkv_bias=True, tie_embeddings=True, max_seq_len=512)))


def optimizer(lr: float, warmup: int, decay: int | None = None,
              **others) -> ml_collections.ConfigDict:
  """AdamW with linear warmup, then a decay to 10% at step `decay` (None: at the last
  step of what it trains; rlcode.optim.OptimizerConfig for the other keys)."""
  return ml_collections.ConfigDict(dict(learning_rate=lr, warmup_steps=warmup,
                                        decay_steps=decay, **others))


# The real PR histories (data/repos) and how the diff configs mine them.
PR_REPOS = ("data/repos/attrs.bundle", "data/repos/more-itertools.bundle")


def pr_mining() -> ml_collections.ConfigDict:
  """rlcode.data.git.MiningConfig of the PR bundles: Python hunks of PRs touching at most
  8 files and 400 lines, excerpts of 3 lines, references of the changed lines only, the
  format named in one line; the latest 10% of PRs test, the 10% before validation."""
  return ml_collections.ConfigDict(dict(
      granularity="hunk", languages=("python",), context_lines=3, oracle_context_lines=0,
      instructions=False, test_fraction=0.1, validation_fraction=0.1))


# The generated edit history (data/make_edit_history.py) and how the diff configs mine it.
EDIT_HISTORY = "data/repos/edit-history.bundle"


def edit_history_mining() -> ml_collections.ConfigDict:
  """MiningConfig of the edit history: hunks of the package's sources (its test files
  are the tasks' hidden and visible tests, not part of the edit: a commit that adds a
  module, or only tests, gives no task), excerpts and references as `pr_mining`; the
  latest 15% of the commits test, the 15% before validation."""
  return ml_collections.ConfigDict(dict(
      granularity="hunk", languages=("python",), exclude=("tests/", "checks/"),
      allow_added_files=False, context_lines=3, oracle_context_lines=0, instructions=False,
      test_fraction=0.15, validation_fraction=0.15, tests_hidden=("tests/test_*.py",),
      tests_visible=("checks/test_*.py",), tests_support=("toolkit/*.py",)))


# A second generated history (data/make_edit_history.py --seed 1 --commits 1500), for
# warm starts only: the same kinds of edit to the same 24 modules, other code and commits.
EDIT_HISTORY_PRACTICE = "data/repos/edit-history-practice.bundle"


def practice_data(mining: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A `warmstart.data` section: every hunk of the practice history, mined as `mining`
  (its answer format and excerpts follow `mining`'s, overrides included), all of it
  train and without tests (every task would hold every module as a support file)."""
  data = ml_collections.ConfigDict(dict(source="git", repo=EDIT_HISTORY_PRACTICE))
  data.mining = edit_history_mining()
  for key in ("edit_format", "context_lines", "oracle_context_lines", "instructions",
              "open_file", "line_counts", "line_numbers", "reference_thought"):
    if key in mining:
      data.mining[key] = mining.get_ref(key)
  data.mining.update(test_fraction=0.0, validation_fraction=0.0, tests_hidden=(),
                     tests_visible=(), tests_support=())
  return data


def diff_grpo() -> dict:
  """The diff configs' GRPO (grpo_diffs.py, grpo_pr_diffs.py), as sections for
  `config.update`: SWE-RL's diff reward alone; groups of 4 answers to 8 prompts a step, up
  to 384 new tokens, each group's prompt run once per answer in the update (no shared
  prefix), batches padded to multiples of 64 tokens; AdamW at 3e-4 after 3 warmup steps."""
  return dict(
      rewards=ml_collections.ConfigDict({"diff": 1.0}),
      reward_options=ml_collections.ConfigDict({"diff": {}}),
      rl=ml_collections.ConfigDict(dict(
          group_size=4, prompts_per_step=8, max_new_tokens=384, shared_prefix=False,
          length_multiple=64)),
      optimizer=optimizer(lr=3e-4, warmup=3))


def diff_warmstart(steps: int, **others) -> ml_collections.ConfigDict:
  """The diff configs' warm start: `steps` supervised steps on batches of 16, AdamW at
  3e-3 after 10 warmup steps (others: more warmstart keys)."""
  return ml_collections.ConfigDict(dict(
      steps=steps, batch_size=16, optimizer=optimizer(lr=3e-3, warmup=10), **others))


def plan_job(name: str, arch: dict, mesh: dict, prompt_len: int,
             max_new_tokens: int) -> ml_collections.ConfigDict:
  """A GRPO step of a real model's shape, for `rlcode plan` only (nothing is allocated):
  bfloat16, each block rematerialised, the layers scanned, log-probs 128 positions at a
  time (what makes it fit: docs/results.md, "fitting real models"); 8 prompts x 8 samples
  with the prompt computed once per group."""
  config = ml_collections.ConfigDict()
  config.trainer = "grpo"
  config.workdir = f"workdirs/{name}"
  config.mesh = ml_collections.ConfigDict(mesh)
  config.model = ml_collections.ConfigDict(dict(param_dtype="bfloat16", dtype="bfloat16",
                                                remat="full", scan_layers=True,
                                                logits_chunk=128))
  config.model.arch = ml_collections.ConfigDict(dict(
      head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_embeddings=False, **arch))
  config.data = ml_collections.ConfigDict(dict(source="humaneval"))
  config.rewards = ml_collections.ConfigDict({"tests": 1.0})
  config.rl = ml_collections.ConfigDict(dict(
      group_size=8, prompts_per_step=8, max_new_tokens=max_new_tokens, max_staleness=1))
  config.optimizer = optimizer(lr=1e-6, warmup=10, decay=1000)
  config.plan = ml_collections.ConfigDict(dict(prompt_len=prompt_len))
  return config
