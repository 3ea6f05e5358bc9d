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
from rlcode.serve import protocol

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


def test_a_model_by_id(setup):
  import openai
  server, *_ = setup
  client = server.openai()
  assert client.models.retrieve(serving.MODEL).id == serving.MODEL
  with pytest.raises(openai.NotFoundError):
    client.models.retrieve("gpt-9")


def test_tool_choice_none_returns_the_call_as_text(setup):
  server, *_ = setup
  client = server.openai()
  ask = dict(model=serving.MODEL, messages=serving.ASK, tools=serving.TOOLS, temperature=0,
             max_tokens=100)
  parsed = client.chat.completions.create(**ask, tool_choice="auto").choices[0]
  plain = client.chat.completions.create(**ask, tool_choice="none").choices[0]
  assert parsed.finish_reason == "tool_calls" and parsed.message.tool_calls
  assert plain.finish_reason == "stop" and plain.message.tool_calls is None
  assert serving.CALL in plain.message.content


def test_a_list_of_prompts_is_answered_prompt_by_prompt(setup):
  """Choice p*n + j of a list is the j-th choice of prompt p asked alone (randomness is
  keyed by seed, candidate and position); usage adds the prompts up."""
  server, _, tokenizer, _ = setup
  client = server.openai()
  prompts = ["def f(", "x = ["]
  ask = dict(model=serving.MODEL, max_tokens=8, n=2, temperature=1.0, seed=3)
  alone = [client.completions.create(prompt=p, **ask) for p in prompts]
  for batch in (prompts, [tokenizer.encode(p) for p in prompts]):
    both = client.completions.create(prompt=batch, **ask)
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    assert [c.text for c in both.choices] == [c.text for a in alone for c in a.choices]
    assert both.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert both.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)


def test_stream_usage_and_logprobs_match_the_unstreamed_response(setup):
  server, *_ = setup
  client = server.openai()
  ask = dict(model=serving.MODEL, prompt="def f(x):", max_tokens=12, temperature=0, logprobs=2)
  # Each request is asked once first, so that the answers compared both read its prompt
  # from the prefix cache: a prefill that misses it computes the same tokens with other
  # program shapes, so log-probs that differ at float32 rounding (the test's order in
  # the file decided which of the two missed).
  client.completions.create(**ask)
  whole = client.completions.create(**ask)
  events = list(client.completions.create(**ask, stream=True,
                                          stream_options={"include_usage": True}))
  *chunks, last = events
  assert last.choices == [] and last.usage == whole.usage
  assert all(e.usage is None for e in chunks)
  want = whole.choices[0].logprobs
  got = [e.choices[0].logprobs for e in chunks if e.choices[0].logprobs]
  assert len(got) > 1
  for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
    assert [x for lp in got for x in getattr(lp, key)] == getattr(want, key), key
  chat = dict(model=serving.MODEL, messages=serving.ASK, max_tokens=20, temperature=0,
              logprobs=True, top_logprobs=2)
  client.chat.completions.create(**chat)
  whole = client.chat.completions.create(**chat).choices[0].logprobs.content
  streamed = [x for e in client.chat.completions.create(**chat, stream=True)
              if e.choices[0].logprobs for x in e.choices[0].logprobs.content]
  assert [x.model_dump() for x in streamed] == [x.model_dump() for x in whole]


def test_no_op_values_are_accepted_and_user_and_metadata_logged(setup):
  import sqlalchemy as sa
  server, *_ = setup
  with server.client() as c:
    chat = c.post("/v1/chat/completions", json={
        "model": serving.MODEL, "messages": serving.ASK, "max_completion_tokens": 4,
        "tools": serving.TOOLS, "tool_choice": "auto", "parallel_tool_calls": True,
        "frequency_penalty": 0, "presence_penalty": 0.0, "logit_bias": {},
        "response_format": {"type": "text"}, "store": True, "service_tier": "auto",
        "modalities": ["text"], "user": "u-1", "metadata": {"team": "a"}})
    text = c.post("/v1/completions", json={
        "model": serving.MODEL, "prompt": "x", "max_tokens": 2, "echo": False, "suffix": "",
        "best_of": 1, "n": 1, "user": "u-2"})
    # null is OpenAI's "the default" for an optional field, and clients send it so.
    nulls = c.post("/v1/chat/completions", json={
        "model": serving.MODEL, "messages": serving.ASK, "max_tokens": 2, "n": None,
        "temperature": None, "top_p": None, "stream": None, "logprobs": None,
        "top_logprobs": None, "tool_choice": None, "seed": None, "stop": None})
  assert nulls.status_code == 200 and len(nulls.json()["choices"]) == 1, nulls.text
  assert chat.status_code == 200 and text.status_code == 200, (chat.text, text.text)
  assert chat.json()["usage"]["completion_tokens"] <= 4
  store = log_lib.InteractionLog(log_lib.default_url(server.workdir))
  try:
    with store.engine.connect() as conn:
      params = dict(conn.execute(sa.select(log_lib.COMPLETIONS.c.id,
                                           log_lib.COMPLETIONS.c.params)).all())
  finally:
    store.close()
  assert json.loads(params[chat.json()["id"]])["metadata"] == {"team": "a"}
  assert json.loads(params[chat.json()["id"]])["user"] == "u-1"
  assert json.loads(params[text.json()["id"]])["user"] == "u-2"


