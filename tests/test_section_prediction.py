"""configs/section_prediction.py end to end: a few tiny GRPO steps on the embedded corpus."""

from __future__ import annotations

import math
import os

import pytest

from rlcode.config import loader
from rlcode.rl import sequences
from rlcode.train import grpo_loop
from rlcode.data import sources
from rlcode.runs.metrics import read_metrics
from rlcode.models.tokenizer import load_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "section_prediction.py")
# The config's data and rewards, a much smaller model over bytes (budgets in bytes) and
# much shorter samples.
SMALL = [
    "--config.model.tokenizer=bytes", "--config.model.arch.vocab_size=264",
    "--config.data.count_tokens=bytes",
    "--config.model.arch.hidden_size=32", "--config.model.arch.intermediate_size=64",
    "--config.model.arch.num_layers=1", "--config.model.arch.num_heads=2",
    "--config.model.arch.num_kv_heads=1", "--config.model.arch.head_dim=16",
    "--config.rl.prompts_per_step=2", "--config.rl.group_size=4",
    "--config.rl.max_new_tokens=16", "--config.eval.max_new_tokens=16",
    "--config.eval.num_samples=2", "--config.data.max_eval_tasks=3",
    "--config.warmstart.steps=1", "--config.warmstart.batch_size=4",
    "--config.train.steps=2", "--config.train.checkpoint_every=2",
    "--config.train.eval_every=2", "--config.train.progress_bar=false",
]
REWARD_METRICS = ("reward/semantic/group_std", "reward/semantic/cosine_lexical_corr",
                  "reward/semantic/cosine", "reward/semantic/lexical")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("tfds"))


@pytest.mark.slow
def test_every_prompt_and_reference_fits_the_context(data_dir):
  config = loader.load_config(CONFIG, [f"--config.data.data_dir={data_dir}"])
  # The budgets count the model's own tokenizer.
  assert config.data.count_tokens == config.model.tokenizer and not config.model.hf_path
  context = config.model.arch.max_seq_len
  tokenizer = load_tokenizer(sources.resolve(config.model.tokenizer))
  for split in (config.data.train_split, config.data.eval_split, "test"):
    tasks = sources.load(config.data, split)
    assert tasks, split
    for task in tasks:
      prompt = len(tokenizer.encode(task.prompt))
      assert prompt <= config.data.options.context_budget + 1, task.id
      assert prompt + config.rl.max_new_tokens <= context, task.id
      assert prompt + config.eval.max_new_tokens <= context, task.id
    # A warm-start row is prompt + reference + EOS.
    batch = sequences.sft_batch(tokenizer, tasks)
    assert int(batch.mask.sum(1).max()) <= config.rl.max_new_tokens
    assert int((batch.tokens != tokenizer.pad_id).sum(1).max()) <= context


def test_unknown_token_unit_is_an_error(data_dir):
  config = loader.load_config(CONFIG, [f"--config.data.data_dir={data_dir}",
                                           "--config.data.count_tokens=chars"])
  with pytest.raises(ValueError, match="count_tokens='chars'"):
    sources.builder(config.data)


@pytest.mark.slow
def test_grpo_steps_log_semantic_spread_and_correlation(data_dir, tmp_path):
  config = loader.load_config(CONFIG, SMALL + [f"--config.workdir={tmp_path}",
                                                   f"--config.data.data_dir={data_dir}"])
  rows = grpo_loop.train(config)
  assert rows == read_metrics(str(tmp_path))  # every row written, the warm start's first
  assert read_metrics(str(tmp_path))[0]["sft_steps"] == 1
  steps = [r for r in rows if "loss" in r]
  evals = [r for r in rows if "eval/reward_mean" in r]
  assert [r["step"] for r in steps] == [1, 2]
  assert [r["step"] for r in evals] == [0, 2]
  for row in steps:
    for key in ("loss", "reward_mean", "completion_len") + REWARD_METRICS:
      assert isinstance(row[key], float) and math.isfinite(row[key]), (row["step"], key)
    assert 0.0 <= row["reward/semantic/group_std"] <= 0.5
    assert -1.0 <= row["reward/semantic/cosine_lexical_corr"] <= 1.0
    assert row["reward_mean"] == row["reward/semantic/mean"]
  for row in evals:
    assert row["eval/n_tasks"] == 3 and row["eval/n_samples"] == 6
    for key in REWARD_METRICS:
      value = row["eval/" + key.removeprefix("reward/")]
      assert isinstance(value, float) and math.isfinite(value), (row["step"], key)
