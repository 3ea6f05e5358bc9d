"""mini-swe-agent, installed from PyPI and unmodified, as a harness (rlcode.harness.mini_swe) on
executable PR tasks mined at test time from tests/swe_history's history (its three
well-behaved PRs).

- The scripted agent: mini-swe-agent's own DeterministicModel, whose bash commands write
  the gold patch's files in rlcode's sandbox, resolves every task (reward 1, the tasks'
  tests); one that submits at once resolves none.
- `rlcode train --config configs/harness_mini_swe.py:smoke`: two GRPO steps of the tiny
  policy served in the trainer's process, mini-swe-agent's litellm model calling it.
  Every call in the agent's own trajectory (its messages' responses, saved with the
  episodes) carries the very tokens and log-probs the engine sampled and recorded, under
  the version that served the step; the reward is the tests'.
- Bad input: a data source that is not "swe", a mini-swe-agent config that does not exist.
"""

import json
import os

import numpy as np
import pytest

from rlcode import cli
from rlcode.runs.metrics import read_metrics

from swe_history import make_history

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "harness_mini_swe.py") + ":smoke"
SMALL = ["--config.model.arch.hidden_size=32", "--config.model.arch.intermediate_size=64",
         "--config.model.arch.num_layers=1", "--config.model.arch.num_heads=2",
         "--config.model.arch.num_kv_heads=1", "--config.model.arch.head_dim=16",
         "--config.train.progress_bar=false"]


@pytest.fixture(scope="module")
def history(tmp_path_factory):
  """The history and its mined tasks; HOME (the test environments' cache) in the test's
  folder for the module."""
  from rlcode.swe import mining
  from rlcode.swe.config import SweConfig
  root = tmp_path_factory.mktemp("mini_swe")
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("HOME", str(root / "home"))
    repo, _ = make_history(root / "repo", hostile=False)
    result = mining.mine(SweConfig(source=str(repo.path), timeout=12.0, workers=2,
                                   gold_runs=2), cache_dir=str(root / "cache"))
    yield dict(root=root, repo=repo, tasks=result.tasks)


def test_the_scripted_agent_resolves_every_task_and_one_that_submits_none(history):
  from rlcode.harness import mini_swe  # first: it sets litellm's and mini-swe-agent's options
  from minisweagent.models.test_models import DeterministicModel, make_output
  harness = mini_swe.Harness(model="unused", command_seconds=30)
  assert len(history["tasks"]) == 3
  for task in history["tasks"]:
    out = harness.play(task, mini_swe.gold_model(task))
    assert (out["reward"], out["exit_status"]) == (1.0, "Submitted"), (task.id, out["details"])
    # The gold files went through the agent's own bash actions, one command each.
    assert out["calls"] == len(mini_swe.gold_commands(task))
    quitter = DeterministicModel(outputs=[make_output(
        "Done.", [{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}], cost=0.0)])
    assert harness.play(task, quitter)["reward"] == 0.0


def _sampled_runs(segment):
  """The segment's runs of sampled tokens (mask 1): (tokens, log-probs, versions) each."""
  runs, current = [], None
  for t, m, lp, v in zip(segment["tokens"], segment["mask"], segment["logprobs"],
                         segment["versions"]):
    if not m:
      current = None
      continue
    if current is None:
      current = ([], [], [])
      runs.append(current)
    for xs, x in zip(current, (t, lp, v)):
      xs.append(x)
  return runs


def test_two_grpo_steps_of_mini_swe_agent_train_what_the_engine_sampled(history, tmp_path,
                                                                        monkeypatch):
  from rlcode.harness import mini_swe
  from rlcode.models.tokenizer import load_tokenizer
  monkeypatch.setenv("HOME", str(history["root"] / "home"))
  workdir = str(tmp_path / "run")
  argv = ["train", "--config", CONFIG, *SMALL, f"--config.workdir={workdir}",
          f"--config.data.repo={history['repo'].path}",
          f"--config.data.data_dir={tmp_path / 'tfds'}", "--config.data.swe.workers=2",
          "--config.data.swe.validation_fraction=0.34", "--config.harness.save_episodes=true"]
  assert cli.main(argv) == 0
  rows = read_metrics(workdir)
  assert [r["step"] for r in rows] == [1, 2]
  tokenizer = load_tokenizer(os.path.join(ROOT, "data", "code_bpe.json"))
  for row in rows:
    assert row["episodes"] == 4 and row["failed_episodes"] == 0 and row["update_skipped"] == 0
    assert row["trained_tokens"] > 0 and 0 <= row["reward_mean"] <= 1
    with open(os.path.join(workdir, "episodes", f"step_{row['step']:06d}.jsonl")) as f:
      episodes = [json.loads(line) for line in f]
    assert len(episodes) == 4
    for ep in episodes:
      result = ep["result"]
      assert ep["failure"] is None and result["exit_status"] in mini_swe.ENDINGS
      assert ep["reward"] == result["reward"] and ep["calls"] == result["calls"] >= 1
      # The agent's calls, in order: each model response it kept (on a reply, or on the
      # format error that replaced it in its history).
      responses = [m["extra"]["response"] for m in result["messages"]
                   if "response" in m.get("extra", {})]
      assert len(responses) == ep["calls"]
      runs = []
      for segment in ep["segments"]:
        seg_runs = _sampled_runs(segment)
        assert len(seg_runs) == len(segment["calls"])
        runs += seg_runs
      assert len(runs) == ep["calls"]
      assert sum(ep["splits"].values()) == len(ep["segments"]) - 1
      for (tokens, logprobs, versions), response in zip(runs, responses):
        served = response["choices"][0]["logprobs"]["content"]
        assert [bytes(tokenizer.token_bytes(t)) for t in tokens] == [bytes(e["bytes"])
                                                                     for e in served]
        assert logprobs == [float(np.float32(e["logprob"])) for e in served]
        assert set(versions) == {row["policy_version"]}


def test_tasks_that_are_not_pr_tasks_are_one_line(tmp_path, capfd):
  path = tmp_path / "jsonl_tasks.py"
  path.write_text(f"""import importlib.util
import sys
sys.path.insert(0, {os.path.join(ROOT, "configs")!r})
spec = importlib.util.spec_from_file_location("base", {CONFIG.split(":")[0]!r})
base = importlib.util.module_from_spec(spec)
spec.loader.exec_module(base)


def get_config():
  config = base.get_config("smoke")
  config.data = dict(source="jsonl", path={os.path.join(ROOT, "data", "tiny_tasks.jsonl")!r})
  return config
""")
  argv = ["train", "--config", str(path), *SMALL, f"--config.workdir={tmp_path / 'run'}"]
  assert cli.main(argv) == 2
  err = capfd.readouterr().err
  assert "harness.mini_swe_agent works on executable PR tasks" in err
  assert "Traceback" not in err


def test_an_unknown_mini_swe_agent_config_is_one_line(tmp_path, capfd):
  argv = ["train", "--config", CONFIG, *SMALL, f"--config.workdir={tmp_path / 'run'}",
          "--config.harness.mini_swe_agent.config=no_such_config"]
  assert cli.main(argv) == 2
  err = capfd.readouterr().err
  assert "config.harness.mini_swe_agent.config='no_such_config': neither a file" in err
  assert "Traceback" not in err
