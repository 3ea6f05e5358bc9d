"""The online learner: rewards of feedback, baselines, and `learn-online` end to end on a
real interaction log (real samples, their behaviour log-probs), with resume by cursor."""

import os

import numpy as np
import pytest
from flax import nnx

import serving
from rlcode.rl import logprobs as logprobs_lib
from rlcode.sampling import generate
from rlcode.serve import log as log_lib
from rlcode.serve import weights
from rlcode.train import online_data, online_loop


def test_rewards_of_each_kind():
  one = [[5, 6]]
  assert online_data.rewards_of({"chosen": 1}, one * 3, "feedback") == {0: 0.0, 1: 1.0, 2: 0.0}
  assert online_data.rewards_of({"accepted": True}, one, "feedback") == {0: 1.0}
  assert online_data.rewards_of({"accepted": False}, one * 3, "feedback") == {0: 0.0, 1: 0.0,
                                                                              2: 0.0}
  assert online_data.rewards_of({"accepted": True, "index": 2}, one * 3, "feedback") == {2: 1.0}
  assert online_data.rewards_of({"kept": 0.25, "index": 1}, one * 2, "feedback") == {1: 0.25}
  assert online_data.rewards_of({"kept": 0.25}, one, "chosen") == {}
  assert online_data.rewards_of({"chosen": 0, "kept": 0.5}, one * 2, "kept") == {0: 0.5}


def test_feedback_on_a_list_of_prompts_reaches_only_the_chosen_prompts_candidates():
  """Prompts [a, b, a'] with n=2 log choices a0 a1 b0 b1 a'0 a'1 under one id: choosing b1
  ranks b's two candidates, an index-less rejection rejects candidate 0's prompt's; the
  other prompts' candidates, never compared, get no reward and are counted as skipped."""
  a, b, c = [1, 2], [3], [1, 2, 4]
  prompts = [a, a, b, b, c, c]
  assert online_data.rewards_of({"chosen": 3}, prompts, "feedback") == {2: 0.0, 3: 1.0}
  assert online_data.rewards_of({"accepted": False}, prompts, "feedback") == {0: 0.0, 1: 0.0}
  assert online_data.rewards_of({"accepted": True, "index": 4}, prompts, "feedback") == {4: 1.0}
  # two equal prompts in one list are one prompt's samples: one group
  assert online_data.rewards_of({"chosen": 2}, [a, b, a], "chosen") == {0: 0.0, 2: 1.0}
  feedback = {"chosen": 3, "candidates": [
      {"prompt_tokens": p, "tokens": [9], "logprobs": [-1.0], "policy_version": 0,
       "params": {"temperature": 1.0}} for p in prompts]}
  counts = {}
  rows = online_data.rows_of(feedback, kind="feedback", max_tokens=8, counts=counts)
  assert [(r.prompt, r.reward) for r in rows] == [(b, 0.0), (b, 1.0)]
  assert counts == {"skipped_no_signal": 4}
  loo = online_data.with_advantages(rows, online_data.Baseline(0.9), "loo")
  assert [r.advantage for r in loo] == [-1.0, 1.0]


def test_baselines():
  base = online_data.Baseline(0.5)
  assert [base.advantage(r) for r in (1.0, 0.0, 1.0)] == [0.0, -1.0, 0.5]
  rows = [online_data.Row([1], [2], [-1.0], r, 0.0, 0) for r in (1.0, 0.0, 0.0)]
  loo = online_data.with_advantages(rows, online_data.Baseline(0.9), "loo")
  assert [r.advantage for r in loo] == [1.0, -0.5, -0.5]
  # two prompts under one id (a list of prompts): each prompt's candidates are a group
  mixed = [online_data.Row([p], [2], [-1.0], r, 0.0, 0)
           for p, r in ((1, 1.0), (1, 0.0), (7, 0.0), (7, 0.0), (9, 1.0))]
  loo = online_data.with_advantages(mixed, online_data.Baseline(0.9), "loo")
  assert [r.advantage for r in loo][:4] == [1.0, -1.0, 0.0, 0.0]


def _serve_into(store, model, tokenizer, prompts, k, seed, version):
  """Samples k candidates of each prompt as the server would and logs them; returns ids."""
  gen = generate(model, prompts, max_new_tokens=12, temperature=1.0, group_size=k, seed=seed,
                 stop_tokens=tokenizer.eos_ids, pad_id=tokenizer.pad_id)
  ids = []
  for p, prompt in enumerate(prompts):
    rid = f"cmpl-{seed}-{p}"
    rows = []
    for i in range(k):
      r = p * k + i
      n = int(gen.lengths[r])
      rows.append(log_lib.Served(
          id=rid, index=i, policy_version=version, model="m", prompt_tokens=prompt,
          tokens=gen.tokens[r, :n].tolist(), logprobs=gen.logprobs[r, :n].tolist(),
          text=tokenizer.decode(gen.tokens[r, :n]), finish_reason="length",
          params={"temperature": 1.0, "top_p": 1.0}, n=k))
    store.record(rows)
    ids.append(rid)
  return ids