def test_logprobs_bytes_are_the_raw_bytes_of_byte_tokens():
  """A byte token inside a UTF-8 character is its own byte, not U+FFFD's three; the bytes
  of a completion's tokens, joined, are its text's UTF-8 (byte and BPE tokenizers)."""
  from rlcode.models import tokenizer as tokenizer_lib
  from rlcode.serve import responses
  text = "→ é 日本"
  byte_level = tokenizer_lib.ByteTokenizer(specials=tokenizer_lib.TOOL_SPECIALS)
  bpe = tokenizer_lib.load_tokenizer(os.path.join(serving.ROOT, "data", "code_bpe.json"))
  for tok in (byte_level, bpe):
    ids = tok.encode(text, add_special_tokens=False)
    tops = [[(i, -1.0)] for i in ids]
    content = responses.chat_logprobs(tok, ids, [-0.5] * len(ids), tops, 1)["content"]
    assert b"".join(bytes(e["bytes"]) for e in content) == text.encode("utf-8")
    partial = [e for e in content if e["token"] == "\ufffd"]
    assert partial and all(len(e["bytes"]) == 1 and e["bytes"][0] >= 0x80 for e in partial)
    assert all(e["top_logprobs"][0]["bytes"] == e["bytes"] for e in content)


# Two tools whose arguments are short by their schemas, so a sampled call always completes.
FORCED_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "parameters": {
            "type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "JST"]}},
            "required": ["zone"], "additionalProperties": False}}}]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in FORCED_TOOLS}


@pytest.mark.parametrize("choice", ["get_time", "required"])
def test_a_forced_tool_choice_always_comes_back_as_a_tool_call(setup, choice):
  """tool_choice naming a function (or "required"): every sampled choice, asked what the
  policy was taught to call for and what it was not, is one call of that function (of
  one of the tools) whose arguments match its parameters."""
  import jsonschema
  server, *_ = setup
  client = server.openai()
  tool_choice = choice if choice == "required" else {"type": "function",
                                                      "function": {"name": choice}}
  for seed, messages in enumerate([serving.ASK, [{"role": "user", "content": "hello"}]]):
    reply = client.chat.completions.create(
        model=serving.MODEL, messages=messages, tools=FORCED_TOOLS, tool_choice=tool_choice,
        temperature=1.0, n=4, seed=seed, max_tokens=120)
    for c in reply.choices:
      assert c.finish_reason == "tool_calls", c.message
      (call,) = c.message.tool_calls
      assert call.function.name in ([choice] if choice != "required" else PARAMETERS)
      jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])


def test_response_format_json_schema_always_parses_under_it(setup):
  import jsonschema
  server, *_ = setup
  schema = {"type": "object", "properties": {
      "city": {"type": "string", "maxLength": 10}, "days": {"type": "integer", "minimum": 1,
                                                           "maximum": 14},
      "metric": {"type": "boolean"}}, "required": ["city", "days", "metric"],
      "additionalProperties": False}
  reply = server.openai().chat.completions.create(
      model=serving.MODEL, messages=serving.ASK, temperature=1.0, n=4, seed=5, max_tokens=120,
      response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}})
  for c in reply.choices:
    assert c.finish_reason == "stop"
    jsonschema.validate(json.loads(c.message.content), schema)
  # json_object is the schema of any object (whose free strings may outrun a budget).
  body = protocol.ChatRequest.model_validate(
      {"model": serving.MODEL, "messages": serving.ASK, "response_format": {"type": "json_object"}})
  assert body.json_format() == {"type": "object"}
