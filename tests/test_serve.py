"""`rlcode serve` over real HTTP: the openai client and httpx against a server on 127.0.0.1.

One server for the module (a tiny policy taught one tool call, a ChatML template): greedy
output equals `sampling.generate`, chat goes through the template and parses the call,
streaming gives the same text, n candidates and seeds, concurrent requests of different
lengths interleave and each still equals its own generate, the log holds what was served.
"""

import concurrent.futures
import json
import os

import pytest

import serving
from rlcode.models import chat_template
from rlcode.sampling import generate
from rlcode.serve import log as log_lib

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("serve"))
  model, tokenizer, template_dir = serving.taught_policy(workdir)
  with serving.running(workdir, f"--config.serve.chat_template={template_dir}",
                       "--config.serve.slots=8") as server:
    yield server, model, tokenizer, template_dir


def _greedy(model, tokenizer, prompt_ids, max_tokens):
  out = generate(model, [prompt_ids], max_new_tokens=max_tokens, temperature=0.0,
                 stop_tokens=tokenizer.eos_ids, pad_id=tokenizer.pad_id)
  return out.completions()[0]


def test_health_and_models(setup):
  server, *_ = setup
  with server.client() as c:
    assert c.get("/health").json() == {"status": "ok", "policy_version": 1}
  models = server.openai().models.list()
  assert [m.id for m in models.data] == [serving.MODEL]


@pytest.mark.parametrize("prompt", ["def add(a, b):\n", "x"])
def test_greedy_completion_equals_generate(setup, prompt):
  server, model, tokenizer, _ = setup
  ids = tokenizer.encode(prompt)
  want = _greedy(model, tokenizer, ids, 24)
  with server.client() as c:
    r = c.post("/v1/completions", json={"model": serving.MODEL, "prompt": ids, "max_tokens": 24,
                                        "temperature": 0, "logprobs": 1})
  assert r.status_code == 200, r.text
  choice = r.json()["choices"][0]
  assert choice["text"] == tokenizer.decode([t for t in want if t not in tokenizer.eos_ids])
  assert len(choice["logprobs"]["token_logprobs"]) == len(want)
  text = server.openai().completions.create(model=serving.MODEL, prompt=prompt, max_tokens=24,
                                            temperature=0)
  assert text.choices[0].text == choice["text"]
  assert text.model_extra["policy_version"] == 1


def test_chat_through_the_template_with_a_tool_call(setup):
  server, model, tokenizer, template_dir = setup
  reply = server.openai().chat.completions.create(
      model=serving.MODEL, messages=serving.ASK, tools=serving.TOOLS, temperature=0,
      max_tokens=100)
  template = chat_template.load_chat_template(template_dir)
  prompt = chat_template.encode(tokenizer, template.render(serving.ASK, add_generation_prompt=True))
  assert reply.usage.prompt_tokens == len(prompt)
  choice = reply.choices[0]
  assert choice.finish_reason == "tool_calls"
  (call,) = choice.message.tool_calls
  assert call.function.name == "get_weather"
  assert json.loads(call.function.arguments) == {"city": "Paris"}
  assert choice.message.content is None
  # Without tools the same turn is plain content, exactly the greedy sample.
  plain = server.openai().chat.completions.create(
      model=serving.MODEL, messages=serving.ASK, temperature=0, max_tokens=100)
  want = _greedy(model, tokenizer, prompt, 100)
  assert plain.choices[0].message.content == tokenizer.decode(
      [t for t in want if t not in tokenizer.eos_ids])
  assert serving.CALL in plain.choices[0].message.content


def test_streaming_gives_the_same_text(setup):
  server, *_ = setup
  client = server.openai()
  whole = client.completions.create(model=serving.MODEL, prompt="def f(x):", max_tokens=20,
                                    temperature=0).choices[0].text
  pieces = [e.choices[0].text for e in client.completions.create(
      model=serving.MODEL, prompt="def f(x):", max_tokens=20, temperature=0, stream=True)]
  assert len(pieces) > 2 and "".join(pieces) == whole
  calls, reasons = [], []
  for event in client.chat.completions.create(model=serving.MODEL, messages=serving.ASK,
                                              tools=serving.TOOLS, temperature=0,
                                              max_tokens=100, stream=True):
    delta = event.choices[0].delta
    calls += delta.tool_calls or []
    reasons.append(event.choices[0].finish_reason)
  assert [c.function.name for c in calls] == ["get_weather"] and reasons[-1] == "tool_calls"