def _seq_logprob(model, prompt, tokens):
  seq = np.asarray([prompt + tokens], np.int32)
  logits = model(seq)[:, len(prompt) - 1:-1]
  return float(np.asarray(logprobs_lib.token_logprobs(logits, seq[:, len(prompt):], 1.0)).sum())


@pytest.mark.slow
def test_learn_online_end_to_end_and_resume(tmp_path):
  workdir = str(tmp_path)
  common = [f"--config.workdir={workdir}", "--config.online.batch_rows=8",
            "--config.train.checkpoint_every=1", "--config.optimizer.learning_rate=0.01",
            "--config.optimizer.warmup_steps=0", "--config.mesh.data=1"]
  config = serving.config(workdir, *common[1:], "--config.train.steps=2")
  from rlcode.parallel import sharding
  from rlcode.serve import server
  model, tokenizer, _ = server.initial_policy(config.online.init_from, config.model,
                                             config.seed, sharding.make_mesh())
  store = log_lib.InteractionLog(log_lib.default_url(workdir))
  prompts = [tokenizer.encode("def add(a, b):"), tokenizer.encode("# sort a list")]
  ids = []
  for seed in range(4):  # 8 requests of 2 candidates: the user chose the first each time
    ids += _serve_into(store, model, tokenizer, prompts, 2, seed, 0)
  for rid in ids:
    assert store.feedback({"id": rid, "chosen": 0})
  rows = store.feedback_after(0, 100)
  chosen = [(r["candidates"][0]["prompt_tokens"], r["candidates"][0]["tokens"]) for r in rows]
  other = [(r["candidates"][1]["prompt_tokens"], r["candidates"][1]["tokens"]) for r in rows]
  before = [np.mean([_seq_logprob(model, p, t) for p, t in pairs]) for pairs in (chosen, other)]

  out = online_loop.train(config)
  steps = [r for r in out if "loss" in r]
  assert [r["version"] for r in steps] == [1, 2]
  assert [r["rows"] for r in steps] == [8, 8] and steps[-1]["cursor"] == 8
  # The first update is on-policy: every importance weight is 1 (to float error).
  assert abs(steps[0]["iw_mean"] - 1.0) < 1e-3 and steps[0]["iw_clip_frac"] == 0.0
  assert weights.versions(os.path.join(workdir, "published"))[-1] == 2
  graphdef, state = nnx.split(model)
  after_model = nnx.merge(graphdef, weights.load(os.path.join(workdir, "published"), 2, state))
  after = [np.mean([_seq_logprob(after_model, p, t) for p, t in pairs])
           for pairs in (chosen, other)]
  assert after[0] - before[0] > after[1] - before[1], (before, after)

  # Resume: new feedback on samples of version 2, a third step that reads only it.
  more = _serve_into(store, after_model, tokenizer, prompts * 2, 2, 10, 2)
  for rid in more:
    store.feedback({"id": rid, "accepted": False})
  store.close()
  resumed = online_loop.train(serving.config(workdir, *common[1:], "--config.train.steps=3"))
  (third,) = [r for r in resumed if "loss" in r]
  assert third["version"] == 3 and third["cursor"] == 12 and third["feedback"] == 4
  assert third["lag_mean"] == 0.0 and third["reward_mean"] == 0.0


def test_stale_candidates_are_skipped():
  feedback = {"chosen": 0, "candidates": [
      {"prompt_tokens": [1], "tokens": [2], "logprobs": [-1.0], "policy_version": v,
       "params": {"temperature": t}} for v, t in ((3, 1.0), (7, 1.0), (7, 0.0))]}
  counts = {}
  rows = online_data.rows_of(feedback, kind="chosen", max_tokens=8, counts=counts,
                             oldest_version=5)
  assert [(r.reward, r.policy_version) for r in rows] == [(0.0, 7)]
  assert counts == {"skipped_stale": 1, "skipped_greedy": 1}


def _feedback_log(tmp_path, requests) -> str:
  """Requests r{i} of 2 candidates each (2 requests a 4-row update), the user choosing
  candidate i % 2, added to the log in tmp_path; its URL."""
  log_url = log_lib.default_url(str(tmp_path))
  store = log_lib.InteractionLog(log_url)
  for i in requests:
    rid, rng = f"r{i}", np.random.default_rng(i)
    store.record([log_lib.Served(
        id=rid, index=k, policy_version=0, model="m", prompt_tokens=[40 + i, 41, 42],
        tokens=rng.integers(32, 120, 5).tolist(), logprobs=[-2.0] * 5, text="",
        finish_reason="length", params={"temperature": 1.0, "top_p": 1.0}, n=2)
        for k in range(2)])
    store.feedback({"id": rid, "chosen": i % 2})
  store.close()
  return log_url


