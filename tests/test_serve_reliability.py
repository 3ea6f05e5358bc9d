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


def _chat(**fields):
  return {"model": serving.MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}


def _tools(function):
  return [{"type": "function", "function": function}]


def _nested(depth):
  """A JSON schema `depth` objects deep, each property "p" the next, as JSON text (the
  test's own json.dumps stops near 1000 levels), spliced in by `_encoded`."""
  return RAW + '{"p": ' * (depth - 1) + '{"type": "string"}' + "}" * (depth - 1)


RAW = "\x00raw:"


def _encoded(body) -> bytes:
  """The body as JSON text, each string `_nested` made written as the JSON it holds."""
  raws = []

  def placeholder(value):
    if isinstance(value, str) and value.startswith(RAW):
      raws.append(value[len(RAW):])
      return f"{RAW}{len(raws) - 1}"
    if isinstance(value, dict):
      return {k: placeholder(v) for k, v in value.items()}
    if isinstance(value, list):
      return [placeholder(v) for v in value]
    return value
  text = json.dumps(placeholder(body))
  for i, raw in enumerate(raws):
    text = text.replace(json.dumps(f"{RAW}{i}"), raw)
  return text.encode()


# The first object past the 64 levels the server reads: the body, tools, tools.0, function
# and parameters are 5, the parameters' "p" chain the rest.
DEEP = "tools.0.function.parameters" + ".p" * 60


