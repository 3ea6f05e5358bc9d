"""The agent loop end to end through `rlcode train`: eval rows, metrics, resume."""

import glob
import json
import os

import pytest

from rlcode import cli
from rlcode.runs.metrics import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "agent_tiny.py")
SMALL = [
    "--config.model.arch.hidden_size=32", "--config.model.arch.intermediate_size=64",
    "--config.model.arch.num_layers=1", "--config.model.arch.num_heads=2",
    "--config.model.arch.num_kv_heads=1", "--config.model.arch.head_dim=16",
    "--config.agent.max_turns=2", "--config.agent.max_turn_tokens=24",
    "--config.agent.max_total_tokens=256", "--config.agent.max_observation_tokens=32",
    "--config.agent.tools=('editor','memory','finish')", "--config.agent.variants=('file',)",
    "--config.rl.prompts_per_step=2", "--config.rl.group_size=2",
    "--config.eval.num_samples=2", "--config.eval.batch_prompts=2",
    "--config.data.max_eval_tasks=2", "--config.warmstart.steps=2",
    "--config.warmstart.batch_size=4", "--config.agent.demo_tasks=8",
    "--config.train.steps=2",
    "--config.train.checkpoint_every=1", "--config.train.eval_every=2",
    "--config.train.progress_bar=false",
]


@pytest.mark.slow
def test_rlcode_train_runs_the_agent_loop_and_resumes(tmp_path):
  """With expert-guided groups (one of the two slots; 3 turns fit the expert's view,
  create, finish): from a 2-step warm start every sampled episode fails and the
  expert's succeeds, so every group carries a signal (and dynamic sampling stops after
  its first round); the expert rows' old log-probs
  are the policy's own, so the update's mean ratio is 1 (with the expert's recorded
  0.0 it would be ~1/vocab)."""
  workdir = str(tmp_path / "run")
  argv = ["train", "--config", CONFIG, *SMALL, f"--config.workdir={workdir}",
          "--config.rl.expert_slots=1", "--config.agent.max_turns=3",
          "--config.rl.sample_rounds=2",
          # The expert alone (the config's demonstrator believes the stale note on 70%
          # of the tasks), so that every demonstration solves its task.
          "--config.agent.note_trust=0.0"]
  assert cli.main(argv) == 0
  rows = read_metrics(workdir)
  evals = [r for r in rows if "eval/success" in r]
  assert [r["step"] for r in evals] == [0, 2]
  for r in evals:
    assert 0 <= r["eval/success"] <= 1 and r["eval/tool_calls_per_episode"] >= 0
    assert r["eval/n_episodes"] == 4
  steps = [r for r in rows if "loss" in r]
  assert [r["step"] for r in steps] == [1, 2]
  assert {"success", "tool_calls_per_episode", "context_tokens", "cut_rate",
          "call_error_rate", "memory_notes"} <= set(steps[0])
  for row in steps:
    assert row["expert_rows"] == 0.5 and row["success"] == 0.0
    assert row["groups_with_signal"] == 1.0 and row["expert_logprob_seconds"] > 0
    assert row["update_groups"] == 2  # every group has a signal: none dropped
    # Dynamic sampling needs no second round when every group has a signal.
    assert row["sample_rounds"] == 1 and row["sampled_groups_with_signal"] == 1.0
    assert abs(row["ratio"] - 1.0) < 1e-3
  assert rows[0]["expert_success"] == 1.0  # every expert episode solved its task
  assert rows[0]["expert_episodes"] == 8
  assert os.path.isdir(os.path.join(workdir, "warm_start"))
  # Two more steps resume from the checkpoint at step 2.
  assert cli.main([*argv, "--config.train.steps=3"]) == 0
  assert [r["step"] for r in read_metrics(workdir) if "loss" in r] == [1, 2, 3]


def test_guide_groups_puts_the_expert_in_the_last_slots():
  from rlcode.agent.step_groups import guide_groups
  sampled = [f"s{i}" for i in range(6)]
  out, guided = guide_groups(sampled, ["e0", None], group_size=3, slots=2)
  assert out == ["s0", "e0", "e0", "s3", "s4", "s5"]
  assert guided.tolist() == [False, True, True, False, False, False]
  assert guide_groups(sampled, ["e0", "e1"], 3, 0)[0] == sampled
  for slots in (3, -1):
    with pytest.raises(ValueError, match="rl.expert_slots must be in"):
      guide_groups(sampled, ["e0", "e1"], 3, slots)