def _learner(log_url, *more):
  return (f"--config.serve.log_url={log_url}", "--config.online.batch_rows=4",
          "--config.train.steps=3", "--config.train.checkpoint_every=2",
          "--config.optimizer.learning_rate=0.01", "--config.optimizer.warmup_steps=0",
          "--config.mesh.data=1", *more)


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
  """The version-3 weights of a learner never killed, on requests r0..r5."""
  tmp = tmp_path_factory.mktemp("whole")
  online_loop.train(serving.config(str(tmp / "run"), *_learner(_feedback_log(tmp, range(6)))),
                    stop=lambda: True)
  from safetensors.numpy import load_file
  return load_file(str(tmp / "run" / "published" / "v00000003.safetensors"))


def _assert_weights(workdir, whole):
  from safetensors.numpy import load_file
  got = load_file(str(workdir / "published" / "v00000003.safetensors"))
  assert whole.keys() == got.keys()
  for name in whole:
    np.testing.assert_array_equal(got[name], whole[name], err_msg=name)


class Killed(Exception):
  """Stands for a SIGKILL at a kill point: the run stops with the files as they are."""


def _kill_at(monkeypatch, step):
  """Run.save of `step` kills the learner instead: every earlier row, version and
  checkpoint is on disk, that step's checkpoint is not."""
  from rlcode.train import scaffold
  real = scaffold.Run.save

  def save(self, at, tree, meta):
    if at == step:
      raise Killed(at)
    real(self, at, tree, meta)
  monkeypatch.setattr(scaffold.Run, "save", save)


def test_a_killed_learner_restarts_and_trains_on_each_feedback_row_once(tmp_path, monkeypatch,
                                                                         whole):
  """Killed at its step-0 checkpoint, then between checkpoints 0 and 2 (the metrics already
  written), then at the last checkpoint, a learner restarted each time with the same
  command ends with the weights of one never killed: no row trained on twice or skipped."""
  log_url = _feedback_log(tmp_path, range(8))

  def learn(workdir):
    return online_loop.train(serving.config(str(tmp_path / workdir), *_learner(log_url)),
                             stop=lambda: True)  # short of feedback: ends instead of waiting

  for kill in (0, 2, 3):
    with monkeypatch.context() as patch:
      _kill_at(patch, kill)
      with pytest.raises(Killed):
        learn("killed")
  learn("killed")
  from rlcode.runs import metrics
  rows = [r for r in metrics.read_metrics(str(tmp_path / "killed")) if "loss" in r]
  assert [(r["step"], r["cursor"], r["feedback"]) for r in rows] == [(1, 2, 2), (2, 4, 2),
                                                                     (3, 6, 2)]
  _assert_weights(tmp_path / "killed", whole)


def test_a_sigkilled_learn_online_resumes_by_itself_and_trains_each_row_once(tmp_path, whole):
  """`rlcode learn-online` in its own process, SIGKILLed once step 1's metrics row is on
  disk (in step 2, in its checkpoint's save, or waiting for step 3's feedback; nothing
  closed or flushed by the learner), then re-run with the same arguments once the rest of
  the feedback is in: it resumes from its last checkpoint with the cursor there, and its
  rows and weights are those of a learner never killed."""
  import signal
  import subprocess
  import sys
  import time

  import xla_flags
  log_url = _feedback_log(tmp_path, range(4))  # steps 1 and 2; step 3's comes later
  killed = tmp_path / "killed"
  proc = subprocess.Popen(
      [sys.executable, "-m", "rlcode", "learn-online", "--config", serving.CONFIG,
       f"--config.workdir={killed}", *_learner(log_url)],
      cwd=serving.ROOT, env=dict(os.environ, XLA_FLAGS=xla_flags.for_subprocess(),
                                 PYTHONPATH=serving.ROOT),
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
  try:
    deadline = time.monotonic() + 120
    while b'"loss"' not in ((killed / "metrics.jsonl").read_bytes()
                            if (killed / "metrics.jsonl").exists() else b""):
      assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
      assert time.monotonic() < deadline, "no metrics row of step 1 within 120 s"
      time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
  finally:
    proc.kill()
    proc.wait()
    proc.stderr.close()
  # Killed after step 1's row: checkpoint 0 saved, and on a busy machine perhaps step 2's
  # save begun (Orbax's temporary directory, which the restart clears) or done.
  saved = sorted(d for d in os.listdir(killed / "checkpoints") if d.isdigit())
  assert saved in (["0"], ["0", "2"]), os.listdir(killed / "checkpoints")
  _feedback_log(tmp_path, range(4, 6))
  online_loop.train(serving.config(str(killed), *_learner(log_url)), stop=lambda: True)
  from rlcode.runs import metrics
  rows = [r for r in metrics.read_metrics(str(killed)) if "loss" in r]
  assert [(r["step"], r["cursor"], r["feedback"]) for r in rows] == [(1, 2, 2), (2, 4, 2),
                                                                     (3, 6, 2)]
  _assert_weights(killed, whole)
