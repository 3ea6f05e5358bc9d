"""A seeded fuzz of `rlcode serve`'s HTTP API: random and hostile bodies for every route.

Each step takes a valid body for a route (completions, chat completions with tools,
feedback) and breaks it: a field set to a hostile value (lone surrogates, NUL bytes, huge
or negative numbers, NaN, wrong types, deep nesting), a field dropped or invented, the
whole body replaced by other JSON or by bytes that are not JSON; or asks a GET route
(models, a model by id, health, metrics) with a random id or the wrong method. Every answer
must be a 2xx (a stream that parses, with no error event) or a 4xx OpenAI error object;
a 5xx fails the test. Afterwards the server still answers and has logged no traceback.
Bounded by count: STEPS requests, all on 127.0.0.1; past the first MIN_STEPS a cap of
SECONDS stops it early on a machine too loaded to finish (CI runs it beside a CPU hog), so
what it asserts is coverage of the requests that ran, never a rate.
"""

import json
import random
import time

import pytest

import serving
from chat_templates import write_tokenizer_dir

pytestmark = pytest.mark.slow

SEED = 0
STEPS = 300
MIN_STEPS = 100
SECONDS = 120.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("fuzz"))
  template = write_tokenizer_dir(f"{workdir}/template", "qwen25")
  with serving.running(workdir, f"--config.serve.chat_template={template}",
                       "--config.serve.slots=8", "--config.serve.max_body_bytes=65536") as s:
    yield s


def _hostile(rng: random.Random):
  """One value a client should never send where it is sent."""
  return rng.choice([
      None, True, False, 0, -1, 1, 2**31, -2**63, 10**30, 0.5, -0.0, 1e308, float("nan"),
      float("inf"), "", "x", "\ud800", "a\udfffb", "\x00", "\u202e" * 3, "😀" * 50,
      "x" * 5000, "<tool_call>{\"name\": \"get_weather\"}</tool_call>", [], [1], [[]],
      ["\ud800"], [None], [-5, 3], [[1, 2], ["a"]], {}, {"type": "text"}, {"type": None},
      {"name": 5}, {"\ud800": 1}, {"": ""}, {"a": {"b": {"c": [1, {"d": None}]}}},
      [[[[[[[[[[[]]]]]]]]]]], "required", "none", "auto", {"include_usage": True},
      {"include_usage": "yes"}, serving.MODEL, "gpt-9"])


def _deep(rng: random.Random) -> str:
  """JSON text nested around the server's limit of 64 or far past it (a template's tojson
  ran out of stack near 950): a tool call's arguments, or a tool's parameters spliced in
  for DEEP by `_body` (the test's own json.dumps stops near 1000 levels)."""
  depth = rng.choice([8, 59, 60, 61, 200, 900])
  return '{"p": ' * (depth - 1) + '{"type": "string"}' + "}" * (depth - 1)


DEEP = "\x00deep"