def test_grpo_tasks_leaves_out_the_matching_ids():
  from rlcode.agent.step_groups import grpo_tasks
  from rlcode.data.tasks import Task
  from rlcode.errors import BadInput
  tasks = [Task(id=i, prompt="p") for i in ("agent/file/a", "agent/practice/file/b",
                                            "agent/practice/tests/c", "agent/tests/d")]
  assert [t.id for t in grpo_tasks("^agent/practice/", tasks)] == [
      "agent/file/a", "agent/tests/d"]
  assert grpo_tasks(None, tasks) == tasks
  with pytest.raises(BadInput, match="excludes all 4 training tasks"):
    grpo_tasks("^agent/", tasks)


def test_demonstrations_need_a_stale_note_to_trust():
  from rlcode.agent.demos import demonstrations
  from rlcode.config import loader
  from rlcode.data.tasks import Task
  from rlcode.errors import BadInput
  config = loader.load_config(CONFIG, ["--config.agent.note_trust=0.5"])
  plain = [Task(id="agent/file/add/k7/LIMIT", prompt="p", extra={"hint": {"variant": "file"}})]
  with pytest.raises(BadInput, match="no training task has a stale note"):
    demonstrations(config.agent, config.seed, plain, [], None, None)


def test_fill_with_signal_keeps_groups_whose_rewards_differ():
  """DAPO's dynamic sampling: flat groups are dropped while rounds remain; a batch still
  short after the last round is filled with that round's flat groups; one round is the
  plain loop."""
  from types import SimpleNamespace

  from rlcode.agent.step_groups import fill_with_signal
  # Three rounds of three groups of 2; the groups with signal: round 0 its second,
  # round 1 its first, round 2 its first two.
  rounds = [[1, 1, 0, 1, 0, 0], [1, 0, 1, 1, 0, 0], [0, 1, 1, 0, 1, 1]]
  calls = []

  def sample(r):
    calls.append(r)
    return [SimpleNamespace(reward=x, tag=(r, i)) for i, x in enumerate(rounds[r])]

  # Full in the third round: the first three groups with signal, in the order drawn.
  batch, drawn, ran = fill_with_signal(sample, 2, 3, rounds=3)
  assert ran == 3 and calls == [0, 1, 2] and len(drawn) == 18
  assert [b.tag for b in batch] == [(0, 2), (0, 3), (1, 0), (1, 1), (2, 0), (2, 1)]
  # Capped at two rounds, two groups with signal: the last round's first flat group
  # fills the third place.
  calls.clear()
  batch, _, ran = fill_with_signal(sample, 2, 3, rounds=2)
  assert ran == 2 and calls == [0, 1]
  assert [b.tag for b in batch] == [(0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]
  # One round: the groups as they came, flat ones included.
  calls.clear()
  batch, drawn, ran = fill_with_signal(sample, 2, 3, rounds=1)
  assert ran == 1 and calls == [0] and [b.tag for b in batch] == [(0, i) for i in range(6)]
  with pytest.raises(ValueError, match="expected 2 x 2"):
    fill_with_signal(sample, 2, 2, rounds=1)


@pytest.mark.slow
def test_agent_loop_with_the_signal_curriculum_resumes(tmp_path):
  """rl.curriculum="signal": weights logged per family (one family here, file), its
  state saved with the checkpoint and read back on resume."""
  workdir = str(tmp_path / "run")
  argv = ["train", "--config", CONFIG, *SMALL, f"--config.workdir={workdir}",
          "--config.rl.curriculum=signal", "--config.train.eval_every=0"]
  assert cli.main(argv) == 0
  steps = [r for r in read_metrics(workdir) if "loss" in r]
  assert [r["step"] for r in steps] == [1, 2]
  assert all(r["curriculum/file"] == 1.0 for r in steps)
  # A 2-step warm start fails every episode: no group to train, one masked-out group
  # run (the optimiser still steps), and no means over trained tokens logged.
  for r in steps:
    assert r["groups_with_signal"] == 0.0 and r["update_groups"] == 1.0
    assert r["loss"] == 0.0 and not {"ratio", "clip_frac", "entropy"} & set(r)
  meta = glob.glob(os.path.join(workdir, "checkpoints", "2", "meta", "*"))
  saved = json.load(open(meta[0]))["curriculum"]
  assert saved["position"] == 2 and saved["offsets"] == {"file": 4}
  assert saved["groups"]["file"] == pytest.approx(2 * 0.8 + 2)  # decayed once, then 2 more
  assert cli.main([*argv, "--config.train.steps=3"]) == 0
  assert [r["step"] for r in read_metrics(workdir) if "loss" in r] == [1, 2, 3]
