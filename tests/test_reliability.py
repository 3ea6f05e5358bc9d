"""Bad files and broken state, as a disk or a crash leaves them: each is one line naming
what is wrong (exit 2 from the CLI), or survived (a corrupt checkpoint is skipped on
resume), never a traceback, never silently lost.

Surfaces: JSON-lines inputs (invalid UTF-8, bad JSON), checkpoints (a truncated array
file, a cut metadata file, a cut manifest, none intact), a run's recorded config,
Hugging Face checkpoints the loader refuses, `rlcode eval --out`, `rlcode mine`'s
temporary files, processes left at interpreter exit.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest
import tiny_runs
import xla_flags

from rlcode import cli
from rlcode.runs.metrics import read_metrics
from rlcode.train import grpo_loop

ROOT = tiny_runs.ROOT
TASKS = os.path.join(ROOT, "data", "tiny_tasks.jsonl")


def _one_line(capsys, argv, *needles):
  assert cli.main(argv) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "Traceback" not in err, err
  for needle in needles:
    assert needle in err, (needle, err)
  return err


# ------------------------------------------------------------------ JSON lines

@pytest.mark.parametrize("write, needle", [
    (lambda p: p.write_bytes(b'{"task_id": "tiny/gt/k7/d0/gt_7", "completion": ""}\n{"task_id": "\xff"}\n'),
     ":2: not UTF-8 (byte 0xff at column 14)"),
    (lambda p: p.write_bytes(b'{"task_id": "x", "completion": ' + b"9" * 5000 + b"}\n"),
     ":1: not valid JSON"),
    (lambda p: p.write_bytes(b"[" * 100_000 + b"\n"), ":1: not valid JSON"),
])
def test_a_bad_completions_file_names_its_line(capsys, tmp_path, write, needle):
  path = tmp_path / "samples.jsonl"
  write(path)
  _one_line(capsys, ["eval", "--tasks", TASKS + ":held_out", "--completions", str(path)],
            str(path) + needle)


def test_a_tasks_file_with_invalid_utf8_names_its_line(capsys, tmp_path):
  rows = open(TASKS, "rb").read().splitlines(keepends=True)[:5]
  rows[3] = rows[3].replace(b'"prompt": "', b'"prompt": "\xc3\x28', 1)
  path = tmp_path / "tasks.jsonl"
  path.write_bytes(b"".join(rows))
  _one_line(capsys, ["train", "--config", tiny_runs.CONFIG, f"--config.data.path={path}",
                     f"--config.workdir={tmp_path / 'w'}"], f"{path}:4: not UTF-8")


def test_a_choices_file_with_invalid_utf8_names_its_line(capsys, tmp_path):
  path = tmp_path / "choices.jsonl"
  path.write_bytes(b'{"prompt": "p", "candidates": ["a", "b"], "chosen": 0}\n'
                   b'{"prompt": "\x80", "candidates": ["a", "b"], "chosen": 0}\n')
  _one_line(capsys, ["train", "--config", os.path.join(ROOT, "configs", "rm_choices.py"),
                     f"--config.data.path={path}", "--config.rm.init_from=None",
                     f"--config.data.data_dir={tmp_path / 'tfds'}",
                     f"--config.workdir={tmp_path / 'w'}"], f"{path}:2: not UTF-8")


# ------------------------------------------------------------------ checkpoints

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A tiny run with checkpoints at steps 1, 2 and 3 (three kept) and its rows."""
  workdir = tmp_path_factory.mktemp("trained") / "run"
  grpo_loop.train(tiny_runs.config(workdir, "--config.train.steps=3",
                                   "--config.train.checkpoint_every=1",
                                   "--config.train.keep_checkpoints=3"))
  return workdir


