"""The training loop end to end: metrics, resume after SIGKILL, bad resumes.

One device against eight (over two processes) is tests/test_multiprocess.py."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import xla_flags

from rlcode.config import loader
from rlcode.runs.metrics import read_metrics

pytestmark = pytest.mark.slow  # every test shares a trained run (the module fixture)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "grpo_tiny.py")
# A small, fast version of the default job: the same code path end to end. The tasks
# (tests/data/scale_tasks.jsonl) fall in one padded prompt length, so each program
# compiles once; the format reward beside the tests gives some groups a signal, so the
# parameters move and the runs compared below have something to disagree on.
SMALL = [
    "--config.model.arch.hidden_size=32", "--config.model.arch.intermediate_size=64",
    "--config.model.arch.num_layers=1", "--config.model.arch.num_heads=2",
    "--config.model.arch.num_kv_heads=1", "--config.model.arch.head_dim=16",
    "--config.rl.prompts_per_step=4", "--config.rl.group_size=4",
    "--config.rl.max_new_tokens=12", "--config.eval.max_new_tokens=12",
    "--config.eval.num_samples=2", "--config.eval.ks=(1, 2)", "--config.data.max_eval_tasks=6",
    "--config.warmstart.steps=3", "--config.warmstart.batch_size=8",
    "--config.train.steps=4", "--config.train.checkpoint_every=2",
    "--config.train.eval_every=2", "--config.train.progress_bar=false",
    "--config.rl.beta=0.02",
    f"--config.data.path={os.path.join(ROOT, 'tests', 'data', 'scale_tasks.jsonl')}",
    "--config.rewards.format=1.0", "--config.optimizer.learning_rate=0.03",
]
TIMING = ("tokens_per_s", "seconds")


def _config(workdir, *extra):
  return loader.load_config(CONFIG, SMALL + [f"--config.workdir={workdir}", *extra])


def _comparable(rows):
  return [{k: v for k, v in r.items() if not any(t in k for t in TIMING)} for r in rows]


def _assert_same_rows(a, b, atol):
  assert [sorted(r) for r in a] == [sorted(r) for r in b]
  for ra, rb in zip(a, b):
    for key in ra:
      if isinstance(ra[key], float):
        assert abs(ra[key] - rb[key]) <= atol, (ra["step"], key, ra[key], rb[key])
      else:
        assert ra[key] == rb[key], (ra["step"], key)


def _command(workdir):
  return [sys.executable, "-m", "rlcode", "train", "--config", CONFIG, *SMALL,
          f"--config.workdir={workdir}"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  """The runs that are compared all run as the same command in the same environment (one
  CPU device), as a user would re-run it; they share a persistent compilation cache, so
  a rerun loads the programs the first run compiled (the same executables)."""
  return dict(os.environ, XLA_FLAGS=xla_flags.for_subprocess(), PYTHONPATH=ROOT,
              JAX_COMPILATION_CACHE_DIR=str(tmp_path_factory.mktemp("jax_cache")),
              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, env):
  workdir = tmp_path_factory.mktemp("uninterrupted")
  done = subprocess.run(_command(workdir), cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stderr[-2000:]
  return workdir


@pytest.mark.slow
def test_metrics_rows_and_plot(uninterrupted):
  rows = read_metrics(str(uninterrupted))
  steps = [r for r in rows if "loss" in r]
  evals = [r for r in rows if "eval/pass@1" in r]
  assert [r["step"] for r in steps] == [1, 2, 3, 4]
  assert [r["step"] for r in evals] == [0, 2, 4]
  for key in ("loss", "reward_mean", "pass_rate", "kl", "entropy", "tokens_per_s",
              "rollout_tokens_per_s", "update_tokens_per_s"):
    assert all(np.isfinite(r[key]) for r in steps), key
  assert rows[0]["sft_steps"] == 3
  assert any(r["grad_norm"] > 0.01 for r in steps)  # a group with signal moved the policy
  assert os.path.isdir(uninterrupted / "tensorboard")
  from rlcode import cli
  assert cli.main(["plot", str(uninterrupted)]) == 0
  assert os.path.getsize(uninterrupted / "metrics.png") > 1000


@pytest.mark.slow
def test_sigkill_then_rerun_gives_the_same_metrics(uninterrupted, env, tmp_path):
  workdir = tmp_path / "killed"
  cmd = _command(workdir)
  proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, start_new_session=True)
  deadline = time.time() + 300
  while not (workdir / "checkpoints" / "2").is_dir():
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    assert time.time() < deadline, "no checkpoint at step 2 within 300 s"
    time.sleep(0.2)
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()
  assert (workdir / "checkpoints" / "4").exists() is False
  resumed = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  _assert_same_rows(_comparable(read_metrics(str(workdir))),
                    _comparable(read_metrics(str(uninterrupted))), atol=0.0)


def test_resume_with_another_config_is_one_line_and_exit_2(uninterrupted, capsys):
  from rlcode import cli
  before = (uninterrupted / "metrics.jsonl").read_text()
  argv = ["train", "--config", CONFIG, *SMALL, f"--config.workdir={uninterrupted}",
          "--config.seed=1", "--config.rl.group_size=2"]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "Traceback" not in err
  assert "rl.group_size: 4 -> 2" in err and "seed: 0 -> 1" in err
  assert (uninterrupted / "metrics.jsonl").read_text() == before  # nothing truncated
  # Only the resumable keys may change: a longer run and another eval cadence resume.
  from rlcode.config import record
  record.check_resume(_config(uninterrupted, "--config.train.steps=8",
                           "--config.train.eval_every=4"), str(uninterrupted))



def test_a_key_added_since_the_run_started_resumes_at_its_default(uninterrupted, tmp_path):
  """A run recorded before a key existed resumes when the key keeps its default, and not
  when it is set to something else."""
  import json
  from rlcode.config import record
  from rlcode.errors import BadInput
  recorded = json.loads((uninterrupted / "config.json").read_text())
  assert recorded["data"].pop("swe", "absent") is None  # a key at its default (None)
  assert recorded["rl"].pop("micro_batch_rows") is None
  old = tmp_path / "old"
  old.mkdir()
  (old / "config.json").write_text(json.dumps(recorded))
  record.check_resume(_config(uninterrupted), str(old))
  with pytest.raises(BadInput, match="rl.micro_batch_rows"):
    record.check_resume(_config(uninterrupted, "--config.rl.micro_batch_rows=8"), str(old))

def test_fresh_run_never_truncates_old_metrics(uninterrupted, tmp_path, capsys):
  from rlcode import cli
  workdir = tmp_path / "old"
  workdir.mkdir()
  (workdir / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
  assert cli.main(["train", "--config", CONFIG, *SMALL, f"--config.workdir={workdir}"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "metrics.jsonl exists" in err
  assert (workdir / "metrics.jsonl").read_text() == '{"step": 1, "loss": 0.5}\n'


def test_eval_of_a_checkpoint_of_another_model_is_one_line(uninterrupted, capsys):
  from rlcode import cli
  assert cli.main(["eval", "--config", CONFIG, "--checkpoint", str(uninterrupted), *SMALL,
                   "--config.model.arch.hidden_size=64"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "does not match" in err and "Traceback" not in err
  # Found from the checkpoint's metadata, before orbax starts restoring (its own check
  # fails half way and leaves coroutines and threads behind).
  assert "first differing shape" in err


@pytest.mark.slow
def test_eval_cli_on_a_checkpoint(uninterrupted, capsys):
  from rlcode import cli
  assert cli.main(["eval", "--config", CONFIG, "--checkpoint", str(uninterrupted), "--k", "1,2",
                   *SMALL]) == 0
  result = json.loads(capsys.readouterr().out)
  last = [r for r in read_metrics(str(uninterrupted)) if "eval/pass@1" in r][-1]
  assert result["step"] == 4 and result["n_tasks"] == last["eval/n_tasks"] == 4
  assert 0 <= result["pass@1"] <= 1
  assert result["pass@1"] == last["eval/pass@1"]  # same policy, same seed, same samples
