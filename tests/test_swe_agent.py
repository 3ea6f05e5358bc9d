"""configs/agent_swe.py end to end through `rlcode train`, on a history made at test time:
the tasks mined on the way, a warm start on the gold agent's episodes (all resolved),
two GRPO steps of the untrained policy with its metrics."""

import os

import pytest

from rlcode import cli
from rlcode.runs.metrics import read_metrics

from swe_history import make_history

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "agent_swe.py")
SMALL = [
    "--config.model.arch.hidden_size=32", "--config.model.arch.intermediate_size=64",
    "--config.model.arch.num_layers=1", "--config.model.arch.num_heads=2",
    "--config.model.arch.num_kv_heads=1", "--config.model.arch.head_dim=16",
    "--config.model.arch.max_seq_len=1024", "--config.agent.max_total_tokens=1024",
    "--config.agent.max_turn_tokens=32",
    "--config.agent.max_observation_tokens=64", "--config.agent.workers=2",
    "--config.rl.group_size=2", "--config.eval.num_samples=2", "--config.eval.batch_prompts=1",
    "--config.warmstart.steps=2", "--config.warmstart.batch_size=2",
    "--config.train.steps=2", "--config.train.checkpoint_every=2",
    "--config.train.eval_every=2", "--config.train.progress_bar=false",
]


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
  """Caches that default to ~/.cache (the reward's runner, tfds) stay in the test's folder."""
  monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.mark.slow
def test_agent_swe_trains_two_steps_on_a_tiny_history(tmp_path):
  repo, _ = make_history(tmp_path / "repo", hostile=False)
  workdir = str(tmp_path / "run")
  argv = ["train", "--config", CONFIG, *SMALL, f"--config.workdir={workdir}",
          f"--config.data.repo={repo.path}", f"--config.data.data_dir={tmp_path / 'tfds'}",
          "--config.data.swe.workers=2",
          # Three tasks: the latest is test, the one before it validation, one left to train.
          "--config.data.swe.validation_fraction=0.34"]
  assert cli.main(argv) == 0
  rows = read_metrics(workdir)
  assert rows[0]["expert_success"] == 1.0 and rows[0]["expert_episodes"] == 1
  steps = [r for r in rows if "loss" in r]
  assert [r["step"] for r in steps] == [1, 2]
  for row in steps:
    assert 0 <= row["success"] <= 1 and row["tool_calls_per_episode"] >= 0
    assert row["context_tokens"] > 0 and row["env_seconds"] > 0
  evals = [r for r in rows if "eval/success" in r]
  assert [r["step"] for r in evals] == [0, 2] and evals[-1]["eval/n_episodes"] == 2
