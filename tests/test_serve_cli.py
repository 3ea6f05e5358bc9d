"""`rlcode serve` and `rlcode learn-online` refuse bad invocations in one line, exit 2;
`rlcode serve --checkpoint` serves the workdir of every trainer of a policy."""

import dataclasses
import os
import signal
import subprocess
import sys

import pytest

from rlcode import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ONLINE = os.path.join(ROOT, "configs", "online_tiny.py") + ":test"
GRPO = os.path.join(ROOT, "configs", "grpo_tiny.py")


@pytest.mark.parametrize("argv,says", [
    (["serve"], "serve needs --config or --checkpoint"),
    (["serve", "--config", ONLINE, "--port", "70000"], "--port 70000"),
    (["serve", "--config", ONLINE, "--api-key-file", "/nonexistent/key"], "no such file"),
    (["serve", "--checkpoint", "/nonexistent/run"], "/nonexistent/run"),
    (["serve", "--config", ONLINE, "--config.serve.batching=fast"], "serve.batching"),
    (["serve", "--config", ONLINE, "--config.serve.slots=0"], "serve.slots"),
    (["serve", "--config", ONLINE,
      f"--config.serve.log_url=sqlite:///{ROOT}/README.md/interactions.sqlite"],
     "its folder " + os.path.join(ROOT, "README.md") + " cannot be made (a file is there)"),
    (["serve", "--config", ONLINE, "--config.serve.log_url=postgresql://u@127.0.0.1:1/db"],
     "cannot be opened (postgresql: "),
    (["learn-online", "--config", GRPO], "trainer is 'online'"),
    (["learn-online", "--config", ONLINE, "--config.online.reward=likes"], "online.reward"),
])
def test_bad_invocations(argv, says, capsys):
  with pytest.raises(SystemExit) as exit_info:
    code = cli.main(argv)
    raise SystemExit(code)
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip()
  assert says in err and "\n" not in err and "Traceback" not in err


def test_empty_api_key_file(tmp_path, capsys):
  key = tmp_path / "key"
  key.write_text("\n")
  assert cli.main(["serve", "--config", ONLINE, "--api-key-file", str(key)]) == 2
  assert "is empty" in capsys.readouterr().err


# ---------------------------------------------------------------- --checkpoint of each run

SMALL = ["--config.model.arch.hidden_size=32", "--config.model.arch.intermediate_size=64",
         "--config.model.arch.num_layers=1", "--config.model.arch.num_heads=2",
         "--config.model.arch.num_kv_heads=2", "--config.model.arch.head_dim=16"]
RUNS = {"grpo": (GRPO, SMALL), "agent": (os.path.join(ROOT, "configs", "agent_tiny.py"), SMALL),
        "online": (ONLINE, [])}


def _workdir(tmp_path, kind):
  """A workdir as `rlcode train` (or learn-online) leaves it: the recorded config and a
  step-3 checkpoint of parameters the config's seed would not build (each moved by 0.5)."""
  import jax
  from flax import nnx

  from rlcode.config import loader, record
  from rlcode.models import build
  from rlcode.parallel import sharding
  from rlcode.runs import checkpoint
  spec, overrides = RUNS[kind]
  workdir = str(tmp_path / kind)
  config = loader.load_config(spec, [*overrides, f"--config.workdir={workdir}"])
  model, _ = build.build_model(config.model, sharding.make_mesh(), config.seed)
  _, params = nnx.split(model, nnx.Param)
  params = jax.tree.map(lambda x: x + 0.5, params)
  record.write_run_config(config, workdir)
  checkpoint.save_once(os.path.join(workdir, "checkpoints"), 3, params, {})
  return workdir, params


@pytest.mark.parametrize("kind", sorted(RUNS))
def test_checkpoint_of_each_policy_run_loads(kind, tmp_path, monkeypatch):
  import jax
  import numpy as np
  from flax import nnx

  from rlcode.config import serving as serving_cfg
  from rlcode.serve import server
  workdir, params = _workdir(tmp_path, kind)
  monkeypatch.chdir(tmp_path)  # served from elsewhere than the repository
  got = server.load(None, workdir)
  got.log.close()
  assert got.source == f"{os.path.join(workdir, 'checkpoints')}@3" and got.version == 0
  assert got.log.url == "sqlite:///" + os.path.join(workdir, "interactions.sqlite")
  assert got.publish_dir == (os.path.join(workdir, "published") if kind == "online" else None)
  for ours, saved in zip(jax.tree.leaves(nnx.split(got.model, nnx.Param)[1]),
                         jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(saved))
  if kind != "online":  # a trainer without a serve section: the schema's defaults
    assert got.serve.to_dict() == dataclasses.asdict(serving_cfg.Serve())


def test_checkpoint_of_a_reward_model_run_is_refused(tmp_path, capsys):
  from rlcode.config import loader, record
  workdir = str(tmp_path / "rm")
  record.write_run_config(loader.load_config(os.path.join(ROOT, "configs", "rm_choices.py"),
                                             [f"--config.workdir={workdir}"]), workdir)
  assert cli.main(["serve", "--checkpoint", workdir, "--port", "0"]) == 2
  err = capsys.readouterr().err.strip()
  assert "reward model's run" in err and workdir in err and "\n" not in err


def test_a_damaged_log_is_refused_before_the_policy_is_restored(tmp_path, capsys,
                                                                monkeypatch):
  from rlcode.policy import policy_eval
  workdir, _ = _workdir(tmp_path, "grpo")
  log_path = os.path.join(workdir, "interactions.sqlite")
  with open(log_path, "wb") as f:
    f.write(b"\0" * 4096)
  monkeypatch.setattr(policy_eval, "restore_policy", None)  # reached: a TypeError
  assert cli.main(["serve", "--checkpoint", workdir, "--port", "0"]) == 2
  err = capsys.readouterr().err.strip()
  assert log_path in err and "--move-log-aside" in err and "\n" not in err


def test_serve_checkpoint_of_a_grpo_run_answers(tmp_path):
  """The README's `rlcode serve --checkpoint WORKDIR`, started elsewhere than the
  repository, answers a completion from the run's policy and logs it in the workdir."""
  import httpx
  workdir, _ = _workdir(tmp_path, "grpo")
  proc = subprocess.Popen([sys.executable, "-m", "rlcode.cli", "serve", "--checkpoint", workdir,
                           "--port", "0"], cwd=str(tmp_path), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT})
  try:
    output = []
    for line in proc.stdout:  # ends when the process does: a failed start is not waited on
      output.append(line)
      if "listening on " in line:
        url = line.split("listening on ")[1].split()[0]
        break
    else:
      raise AssertionError("the server did not start:\n" + "".join(output))
    r = httpx.post(url + "/v1/completions", json={"model": "rlcode", "prompt": "def f(",
                                                  "max_tokens": 4}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("length", "stop")
    assert os.path.isfile(os.path.join(workdir, "interactions.sqlite"))
  finally:
    proc.send_signal(signal.SIGTERM)
    try:
      proc.wait(60)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