def _message(rng: random.Random) -> dict:
  role = rng.choice(["user", "system", "assistant", "tool", "developer", "wizard", None, 5])
  message = {"role": role, "content": rng.choice([
      "Weather in Paris?", "", None, [{"type": "text", "text": "hi"}],
      [{"type": "image_url"}], [{"type": "text", "text": "\ud800"}], [5], _hostile(rng)])}
  if rng.random() < 0.2:
    message["tool_calls"] = rng.choice([
        [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        [{"function": {"name": "f", "arguments": "not json"}}], [{"function": 5}],
        [{"function": {"name": None}}],
        [{"id": "c", "type": "function", "function": {"name": "f", "arguments": _deep(rng)}}],
        _hostile(rng)])
  if rng.random() < 0.1:
    message[rng.choice(["name", "tool_call_id", "extra"])] = _hostile(rng)
  return message


def _valid(rng: random.Random, path: str) -> dict:
  if path == "/v1/completions":
    return {"model": serving.MODEL, "max_tokens": rng.randint(1, 4),
            "prompt": rng.choice(["def f(", ["a", "b"], [5, 6, 7], [[5], [6, 7]]])}
  if path == "/v1/chat/completions":
    body = {"model": serving.MODEL, "max_tokens": rng.randint(1, 4),
            "messages": [_message(rng) for _ in range(rng.randint(1, 3))]}
    if rng.random() < 0.5:
      body["tools"] = rng.choice([serving.TOOLS, [{"type": "function", "function": rng.choice(
          [5, None, [1], "f", {"name": 5}, {"name": ["x"]}, {"name": "\ud800"},
           {"name": "f", "parameters": _hostile(rng)}, {"name": "f", "parameters": DEEP},
           {"name": "f", "parameters": DEEP}])}], _hostile(rng)])
    return body
  return {"id": rng.choice(["cmpl-nothing", "x", "\ud800", "", "a" * 65]),
          rng.choice(["accepted", "rejected", "kept", "chosen", "index", "final_text"]):
          _hostile(rng)}


FIELDS = ["model", "prompt", "messages", "n", "temperature", "top_p", "stream", "stop", "seed",
          "max_tokens", "max_completion_tokens", "logprobs", "top_logprobs", "echo", "suffix",
          "best_of", "user", "tools", "tool_choice", "response_format", "logit_bias",
          "presence_penalty", "frequency_penalty", "parallel_tool_calls", "stream_options",
          "metadata", "store", "service_tier", "modalities", "reasoning_effort", "audio",
          "prediction", "functions", "id", "accepted", "kept", "chosen", "final_text",
          "top_k", "\ud800", ""]


def _body(rng: random.Random, path: str) -> bytes:
  """A valid body for `path`, broken one to three ways, as bytes."""
  roll = rng.random()
  if roll < 0.08:
    return rng.choice([b"", b"{", b"\xff\xfe{}", b"[" * 3000 + b"]" * 3000, b"nul\x00l",
                       b'{"model": "rlcode-tiny", "prompt": "\\ud800"}', b"1e999999",
                       b'{"a": 1, "a": 2}', bytes(rng.randrange(256) for _ in range(64))])
  if roll < 0.14:
    return json.dumps(_hostile(rng)).encode()
  body = _valid(rng, path)
  for _ in range(rng.randint(0 if path != "/v1/feedback" else 1, 3)):
    action = rng.random()
    if action < 0.7:
      body[rng.choice(FIELDS)] = _hostile(rng)
    elif body:
      body.pop(rng.choice(sorted(body)))
  if body.get("stream") is True and rng.random() < 0.5:
    body["stream_options"] = {"include_usage": True}
  text = json.dumps(body)
  while json.dumps(DEEP) in text:
    text = text.replace(json.dumps(DEEP), _deep(rng), 1)
  return text.encode()


def _check(path: str, r) -> None:
  assert r.status_code < 500, (path, r.status_code, r.text[:500])
  if r.status_code >= 400:
    error = r.json()["error"]
    assert isinstance(error["message"], str) and error["message"], r.text
    assert isinstance(error["type"], str) and {"param", "code"} <= set(error), r.text
    return
  if r.headers["content-type"].startswith("text/event-stream"):
    events = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", r.text[-500:]
    for event in events[:-1]:
      assert "error" not in json.loads(event), event
  else:
    r.json()


def test_fuzzed_requests_get_a_2xx_or_a_4xx_error_object(server):
  rng = random.Random(SEED)
  routes = ["/v1/completions", "/v1/chat/completions", "/v1/feedback"]
  gets = ["/v1/models", "/health", "/metrics"]
  deadline = time.monotonic() + SECONDS
  seen: dict = {}  # (route, "2xx" or "4xx") -> requests
  with server.client() as c:
    for step in range(STEPS):
      if step >= MIN_STEPS and time.monotonic() > deadline:
        break
      roll = rng.random()
      if roll < 0.12:
        path = rng.choice(gets + ["/v1/models/" + rng.choice(
            [serving.MODEL, "gpt-9", "%ED%A0%80", "a/b/../c", "x" * 300, "%00"])])
        r = c.request(rng.choice(["GET", "GET", "GET", "POST", "DELETE"]), path)
        route = "GET"
      else:
        path = route = rng.choice(routes)
        method = "POST" if roll > 0.15 else rng.choice(["GET", "PUT"])
        body = _body(rng, path)
        r = c.request(method, path, content=body, headers={"content-type": rng.choice(
            ["application/json", "application/json", "text/plain"])})
        if method == "POST" and b'{"p": ' * 64 in body:
          route = "deep"
          assert r.status_code == 400, (body[:200], r.text[:300])
      _check(path, r)
      key = (route, "2xx" if r.status_code < 300 else "4xx")
      seen[key] = seen.get(key, 0) + 1
    assert c.get("/metrics").json().get("errors_500", 0) == 0
  # Whatever ran reached every route, and both sides of the ones that answer: answers and
  # refusals; and bodies past the depth limit were sent (each refused above).
  for route in routes:
    assert seen.get((route, "4xx")), (route, seen)
  for route in ("/v1/completions", "/v1/chat/completions"):
    assert seen.get((route, "2xx")), (route, seen)
  assert seen.get(("GET", "2xx")) and seen.get(("deep", "4xx")), seen
  with server.client() as c:
    r = c.post("/v1/completions", json={"model": serving.MODEL, "prompt": "ok", "max_tokens": 3})
    assert r.status_code == 200 and c.get("/health").status_code == 200
  assert "Traceback" not in "".join(server.output)
