"""Every user error through `rlcode` is one line on stderr and exit code 2, no traceback."""

import os
import subprocess
import sys

import pytest

import xla_flags
from rlcode import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "grpo_tiny.py")
TASKS = os.path.join(ROOT, "data", "tiny_tasks.jsonl") + ":held_out"


def _one_line_error(capsys, argv, *needles):
  assert cli.main(argv) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.endswith("\n"), err
  assert "Traceback" not in err
  for needle in needles:
    assert needle in err, (needle, err)
  return err


def _completions(tmp_path, lines):
  path = tmp_path / "samples.jsonl"
  path.write_text("".join(line + "\n" for line in lines))
  return str(path)


def test_unknown_config_key(capsys):
  _one_line_error(capsys, ["train", "--config", CONFIG, "--config.rl.grup_size=4"],
                  "rl has no key 'grup_size'", "valid keys")


@pytest.mark.parametrize("flag, needle", [("--config.rl.advantage=ppo", "rl.advantage='ppo'"),
                                          ("--config.rl.negative_weight=-0.5", "[0, 1]"),
                                          ("--config.rl.sample_rounds=0", "rl.sample_rounds"),
                                          ("--config.rl.curriculum=hard", "rl.curriculum='hard'"),
                                          ("--config.rl.curriculum_decay=1.0",
                                           "rl.curriculum_decay=1.0")])
def test_bad_advantage_settings(capsys, tmp_path, flag, needle):
  # Checked before the warm start and the model's first step: nothing is trained.
  argv = ["train", "--config", os.path.join(ROOT, "configs", "agent_tiny.py"), flag,
          f"--config.workdir={tmp_path}", "--config.warmstart.steps=1"]
  _one_line_error(capsys, argv, needle)
  assert not os.path.exists(os.path.join(tmp_path, "warm_start"))


def test_missing_config(capsys):
  _one_line_error(capsys, ["train", "--config", "configs/none.py"], "configs/none.py",
                  "does not exist")


def test_bad_override_value(capsys):
  _one_line_error(capsys, ["train", "--config", CONFIG, "--config.rl.group_size=many"],
                  "cannot parse as int")


def test_missing_checkpoint(capsys, tmp_path):
  _one_line_error(capsys, ["eval", "--config", CONFIG, "--checkpoint", str(tmp_path)],
                  "no checkpoint under")


@pytest.mark.parametrize("k", ["0", "1,x", ""])
def test_bad_k(capsys, tmp_path, k):
  path = _completions(tmp_path, ['{"task_id": "x", "completion": ""}'])
  _one_line_error(capsys, ["eval", "--tasks", TASKS, "--completions", path, "--k", k], "--k")


def test_malformed_jsonl_row_names_its_line(capsys, tmp_path):
  path = _completions(tmp_path, ['{"task_id": "tiny/gt/k7/d0/gt_7", "completion": ""}',
                                 '{"task_id": "oops", "completion": '])
  _one_line_error(capsys, ["eval", "--tasks", TASKS, "--completions", path],
                  f"{path}:2", "not valid JSON")


def test_missing_task_in_completions_file(capsys, tmp_path):
  path = _completions(tmp_path, ['{"task_id": "tiny/gt/k7/d0/gt_7", "completion": ""}'])
  _one_line_error(capsys, ["eval", "--tasks", TASKS, "--completions", path],
                  "have no completion")


def test_missing_completions_file(capsys, tmp_path):
  _one_line_error(capsys, ["eval", "--tasks", TASKS, "--completions", str(tmp_path / "no.jsonl")],
                  "no.jsonl", "does not exist")


def test_plot_of_a_missing_workdir(capsys, tmp_path):
  _one_line_error(capsys, ["plot", str(tmp_path / "nowhere")], "metrics.jsonl does not exist")


def test_usage_errors_are_one_line_too(capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["eval", "--bogus"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "--bogus" in err


@pytest.mark.slow
def test_a_real_process_prints_one_line(tmp_path):
  # The same path as a user's shell: no traceback reaches stderr.
  env = dict(os.environ, XLA_FLAGS=xla_flags.for_subprocess(), PYTHONPATH=ROOT)
  proc = subprocess.run([sys.executable, "-m", "rlcode", "plot", str(tmp_path / "nowhere")],
                        capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
