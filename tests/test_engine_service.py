"""The engine in its own process (rlcode.engine.service): the samples of an in-process
engine, weights that arrive over its socket, and a process killed mid-rollout that loses no
finished request and hands back no partial one."""

import threading
import time

import numpy as np
import pytest
from flax import nnx

from rlcode.engine import Engine, Request
from rlcode.engine.service import EngineLost, RemoteEngine
from rlcode.models import Decoder, ModelConfig

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, max_seq_len=256)
SIZES = dict(num_pages=160, page_size=8, max_rows=16, prefix_cache=False)


def _requests(n=6, max_tokens=48):
  rng = np.random.default_rng(0)
  return [Request(rng.integers(1, 64, int(rng.integers(3, 12))).tolist(), max_tokens, n=2,
                  temperature=1.0, seed=7, rows=[2 * i, 2 * i + 1], stop_tokens=(0,))
          for i in range(n)]


def _run(engine, requests, after_first=None, timeout=300):
  """Every request's result, by index, each answered once; after_first() runs once the
  first answer is in."""
  results, cond = {}, threading.Condition()

  def done(i, result):
    with cond:
      assert i not in results, f"request {i} answered twice"
      results[i] = result
      cond.notify_all()
  for i, r in enumerate(requests):
    engine.submit(Request(**{**r.__dict__, "on_done": lambda res, i=i: done(i, res)}))
  with cond:
    cond.wait_for(lambda: results, timeout)
  if after_first is not None:
    after_first()
  with cond:
    assert cond.wait_for(lambda: len(results) == len(requests), timeout), len(results)
  return [results[i] for i in range(len(requests))]


def _same(a, b):
  for x, y in zip(a, b):
    assert x.error is None and y.error is None, (x.error, y.error)
    assert [c.tokens for c in x.candidates] == [c.tokens for c in y.candidates]
    for cx, cy in zip(x.candidates, y.candidates):
      np.testing.assert_allclose(cx.logprobs, cy.logprobs, rtol=1e-5, atol=1e-6)
      assert cx.finish_reason == cy.finish_reason and cx.versions == cy.versions


@pytest.fixture(scope="module")
def local():
  model = Decoder(CFG, rngs=nnx.Rngs(0))
  engine = Engine(model, **SIZES).start()
  yield model, engine
  engine.stop()


def test_a_remote_engine_samples_what_the_engine_samples_and_takes_new_weights(local):
  model, engine = local
  want = _run(engine, _requests())
  remote = RemoteEngine(model, **SIZES).start()
  try:
    _same(_run(remote, _requests()), want)
    # Weights over the socket: version 1 is another model's, sampled as that model's engine.
    other = Decoder(CFG, rngs=nnx.Rngs(1))
    remote.publish(nnx.state(other.for_sampling()), 1)
    fresh = Engine(other, version=1, **SIZES)
    _same(_run(remote, _requests(3)), fresh.generate(_requests(3)))
  finally:
    remote.stop()


def test_a_killed_engine_process_loses_no_request_and_returns_none_in_part(local):
  """SIGKILL once the first request is answered: every request is answered once, whole,
  with the tokens the engine samples for it (the same seeds and rows again)."""
  model, engine = local
  want = _run(engine, _requests(8, 96))
  remote = RemoteEngine(model, **SIZES).start()
  try:
    first = remote.pid
    got = _run(remote, _requests(8, 96), after_first=remote.kill)
    deadline = time.time() + 120  # a kill after the last answer is seen a moment later
    while remote.restarts == 0 and time.time() < deadline:
      time.sleep(0.1)
    assert remote.restarts == 1 and remote.pid != first
    _same(got, want)
  finally:
    remote.stop()
  assert remote.stats["busy_seconds"] > 0


def test_a_remote_engine_refuses_what_it_cannot_carry(local):
  model, _ = local
  remote = RemoteEngine(model, **SIZES)  # not started: submit checks first
  with pytest.raises(ValueError, match="plain requests"):
    remote.submit(Request([1, 2], 4, on_token=lambda *a: None))


@pytest.mark.slow
def test_partial_rollouts_on_an_engine_process_killed_mid_run(tmp_path):
  """rl.rollouts=partial with rl.engine_processes=1, 4 steps; the engine's process is
  killed (SIGKILL) once the first step is logged. The run trains every step on whole
  groups (32 rows a step, each within the staleness bound), logs the restart, and its
  losses are finite."""
  import multiprocessing
  import os

  import tiny_runs
  from rlcode.train import grpo_loop

  metrics = tmp_path / "run" / "metrics.jsonl"
  killed = []

  def killer():
    deadline = time.time() + 600
    while time.time() < deadline and not killed:
      services = [p for p in multiprocessing.active_children()
                  if p.name == "rlcode-engine-service"]
      if services and metrics.exists() and '"loss"' in metrics.read_text():
        os.kill(services[0].pid, 9)
        killed.append(services[0].pid)
      time.sleep(0.05)
  thread = threading.Thread(target=killer, daemon=True)
  thread.start()
  rows = tiny_runs.steps(grpo_loop.train(tiny_runs.config(
      tmp_path / "run", "--config.rl.max_staleness=1", "--config.rl.rollouts=partial",
      "--config.rl.engine_processes=1", "--config.train.steps=4",
      "--config.train.checkpoint_every=4")))
  thread.join(1)
  assert killed and len(rows) == 4
  for r in rows:
    assert r["staleness/0"] + r["staleness/1"] == 32 and np.isfinite(r["loss"])
  assert rows[-1]["engine_restarts"] == 1 and rows[0]["engine_restarts"] == 0


def test_a_request_the_engine_refuses_fails_alone_and_a_wrong_model_is_lost(local):
  """A request the engine's checks refuse is refused at submit; weights of another shape
  make the process say so, and every request is then told (no endless restarts)."""
  model, _ = local
  remote = RemoteEngine(model, **SIZES).start()
  try:
    with pytest.raises(ValueError, match="the model's context is 256"):
      remote.submit(Request(list(range(1, 300)), 4))
    wrong = Decoder(ModelConfig(**{**CFG.__dict__, "hidden_size": 16}), rngs=nnx.Rngs(0))
    remote.publish(nnx.state(wrong.for_sampling()), 1)
    # The process reads the weights before these: each is told (at submit, or when the
    # process says it cannot run them), none answered.
    told, cond = [], threading.Condition()

    def tell(error):
      with cond:
        told.append(error)
        cond.notify_all()
    for r in _requests(3):
      try:
        remote.submit(Request(**{**r.__dict__, "on_done": lambda res: tell(res.error)}))
      except EngineLost as e:
        tell(e)
    with cond:
      assert cond.wait_for(lambda: len(told) == 3, 120)
    assert all(isinstance(e, EngineLost) and "do not match" in str(e) for e in told), told
    with pytest.raises(EngineLost):
      remote.submit(_requests(1)[0])
    assert remote.restarts == 1
  finally:
    remote.stop()
