"""One run over two processes (2 x 4 fake CPU devices on localhost, gloo): killed with
SIGKILL, resumed, and compared with the same run on one device.

The run has the default job's parts that touch every device: a supervised warm start,
sampling, a KL term against the reference policy, the update and an evaluation. This is
the suite's end-to-end check that the mesh (data x fsdp x tensor, across processes)
does not change what is computed; tests/test_grpo.py, test_sharding.py and
test_ablations.py check the parts on one process of 8 devices."""

import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tiny_runs
import xla_flags

from rlcode.runs.metrics import read_metrics
from rlcode.train import grpo_loop

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

# The batch's rows and prompts split over data x fsdp = 4; each process holds one data
# slice (2 x 2 devices), samples its 2 prompts there and holds their rows of the batch.
MESH = ["--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2"]
RUN = ["--config.train.steps=3", "--config.train.checkpoint_every=1",
       "--config.train.eval_every=3", "--config.warmstart.steps=2",
       "--config.warmstart.batch_size=8", "--config.rl.beta=0.02"]
# Float keys (losses, KL, norms, rewards) agree to 1e-5 with the one-device run.
ATOL = 1e-5


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(workdir, cache, logs):
  """Both processes; their output goes to files (a pipe nobody reads fills up and
  blocks a process, and with it the other's collectives)."""
  port = _free_port()
  env = dict(os.environ, XLA_FLAGS=xla_flags.for_subprocess("--xla_force_host_platform_device_count=4"),
             JAX_PLATFORMS="cpu", PYTHONPATH=tiny_runs.ROOT,
             # The resumed processes compile what the killed ones did: reuse it.
             JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  return [subprocess.Popen(
      [sys.executable, "-m", "rlcode", "train", "--config", tiny_runs.CONFIG, *tiny_runs.TINY,
       *MESH, *RUN, f"--config.workdir={workdir}", "--coordinator", f"127.0.0.1:{port}",
       "--num-processes", "2", "--process-id", str(i)],
      cwd=tiny_runs.ROOT, env=env, stdout=subprocess.DEVNULL,
      stderr=open(f"{logs}.{i}.log", "w"), start_new_session=True) for i in range(2)]


def _tail(logs, i):
  with open(f"{logs}.{i}.log") as f:
    return f.read()[-3000:]


def _close(a, b):
  assert [sorted(r) for r in a] == [sorted(r) for r in b]
  for ra, rb in zip(a, b):
    for key, value in ra.items():
      if isinstance(value, float):
        assert abs(value - rb[key]) <= ATOL, (ra["step"], key, value, rb[key])
      else:
        assert value == rb[key], (ra["step"], key)


def test_two_processes_killed_and_resumed_match_one_process(tmp_path):
  workdir, cache = tmp_path / "two", tmp_path / "cache"
  procs = _launch(workdir, cache, tmp_path / "first")
  deadline = time.time() + 600
  while not (workdir / "checkpoints" / "1").is_dir():
    for i, p in enumerate(procs):
      assert p.poll() is None, _tail(tmp_path / "first", i)
    assert time.time() < deadline, "no checkpoint at step 1 within 600 s"
    time.sleep(0.2)
  for p in procs:
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
  assert not (workdir / "checkpoints" / "3").exists()
  procs = _launch(workdir, cache, tmp_path / "resumed")
  for i, p in enumerate(procs):
    assert p.wait(timeout=900) == 0, _tail(tmp_path / "resumed", i)

  grpo_loop.train(tiny_runs.config(tmp_path / "one", *RUN))  # one device
  one = read_metrics(str(tmp_path / "one"))
  two = read_metrics(str(workdir))
  drop = lambda rows: [{k: v for k, v in r.items() if not any(t in k for t in tiny_runs.TIMING)}
                       for r in rows]
  # The warm start's row, evals at 0 and at the end.
  assert [r["step"] for r in two] == [0, 0, 1, 2, 3, 3] and two[0]["sft_steps"] == 2
  assert any(r.get("grad_norm", 0) > 0 for r in two)
  _close(drop(two), drop(one))
  # Only process 0 wrote: one metrics file, one config, one TensorBoard directory (and
  # the warm-started policy's checkpoint, a collective write like the run's checkpoints).
  assert sorted(os.listdir(workdir)) == ["checkpoints", "config.json", "metrics.jsonl",
                                         "tensorboard", "warm_start"]
  assert np.isfinite([r["loss"] for r in two if "loss" in r]).all()
