"""`rlcode serve` under hostile input, load and signals.

Every bad request is a 4xx with an OpenAI error object and leaves the server answering;
64 concurrent clients on loopback all get their answers; SIGKILL under load loses no
feedback that was acknowledged and tears no row; SIGTERM lets the requests in flight finish.
"""

import asyncio
import concurrent.futures
import json
import signal
import threading
import time

import httpx
import pytest

import serving
from rlcode.serve import log as log_lib

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
  with serving.running(str(tmp_path_factory.mktemp("reliable")), "--config.serve.slots=16",
                       "--config.serve.max_body_bytes=65536") as s:
    yield s


def _ok(server):
  with server.client() as c:
    r = c.post("/v1/completions", json={"model": serving.MODEL, "prompt": "ok", "max_tokens": 3})
  assert r.status_code == 200, r.text


BAD = {
    "malformed JSON": (b'{"model": "rlcode-tiny", "prompt": ', 400, "invalid_json"),
    "not an object": (b"[1, 2, 3]", 400, "invalid_value"),
    "unknown model": ({"model": "gpt-9", "prompt": "x"}, 404, "model_not_found"),
    "prompt too long": ({"model": serving.MODEL, "prompt": "x" * 300}, 400,
                        "context_length_exceeded"),
    "prompt and budget too long": ({"model": serving.MODEL, "prompt": "x" * 200,
                                    "max_tokens": 100}, 400, "context_length_exceeded"),
    "max_tokens zero": ({"model": serving.MODEL, "prompt": "x", "max_tokens": 0}, 400,
                        "invalid_value"),
    "max_tokens huge": ({"model": serving.MODEL, "prompt": "x", "max_tokens": 10**9}, 400,
                        "invalid_value"),
    "negative temperature": ({"model": serving.MODEL, "prompt": "x", "temperature": -1}, 400,
                             "invalid_value"),
    "n too large": ({"model": serving.MODEL, "prompt": "x", "n": 1000}, 400, "invalid_value"),
    "token id out of range": ({"model": serving.MODEL, "prompt": [1, 99999]}, 400,
                              "invalid_value"),
    "empty prompt": ({"model": serving.MODEL, "prompt": ""}, 400, "invalid_value"),
    "wrong type": ({"model": serving.MODEL, "prompt": {"a": 1}}, 400, "invalid_value"),
    "oversized body": ({"model": serving.MODEL, "prompt": "x" * 100_000}, 413, "body_too_large"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_requests_get_a_4xx_error_object(server, case):
  body, status, code = BAD[case]
  with server.client() as c:
    if isinstance(body, bytes):
      r = c.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    else:
      r = c.post("/v1/completions", json=body)
  assert r.status_code == status, r.text
  error = r.json()["error"]
  assert error["code"] == code and error["message"] and error["type"]
  _ok(server)


def test_bad_chat_and_feedback(server):
  with server.client() as c:
    cases = [
        ("/v1/chat/completions", {"model": serving.MODEL, "messages": []}, 400),
        ("/v1/chat/completions", {"model": serving.MODEL, "messages": [{"role": "wizard"}]}, 400),
        ("/v1/chat/completions", {"model": serving.MODEL, "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]}, 400),
        ("/v1/feedback", {"id": "cmpl-nothing", "accepted": True}, 404),
        ("/v1/feedback", {"id": "x"}, 400),
        ("/v1/feedback", {"id": "x", "kept": 1.5}, 400),
        ("/v1/feedback", {"id": "x", "accepted": True, "evil": 1}, 400),
        ("/v1/nothing", {}, 404),
    ]
    for path, body, status in cases:
      r = c.post(path, json=body)
      assert r.status_code == status, (path, body, r.text)
      assert "message" in r.json()["error"]
  _ok(server)


def test_the_api_key_is_required(server):
  for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": serving.KEY}):
    r = httpx.post(server.url + "/v1/completions", headers=headers, timeout=60,
                   json={"model": serving.MODEL, "prompt": "x"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
  assert httpx.get(server.url + "/v1/models", timeout=60).status_code == 401
  assert httpx.get(server.url + "/health", timeout=60).status_code == 200
  _ok(server)


def test_64_concurrent_clients(server):
  async def one(client, i):
    r = await client.post("/v1/completions", json={
        "model": serving.MODEL, "prompt": "#" * (1 + i % 40), "max_tokens": 4 + i % 12,
        "temperature": 1.0, "seed": i})
    return r.status_code, r.json()

  async def main():
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=120,
                                 limits=limits) as client:
      return await asyncio.wait_for(asyncio.gather(*(one(client, i) for i in range(128))), 180)

  results = asyncio.run(main())
  assert [s for s, _ in results] == [200] * 128
  assert all(len(b["choices"]) == 1 and b["choices"][0]["finish_reason"] for _, b in results)


def _completions(server, count):
  with server.client() as c:
    return [c.post("/v1/completions", json={"model": serving.MODEL, "prompt": f"p{i}",
                                            "max_tokens": 2}).json()["id"]
            for i in range(count)]


def test_sigkill_under_load_keeps_every_acknowledged_feedback(tmp_path):
  workdir = str(tmp_path)
  server = serving.Server(workdir)
  ids = _completions(server, 120)
  acked, lock, stop = [], threading.Lock(), threading.Event()

  def send(chunk):
    with server.client() as c:
      for fid in chunk:
        if stop.is_set():
          return
        try:
          r = c.post("/v1/feedback", json={"id": fid, "accepted": True, "kept": 0.5,
                                           "final_text": "x" * 2000})
        except httpx.HTTPError:
          return  # the server died under us
        if r.status_code == 200:
          with lock:
            acked.append(fid)

  def load():
    with server.client() as c:
      while not stop.is_set():
        try:
          c.post("/v1/completions", json={"model": serving.MODEL, "prompt": "load",
                                          "max_tokens": 8})
        except httpx.HTTPError:
          return

  threads = [threading.Thread(target=send, args=(ids[i::6],)) for i in range(6)]
  threads += [threading.Thread(target=load) for _ in range(2)]
  for t in threads:
    t.start()
  deadline = time.monotonic() + 120
  while len(acked) < 40 and time.monotonic() < deadline and any(t.is_alive() for t in threads):
    time.sleep(0.01)
  server.signal(signal.SIGKILL)
  server.wait()
  stop.set()
  for t in threads:
    t.join(60)
  assert 40 <= len(acked) < len(ids), len(acked)
  restarted = serving.Server(workdir)
  try:
    with restarted.client() as c:
      assert c.get("/health").status_code == 200
  finally:
    restarted.stop()
  store = log_lib.InteractionLog(log_lib.default_url(workdir))
  try:
    rows = store.feedback_after(0, 10_000)
  finally:
    store.close()
  stored = {r["id"]: r for r in rows}
  assert set(acked) <= set(stored), sorted(set(acked) - set(stored))
  for row in rows:  # whole rows: every field as sent, the body parses
    assert row["accepted"] is True and row["kept"] == 0.5 and row["final_text"] == "x" * 2000
    assert json.loads(row["body"])["id"] == row["id"]
    assert len(row["candidates"]) == 1 and row["candidates"][0]["tokens"]


def _wait_for_busy_slots(client, n, seconds=60.0):
  """Polls /metrics until n decode slots are busy (or `seconds` pass)."""
  deadline = time.monotonic() + seconds
  while client.get("/metrics").json()["busy_slots"] < n and time.monotonic() < deadline:
    time.sleep(0.01)


def test_sigterm_drains_requests_in_flight(tmp_path):
  server = serving.Server(str(tmp_path))
  results = {}

  def long_request(i):
    with server.client() as c:
      r = c.post("/v1/completions", json={"model": serving.MODEL, "prompt": "slow",
                                          "max_tokens": 200, "temperature": 0})
    results[i] = (r.status_code, r.json())

  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    futures = [pool.submit(long_request, i) for i in range(4)]
    with server.client() as c:
      _wait_for_busy_slots(c, 4)
    server.signal(signal.SIGTERM)
    for f in futures:
      f.result(timeout=120)
  # uvicorn re-raises the signal once it has drained, so the exit is SIGTERM's own.
  assert server.wait(120) in (0, -signal.SIGTERM)
  assert "Traceback" not in "".join(server.output)
  for status, body in results.values():
    assert status == 200
    assert body["usage"]["completion_tokens"] >= 1 and body["choices"][0]["finish_reason"]
  with pytest.raises(httpx.ConnectError):
    httpx.get(server.url + "/health", timeout=5)


def test_new_weights_swap_in_under_load_without_dropping_requests(server):
  """A version published while requests decode: every request completes, later responses
  carry the new version, and greedy output is then the new weights' own."""
  from flax import nnx

  from rlcode.models.build import build_model
  from rlcode.parallel import sharding
  from rlcode.sampling import generate
  from rlcode.serve import weights
  config = serving.config(server.workdir, "--config.seed=5")
  model, tokenizer = build_model(config.model, sharding.make_mesh(), 5)
  _, params = nnx.split(model, nnx.Param)
  statuses, versions = [], []

  def ask(i):
    with server.client() as c:
      r = c.post("/v1/completions", json={"model": serving.MODEL, "prompt": "w" * (1 + i),
                                          "max_tokens": 120, "temperature": 1.0, "seed": i})
    statuses.append(r.status_code)
    versions.append(r.json().get("policy_version"))

  with concurrent.futures.ThreadPoolExecutor(12) as pool:
    futures = [pool.submit(ask, i) for i in range(12)]
    with server.client() as c:
      _wait_for_busy_slots(c, 6)
      weights.publish(f"{server.workdir}/published", 7, params)
      deadline = time.monotonic() + 60
      while c.get("/health").json()["policy_version"] != 7 and time.monotonic() < deadline:
        time.sleep(0.01)
    for f in futures:
      f.result(timeout=300)
  assert statuses == [200] * 12
  ids = tokenizer.encode("def swapped():\n")
  with server.client() as c:
    r = c.post("/v1/completions", json={"model": serving.MODEL, "prompt": ids,
                                        "max_tokens": 16, "temperature": 0}).json()
  assert r["policy_version"] == 7
  want = generate(model, [ids], max_new_tokens=16, temperature=0.0,
                  stop_tokens=tokenizer.eos_ids, pad_id=tokenizer.pad_id).completions()[0]
  assert r["choices"][0]["text"] == tokenizer.decode([t for t in want
                                                      if t not in tokenizer.eos_ids])
  _ok(server)