def test_n_candidates_stop_and_seed(setup):
  server, *_ = setup
  client = server.openai()
  ask = dict(model=serving.MODEL, prompt="def g(", max_tokens=16, n=3, temperature=1.0, seed=7)
  first, again = client.completions.create(**ask), client.completions.create(**ask)
  texts = [c.text for c in first.choices]
  assert len(texts) == 3 and len(set(texts)) > 1
  assert texts == [c.text for c in again.choices]
  other = client.completions.create(**{**ask, "seed": 8})
  assert [c.text for c in other.choices] != texts
  cut = client.chat.completions.create(model=serving.MODEL, messages=serving.ASK,
                                       temperature=0, max_tokens=100, stop=["Paris"])
  assert cut.choices[0].message.content == '<tool_call>{"name": "get_weather", "arguments": {"city": "'
  assert cut.choices[0].finish_reason == "stop"


def test_concurrent_requests_interleave_and_stay_correct(setup):
  server, model, tokenizer, _ = setup
  prompts = [tokenizer.encode("#" * (3 + 9 * i)) for i in range(10)]
  budgets = [8 + 5 * (i % 4) for i in range(10)]
  with server.client() as c:
    before = c.get("/metrics").json()

    def ask(i):
      r = c.post("/v1/completions", json={"model": serving.MODEL, "prompt": prompts[i],
                                          "max_tokens": budgets[i], "temperature": 0})
      assert r.status_code == 200, r.text
      return r.json()["choices"][0]["text"]

    with concurrent.futures.ThreadPoolExecutor(10) as pool:
      got = list(pool.map(ask, range(10)))
    after = c.get("/metrics").json()
  for i, text in enumerate(got):
    want = _greedy(model, tokenizer, prompts[i], budgets[i])
    assert text == tokenizer.decode([t for t in want if t not in tokenizer.eos_ids])
  steps = after["engine_steps"] - before["engine_steps"]
  tokens = after["tokens_total"] - before["tokens_total"]
  # One at a time would take a step per token (less each request's first, from prefill).
  assert steps < tokens - 10 and steps < 0.7 * tokens, (steps, tokens)


def test_completions_and_feedback_are_logged(setup):
  server, *_ = setup
  with server.client() as c:
    r = c.post("/v1/completions", json={"model": serving.MODEL, "prompt": "def h(", "n": 3,
                                        "max_tokens": 6, "seed": 1}).json()
    fid = r["id"]
    ok = c.post("/v1/feedback", json={"id": fid, "chosen": 2})
    again = c.post("/v1/feedback", json={"id": fid, "chosen": 2})
    conflict = c.post("/v1/feedback", json={"id": fid, "chosen": 1})
    out_of_range = c.post("/v1/feedback", json={"id": r["id"], "index": 5, "accepted": True})
  assert ok.status_code == 200 and ok.json()["recorded"] is True
  assert again.status_code == 200 and again.json()["recorded"] is False
  assert conflict.status_code == 409 and conflict.json()["error"]["code"] == "conflict"
  assert out_of_range.status_code in (400, 409)
  store = log_lib.InteractionLog(log_lib.default_url(server.workdir))
  try:
    (row,) = [x for x in store.feedback_after(0, 1000) if x["id"] == fid]
  finally:
    store.close()
  assert row["chosen"] == 2 and len(row["candidates"]) == 3
  for i, cand in enumerate(row["candidates"]):
    assert cand["text"] == r["choices"][i]["text"]
    assert len(cand["tokens"]) == len(cand["logprobs"]) > 0
    assert cand["policy_version"] == 1 and cand["params"]["seed"] == 1
  assert sum(len(c["tokens"]) for c in row["candidates"]) == r["usage"]["completion_tokens"]


def test_simulated_users_choose_and_report(setup):
  import asyncio

  from rlcode.data import jsonl
  from rlcode.serve import users as users_lib
  server, *_ = setup
  tasks = jsonl.read_jsonl_tasks(os.path.join(serving.ROOT, "data", "tiny_tasks.jsonl"),
                                 jsonl.JsonlTasks.HELD_OUT_FRACTION)["train"][:20]
  population = users_lib.Users(tasks=tasks, model=serving.MODEL, k=3, max_tokens=12)
  done = asyncio.run(users_lib.run(population, server.url, api_key=serving.KEY,
                                   concurrency=2, count=4, seed=0))
  assert len(done) == 4 and all(d.policy_version == 1 for d in done)
  store = log_lib.InteractionLog(log_lib.default_url(server.workdir))
  try:
    logged = {r["id"]: r for r in store.feedback_after(0, 10_000)}
  finally:
    store.close()
  for d in done:
    row = logged[d.completion_id]
    assert len(row["candidates"]) == 3
    assert (row["chosen"], row["accepted"]) == ((d.chosen, None) if d.accepted else
                                                (None, False))