# Bodies that name the field at fault: (path, body, the error's param). Sent as JSON text
# with \u escapes, as any client may write a lone surrogate.
NAMED = {
    # Lone surrogates: no tokenizer can encode them.
    "surrogate in a prompt": ("/v1/completions", {"model": serving.MODEL, "prompt": "a\ud800"},
                              "prompt"),
    "surrogate in a list of prompts": ("/v1/completions", {"model": serving.MODEL,
                                                           "prompt": ["ok", "\udfff"]},
                                       "prompt.1"),
    "surrogate in a pair of prompts": ("/v1/completions", {"model": serving.MODEL,
                                                           "prompt": ["\ud800", "\udc00x"]},
                                       "prompt.0"),
    "surrogate in a message": ("/v1/chat/completions", _chat(messages=[
        {"role": "user", "content": "\ud83d"}]), "messages.0.content"),
    "surrogate in a content part": ("/v1/chat/completions", _chat(messages=[
        {"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]),
        "messages.0.content.0.text"),
    "surrogate in a tool's name": ("/v1/chat/completions", _chat(tools=_tools(
        {"name": "\ud800"})), "tools.0.function.name"),
    "surrogate in a stop string": ("/v1/completions", {"model": serving.MODEL, "prompt": "x",
                                                       "stop": ["\ud800"]}, "stop.0"),
    "surrogate in a field's name": ("/v1/completions", {"model": serving.MODEL, "prompt": "x",
                                                        "\ud800": 1}, "\\ud800"),
    "surrogate in feedback text": ("/v1/feedback", {"id": "x", "final_text": "\ud800"},
                                   "final_text"),
    # Tools that are not OpenAI's shape.
    "tool function 5": ("/v1/chat/completions", _chat(tools=_tools(5)), "tools.0.function"),
    "tool function null": ("/v1/chat/completions", _chat(tools=_tools(None)),
                           "tools.0.function"),
    "tool function [1]": ("/v1/chat/completions", _chat(tools=_tools([1])), "tools.0.function"),
    "tool function a string": ("/v1/chat/completions", _chat(tools=_tools("f")),
                               "tools.0.function"),
    "tool name 5": ("/v1/chat/completions", _chat(tools=_tools({"name": 5})),
                    "tools.0.function.name"),
    "tool name a list": ("/v1/chat/completions", _chat(tools=_tools({"name": ["x"]})),
                         "tools.0.function.name"),
    "tool name with a space": ("/v1/chat/completions", _chat(tools=_tools({"name": "a b"})),
                               "tools.0.function.name"),
    "tool of another type": ("/v1/chat/completions", _chat(tools=[
        {"type": "code_interpreter", "function": {"name": "f"}}]), "tools.0.type"),
    "strict tool": ("/v1/chat/completions", _chat(tools=_tools({"name": "f", "strict": True})),
                    "tools.0.function.strict"),
    # Fields this server cannot honour, at a value that asks for something.
    # Constrained decoding asked for what cannot be.
    "tool_choice required without tools": ("/v1/chat/completions",
                                           _chat(tool_choice="required"), "tool_choice"),
    "tool_choice a function not in tools": ("/v1/chat/completions", _chat(
        tools=serving.TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
        "tool_choice.function.name"),
    "tool_choice of another type": ("/v1/chat/completions", _chat(
        tools=serving.TOOLS, tool_choice={"type": "file", "function": {"name": "x"}}),
        "tool_choice"),
    "response_format xml": ("/v1/chat/completions", _chat(response_format={"type": "xml"}),
                            "response_format.type"),
    "response_format json_schema without one": ("/v1/chat/completions", _chat(
        response_format={"type": "json_schema"}), "response_format"),
    "response_format json_schema that does not compile": ("/v1/chat/completions", _chat(
        response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#/no"}}}}}),
        "response_format.json_schema.schema"),
    "response_format json beside a forced call": ("/v1/chat/completions", _chat(
        tools=serving.TOOLS, tool_choice="required", response_format={"type": "json_object"}),
        "response_format"),
    "logit_bias": ("/v1/chat/completions", _chat(logit_bias={"65": 100}), "logit_bias"),
    "presence_penalty": ("/v1/chat/completions", _chat(presence_penalty=0.5),
                         "presence_penalty"),
    "frequency_penalty": ("/v1/completions", {"model": serving.MODEL, "prompt": "x",
                                              "frequency_penalty": -1}, "frequency_penalty"),
    "penalty given as false": ("/v1/completions", {"model": serving.MODEL, "prompt": "x",
                                                   "frequency_penalty": False},
                               "frequency_penalty"),
    "parallel_tool_calls false with auto": ("/v1/chat/completions", _chat(
        tools=serving.TOOLS, parallel_tool_calls=False), "parallel_tool_calls"),
    "audio": ("/v1/chat/completions", _chat(audio={"voice": "alloy", "format": "wav"}),
              "audio"),
    "modalities audio": ("/v1/chat/completions", _chat(modalities=["text", "audio"]),
                         "modalities"),
    "prediction": ("/v1/chat/completions", _chat(prediction={"type": "content", "content": "x"}),
                   "prediction"),
    "reasoning_effort": ("/v1/chat/completions", _chat(reasoning_effort="high"),
                         "reasoning_effort"),
    "web_search_options": ("/v1/chat/completions", _chat(web_search_options={}),
                           "web_search_options"),
    "functions": ("/v1/chat/completions", _chat(functions=[{"name": "f"}]), "functions"),
    "function_call": ("/v1/chat/completions", _chat(function_call="auto"), "function_call"),
    "service_tier flex": ("/v1/chat/completions", _chat(service_tier="flex"), "service_tier"),
    "store false": ("/v1/chat/completions", _chat(store=False), "store"),
    "echo": ("/v1/completions", {"model": serving.MODEL, "prompt": "x", "echo": True}, "echo"),
    "suffix": ("/v1/completions", {"model": serving.MODEL, "prompt": "x", "suffix": "}"},
               "suffix"),
    "best_of above n": ("/v1/completions", {"model": serving.MODEL, "prompt": "x",
                                            "best_of": 3}, "best_of"),
    # Contradictions and fields no endpoint has.
    "stream_options without stream": ("/v1/completions", {
        "model": serving.MODEL, "prompt": "x", "stream_options": {"include_usage": True}},
        "stream_options"),
    "unknown stream option": ("/v1/completions", {
        "model": serving.MODEL, "prompt": "x", "stream": True,
        "stream_options": {"include_usage": True, "evil": 1}}, "stream_options.evil"),
    "max_tokens and max_completion_tokens disagree": ("/v1/chat/completions", _chat(
        max_tokens=4, max_completion_tokens=5), "max_completion_tokens"),
    "top_logprobs without logprobs": ("/v1/chat/completions", _chat(top_logprobs=2),
                                      "top_logprobs"),
    "metadata not strings": ("/v1/chat/completions", _chat(metadata={"k": 1}), "metadata.k"),
    "unknown completions field": ("/v1/completions", {"model": serving.MODEL, "prompt": "x",
                                                      "temprature": 0}, "temprature"),
    "unknown chat field": ("/v1/chat/completions", _chat(top_k=5), "top_k"),
    # Nesting past 64 arrays and objects (the template's tojson ran out of stack near 950).
    "tools nested 900 deep": ("/v1/chat/completions", _chat(tools=_tools(
        {"name": "f", "parameters": _nested(900)})), DEEP),
    "tools nested 65 deep": ("/v1/chat/completions", _chat(tools=_tools(
        {"name": "f", "parameters": _nested(61)})), DEEP),
    "a prompt list nested 900 deep": ("/v1/completions", {
        "model": serving.MODEL, "prompt": RAW + "[" * 900 + "]" * 900},
        "prompt" + ".0" * 63),
    "feedback nested 200 deep": ("/v1/feedback", {"id": "x", "final_text": _nested(200)},
                                 "final_text" + ".p" * 63),
    "tool call arguments nested 900 deep": ("/v1/chat/completions", _chat(messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {
                "name": "f", "arguments": "[" * 900 + "]" * 900}}]}]),
        "messages.1.tool_calls.0.function.arguments" + ".0" * 64),
    "tool call arguments not JSON": ("/v1/chat/completions", _chat(messages=[
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{"}}]}]),
        "messages.0.tool_calls.0.function.arguments"),
    # Lists of prompts past what one request may ask.
    "too many prompts": ("/v1/completions", {"model": serving.MODEL, "prompt": ["x"] * 17},
                         "prompt"),
    "prompts times n past max_n": ("/v1/completions", {"model": serving.MODEL,
                                                       "prompt": ["x", "y", "z"], "n": 3}, "n"),
    "an empty prompt in a list": ("/v1/completions", {"model": serving.MODEL,
                                                      "prompt": [[5, 6], []]}, "prompt"),
    "a token id past the vocabulary in a list": ("/v1/completions", {
        "model": serving.MODEL, "prompt": [[5], [10**6]]}, "prompt.1"),
    "mixed prompt list": ("/v1/completions", {"model": serving.MODEL, "prompt": ["x", [1]]},
                          "prompt"),
}


@pytest.mark.parametrize("case", sorted(NAMED))
def test_each_bad_field_is_a_400_naming_it(server, case):
  path, body, param = NAMED[case]
  with server.client() as c:
    r = c.post(path, content=_encoded(body),
               headers={"content-type": "application/json"})
  assert r.status_code == 400, r.text
  error = r.json()["error"]
  assert error["param"] == param and error["message"].startswith(param + ": "), error
  assert error["type"] == "invalid_request_error" and error["code"], error


def test_an_unknown_model_id_is_a_404(server):
  with server.client() as c:
    r = c.get("/v1/models/gpt-9")
  assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text


def test_refusals_leave_no_traceback(server):
  """Every refusal above is answered without a logged error (a 500 logs its traceback),
  and the server answers after them."""
  with server.client() as c:
    for path, body, _ in NAMED.values():
      c.post(path, content=_encoded(body),
             headers={"content-type": "application/json"})
    assert c.get("/metrics").json().get("errors_500", 0) == 0
  assert "Traceback" not in "".join(server.output)
  _ok(server)


def test_tools_nested_64_deep_are_served(server):
  """The positive control of the depth refusals: one level less is an answer."""
  with server.client() as c:
    r = c.post("/v1/chat/completions", content=_encoded(_chat(
        max_tokens=2, tools=_tools({"name": "f", "parameters": _nested(60)}))),
        headers={"content-type": "application/json"})
  assert r.status_code == 200, r.text


@pytest.mark.parametrize("source,said", [
    ("{{ raise_exception('no system turns') }}", "refused the messages: no system turns"),
    ("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", "recursed too deep")])
def test_a_template_that_refuses_or_recurses_is_a_400_naming_messages(source, said):
  """In process, no engine: the chat route renders before it samples."""
  import types

  from starlette.testclient import TestClient

  from rlcode.models import chat_template
  from rlcode.serve import app as app_lib
  served = app_lib.Served(
      engine=None, tokenizer=None, template=chat_template.ChatTemplate({"default": source}, {}),
      name=serving.MODEL, log=None, serve=types.SimpleNamespace(max_body_bytes=65536))
  client = TestClient(app_lib.create_app(served), raise_server_exceptions=False)
  r = client.post("/v1/chat/completions", json=_chat())
  assert r.status_code == 400, r.text
  error = r.json()["error"]
  assert error["param"] == "messages" and error["code"] == "template_refused", error
  assert error["message"].startswith("messages: ") and said in error["message"], error


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