def _copy(trained, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(trained, workdir)
  return workdir


def _largest_array_file(workdir, step):
  files = glob.glob(str(workdir / "checkpoints" / str(step) / "state" / "**" / "d" / "*"),
                    recursive=True)
  return max(files, key=os.path.getsize)


def _steps(rows):
  return tiny_runs.steps(rows)


# A failed restore's other reads finish into the event loop orbax closed; rlcode drops
# those late errors (checkpoint._quiet_late_reads_of_a_failed_restore), but pytest swaps
# in its own unraisable hook for each test and reports them as warnings.
_late_reads = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.mark.slow
@_late_reads
def test_a_resume_skips_a_truncated_checkpoint_and_recomputes_its_steps(trained, tmp_path,
                                                                        caplog):
  workdir = _copy(trained, tmp_path)
  before = _steps(read_metrics(str(workdir)))
  os.truncate(_largest_array_file(workdir, 3), 100)
  with caplog.at_level("WARNING"):
    rows = grpo_loop.train(tiny_runs.config(workdir, "--config.train.steps=3",
                                            "--config.train.checkpoint_every=1",
                                            "--config.train.keep_checkpoints=3"))
  warned = [r.getMessage() for r in caplog.records if "corrupt" in r.getMessage()]
  assert len(warned) == 1 and "step 3" in warned[0] and "cannot be read" in warned[0], warned
  # Step 3 was trained again from step 2's state: the same numbers as the first time.
  assert [r["step"] for r in _steps(rows)] == [3]
  assert _steps(read_metrics(str(workdir))) == before


@pytest.mark.parametrize("damage, needle", [
    ("array", "cannot be read"),
    ("state/_METADATA", "_METADATA is not valid JSON"),
    ("meta/metadata", "metadata is not valid JSON"),
    ("state/manifest.ocdbt", "its array database cannot be read"),
])
@_late_reads
def test_a_corrupt_checkpoint_is_named_as_corrupt(trained, tmp_path, capsys, damage, needle):
  workdir = _copy(trained, tmp_path)
  for step in (1, 2, 3):  # every step broken: nothing intact to fall back to
    path = (_largest_array_file(workdir, step) if damage == "array"
            else str(workdir / "checkpoints" / str(step) / damage))
    os.truncate(path, 10)
  args = [*tiny_runs.TINY, f"--config.workdir={workdir}"]
  err = _one_line(capsys, ["eval", "--config", tiny_runs.CONFIG, "--checkpoint", str(workdir),
                           *args], "the checkpoint at step 3", "is corrupt", needle)
  assert "does not match" not in err
  _one_line(capsys, ["train", "--config", tiny_runs.CONFIG, *args],
            "no intact checkpoint", "step 1", "step 2", "step 3")


@pytest.mark.slow
def test_eval_of_a_corrupt_checkpoint_prints_one_line_and_nothing_after(trained, tmp_path):
  workdir = _copy(trained, tmp_path)
  for step in (1, 2, 3):
    os.truncate(_largest_array_file(workdir, step), 10)
  env = dict(os.environ, XLA_FLAGS=xla_flags.for_subprocess(), PYTHONPATH=ROOT)
  done = subprocess.run([sys.executable, "-m", "rlcode", "eval", "--config", tiny_runs.CONFIG,
                         "--checkpoint", str(workdir), *tiny_runs.TINY,
                         f"--config.workdir={workdir}"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
  err = [line for line in done.stderr.splitlines() if not line.startswith("WARNING:absl")]
  assert done.returncode == 2 and len(err) == 1 and "is corrupt" in err[0], (
      "\n".join(err)[:3000] + "\n...\n" + "\n".join(err)[-1500:])


def test_a_failed_restores_unread_futures_are_not_logged_and_others_are(tmp_path, caplog):
  # The late reads of a failed restore can leave asyncio futures whose exception names
  # the step directory, in its message or in the error it was raised from; asyncio logs
  # them when they are collected. Those are dropped, and a future's error about anything
  # else still reaches the log.
  import asyncio
  import gc

  from rlcode.runs import checkpoint
  step_dir = tmp_path / "checkpoints" / "3"
  checkpoint._quiet_late_reads_of_a_failed_restore(step_dir)

  def read_error(where):
    return ValueError(f'OUT_OF_RANGE: Error reading "x" at local file "{where}/"')

  def wrapped(where):  # orbax's own error names only the array index
    try:
      raise Exception("Encountered error while reading array index") from read_error(where)
    except Exception as e:  # noqa: BLE001
      return e

  loop = asyncio.new_event_loop()
  try:
    for error in (read_error(step_dir / "state"), wrapped(step_dir / "state"),
                  wrapped(tmp_path / "elsewhere")):
      future = loop.create_future()
      future.set_exception(error)
      del future
      gc.collect()
  finally:
    loop.close()
  logged = [r for r in caplog.records if r.name == "asyncio"]
  assert len(logged) == 1 and "elsewhere" in str(logged[0].exc_info[1].__cause__), logged


def test_a_recorded_config_cut_mid_write_is_one_line(trained, tmp_path, capsys):
  workdir = _copy(trained, tmp_path)
  (workdir / "config.json").write_text('{"trainer": "grpo", "rl": {"gro')
  _one_line(capsys, ["train", "--config", tiny_runs.CONFIG, *tiny_runs.TINY,
                     f"--config.workdir={workdir}"], "config.json", "not valid JSON")


def test_eval_of_a_missing_checkpoint_leaves_no_thread_behind(tmp_path):
  env = dict(os.environ, XLA_FLAGS=xla_flags.for_subprocess(), PYTHONPATH=ROOT)
  done = subprocess.run([sys.executable, "-m", "rlcode", "eval", "--config", tiny_runs.CONFIG,
                         "--checkpoint", str(tmp_path / "missing")], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
  err = [line for line in done.stderr.splitlines() if not line.startswith("WARNING:absl")]
  assert done.returncode == 2 and len(err) == 1 and "no checkpoint under" in err[0], (
      done.stderr[-4000:])
  assert not (tmp_path / "missing").exists()  # eval creates nothing


# ------------------------------------------------------------------ checkpoints to load

def _hf_dir(tmp_path, **config):
  from safetensors.numpy import save_file
  base = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=16,
              hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=1, max_position_embeddings=32)
  base.update(config)
  path = tmp_path / "hf"
  path.mkdir()
  (path / "config.json").write_text(json.dumps(base))
  import numpy as np
  save_file({"model.embed_tokens.weight": np.zeros((16, 8), np.float32)},
            str(path / "model.safetensors"))
  return path


@pytest.mark.parametrize("config, needles", [
    (dict(architectures=["MambaForCausalLM"], model_type="mamba"),
     ("architectures=['MambaForCausalLM']", "not supported")),
    (dict(rope_scaling={"rope_type": "llama3", "low_freq_factor": 1.0}),
     ("rope type 'llama3' needs", "'factor'")),
    (dict(rope_scaling={"rope_type": "su"}), ("rope type 'su' is not supported",)),
])
def test_a_checkpoint_the_loader_refuses_is_one_line(capsys, tmp_path, config, needles):
  path = _hf_dir(tmp_path, **config)
  _one_line(capsys, ["train", "--config", tiny_runs.CONFIG, f"--config.model.hf_path={path}",
                     f"--config.workdir={tmp_path / 'w'}"], *needles)


def test_a_checkpoint_config_that_is_not_json_is_one_line(capsys, tmp_path):
  path = _hf_dir(tmp_path)
  (path / "config.json").write_text("{")
  _one_line(capsys, ["train", "--config", tiny_runs.CONFIG, f"--config.model.hf_path={path}",
                     f"--config.workdir={tmp_path / 'w'}"], "config.json: not valid JSON")


# ------------------------------------------------------------------ eval --out, mine

@pytest.mark.slow
def test_every_eval_mode_honours_out(tmp_path, capsys):
  from rlcode.data import jsonl
  completions = tmp_path / "samples.jsonl"
  splits = jsonl.read_jsonl_tasks(TASKS, jsonl.JsonlTasks.HELD_OUT_FRACTION)
  rows = [{"task_id": t.id, "completion": t.reference} for t in splits["held_out"]
          for _ in range(2)]
  completions.write_text("".join(json.dumps(r) + "\n" for r in rows))
  out = tmp_path / "out"
  assert cli.main(["eval", "--tasks", TASKS + ":held_out", "--completions", str(completions),
                   "--select", "first,oracle", "--k", "1,2", "--out", str(out),
                   "--workers", "2"]) == 0
  report = json.loads((out / "selection_report.json").read_text())
  assert report["oracle"]["2"] == 1.0 and report["n_tasks"] == len(splits["held_out"])


def test_mine_leaves_no_temporary_directory(tmp_path):
  """tfds looks every dataset it has not prepared up on its cloud bucket, through a
  temporary directory it never removes; our builders' datasets are local."""
  repo = tmp_path / "repo"
  subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
  for i in range(3):
    (repo / "a.py").write_text("".join(f"x{k} = {k + i}\n" for k in range(5)))
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-q", "-m", f"change {i}"], check=True)
  tmp = tmp_path / "tmp"
  tmp.mkdir()
  env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=ROOT, XLA_FLAGS=xla_flags.for_subprocess())
  done = subprocess.run([sys.executable, "-m", "rlcode", "mine", str(repo), "--out",
                         str(tmp_path / "tfds"), "--granularity", "hunk", "--test-fraction",
                         "0.3"], env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "hunk tasks" in done.stdout and os.listdir(tmp) == [], os.listdir(tmp)


# ------------------------------------------------------------------ processes at exit

def test_sessions_left_open_are_stopped_quietly_at_exit(tmp_path):
  code = ("from rlcode.sandbox.session import Session\n"
          "a = Session(); a.exec('echo hi')\n"
          "b = Session(); b.exec('echo hi'); b.close()\n")
  done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                        text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
  assert done.returncode == 0 and done.stderr == "", done.stderr
