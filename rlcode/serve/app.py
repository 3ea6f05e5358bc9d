"""The HTTP API: OpenAI's completions, chat completions and models, plus feedback, health and
metrics, on FastAPI (Starlette under uvicorn).

    POST /v1/completions        prompt (text or token ids, or a list of them) -> n
                                candidates a prompt
    POST /v1/chat/completions   messages (+ tools) through the checkpoint's chat template
    GET  /v1/models             the one model served
    GET  /v1/models/{id}        it by its id (a 404 error object for any other)
    POST /v1/feedback           what the user did with a completion (idempotent by id)
    GET  /v1/episodes/{id}      a harness episode's tokens (rlcode.harness); DELETE drops it
    GET  /health                {"status": "ok", "policy_version": ...}; no key needed
    GET  /metrics               requests, errors, queue depth, busy rows, KV pages, tokens/s,
                                version

A request's tokens come from the engine thread (rlcode.engine) through the event
loop; every completion is written to the interaction log before the response (or the
stream's last event) is sent, so a 2xx means it is stored. Responses carry the policy
version that sampled them ("policy_version", and the X-Policy-Version header; the oldest
when a list of prompts straddles a swap, each candidate's own in the log). Refusals are
OpenAI error objects; the body size limit and the API key are checked before the body is
read, and bodies are parsed by rlcode.serve.protocol, which names the field at fault; a
chat template that refuses the messages, or recurses past the stack on them, is a 400
naming messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
import secrets
import time
import uuid

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from rlcode.models import chat_template
from rlcode import engine as engine_lib
from rlcode.harness import Recorder
from rlcode.serve import episodes
from rlcode.serve import log as log_lib
from rlcode.serve import constrain, protocol, responses, weights
from rlcode.serve.protocol import APIError

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Served:
  """What the app serves: the engine and the policy's text side, the log, the settings."""

  engine: engine_lib.Engine
  tokenizer: object
  template: chat_template.ChatTemplate | None
  name: str
  log: log_lib.InteractionLog
  serve: object  # the config's serve section
  api_key: str | None = None
  publish_dir: str | None = None
  stop_ids: tuple[int, ...] = ()
  chat_stop_ids: tuple[int, ...] = ()
  counters: dict = dataclasses.field(default_factory=dict)
  rate: list = dataclasses.field(default_factory=list)
  started: float = dataclasses.field(default_factory=time.time)
  episodes: Recorder = dataclasses.field(default_factory=Recorder)  # X-Episode-Id calls

  def count(self, key: str) -> None:
    self.counters[key] = self.counters.get(key, 0) + 1


def _error_response(error: APIError) -> JSONResponse:
  return JSONResponse(error.body(), status_code=error.status)


class Gate:
  """ASGI middleware: the API key, then the body size (read whole, up to the limit, before
  the app sees it), each refused with an OpenAI error object."""

  def __init__(self, app, served: Served):
    self.app, self.served = app, served

  async def __call__(self, scope, receive, send):
    if scope["type"] != "http":
      return await self.app(scope, receive, send)
    headers = dict(scope["headers"])
    refuse = None
    if self.served.api_key is not None and scope["path"] != "/health":
      given = headers.get(b"authorization", b"").decode("latin-1")
      token = given[7:] if given.startswith("Bearer ") else ""
      if not hmac.compare_digest(token.encode(), self.served.api_key.encode()):
        refuse = APIError(401, "a valid API key is needed (Authorization: Bearer KEY)",
                          type="authentication_error", code="invalid_api_key")
    limit = self.served.serve.max_body_bytes
    length = headers.get(b"content-length")
    if refuse is None and length is not None and (not length.isdigit() or int(length) > limit):
      refuse = APIError(413, f"the body exceeds {limit} bytes", code="body_too_large")
    body, more = b"", True
    while refuse is None and more:
      message = await receive()
      if message["type"] == "http.disconnect":
        return
      body += message.get("body", b"")
      more = message.get("more_body", False)
      if len(body) > limit:
        refuse = APIError(413, f"the body exceeds {limit} bytes", code="body_too_large")
    if refuse is not None:
      self.served.count(f"errors_{refuse.status}")
      return await _error_response(refuse)(scope, receive, send)
    replayed = False

    async def replay():
      nonlocal replayed
      if not replayed:
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}
      return await receive()
    return await self.app(scope, replay, send)


def create_app(served: Served) -> FastAPI:
  @contextlib.asynccontextmanager
  async def lifespan(app):
    watcher = asyncio.create_task(_watch(served))
    try:
      yield
    finally:
      watcher.cancel()
      await anyio.to_thread.run_sync(served.engine.stop)
      served.log.close()

  app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

  @app.exception_handler(APIError)
  async def _api_error(request, exc: APIError):
    served.count(f"errors_{exc.status}")
    return _error_response(exc)

  @app.exception_handler(HTTPException)
  async def _http(request, exc: HTTPException):
    return await _api_error(request, APIError(exc.status_code, str(exc.detail),
                                              code="not_found" if exc.status_code == 404 else None))

  @app.exception_handler(Exception)
  async def _bug(request, exc):
    log.exception("a request failed")
    return await _api_error(request, APIError(500, f"internal error: {type(exc).__name__}",
                                              type="server_error"))

  @app.get("/health")
  async def health():
    return {"status": "ok", "policy_version": served.engine.version}

  @app.get("/metrics")
  async def metrics():
    return _metrics(served)

  def model_object():
    return {"id": served.name, "object": "model", "created": int(served.started),
            "owned_by": "rlcode", "policy_version": served.engine.version}

  @app.get("/v1/models")
  async def models():
    served.count("requests_models")
    return {"object": "list", "data": [model_object()]}

  @app.get("/v1/models/{model_id:path}")
  async def model(model_id: str):
    served.count("requests_models")
    if model_id != served.name:
      raise APIError(404, f"the model {model_id!r} does not exist; this server serves "
                     f"{served.name!r}", param="model", code="model_not_found")
    return model_object()

  @app.post("/v1/completions")
  async def completions(request: Request):
    body = protocol.parse(protocol.CompletionRequest, await request.body())
    served.count("requests_completions")
    prompts = [p if isinstance(p, list) else served.tokenizer.encode(p)
               for p in body.prompts()]
    episode = episodes.episode_of(request.headers, body.n, len(prompts))
    return await _generate(served, body, prompts, chat=False, episode=episode)

  @app.post("/v1/chat/completions")
  async def chat(request: Request):
    body = protocol.parse(protocol.ChatRequest, await request.body())
    served.count("requests_chat")
    episode = episodes.episode_of(request.headers, body.n)
    try:
      messages = body.template_messages()
    except ValueError as e:
      raise APIError(400, str(e), param="messages", code="invalid_value") from None
    tools = body.template_tools()
    if served.template is not None:
      try:
        text = served.template.render(messages, tools=tools, add_generation_prompt=True)
      except chat_template.TemplateError as e:
        raise APIError(400, f"messages: {e}", param="messages",
                       code="template_refused") from None
      except RecursionError:  # a body within MAX_DEPTH that the template recurses past
        raise APIError(400, "messages: the chat template recursed too deep on these messages "
                       "and tools", param="messages", code="template_refused") from None
      prompt = chat_template.encode(served.tokenizer, text)
    else:
      prompt = served.tokenizer.encode(chat_template.fallback_prompt(messages, tools))
    return await _generate(served, body, [prompt], chat=True, episode=episode)

  @app.post("/v1/feedback")
  async def feedback(request: Request):
    body = protocol.parse(protocol.FeedbackRequest, await request.body())
    served.count("requests_feedback")
    record = body.model_dump(exclude_none=True)
    try:
      new = await anyio.to_thread.run_sync(served.log.feedback, record)
    except log_lib.UnknownCompletion:
      raise APIError(404, f"no completion {body.id!r} in the log", param="id",
                     code="unknown_completion") from None
    except log_lib.Conflict as e:
      raise APIError(409, str(e), param="id", code="conflict") from None
    except ValueError as e:
      raise APIError(400, str(e), code="invalid_value") from None
    return {"id": body.id, "object": "feedback", "recorded": new}

  episodes.add_routes(app, served.episodes, served.count)
  return Gate(app, served)


def _check(served: Served, body, prompts: list[list[int]]) -> list[int]:
  """Each prompt's budget after checking the request against the model and the context."""
  cfg = served.engine.cfg
  if body.model != served.name:
    raise APIError(404, f"the model {body.model!r} does not exist; this server serves "
                   f"{served.name!r}", param="model", code="model_not_found")
  n_max = min(served.serve.max_n, served.engine.max_rows)
  if body.n * len(prompts) > n_max:
    asked = f"{body.n}" if len(prompts) == 1 else f"{body.n} for each of {len(prompts)} prompts"
    raise APIError(400, f"n: {asked}; at most {n_max} candidates a request", param="n",
                   code="invalid_value")
  context = cfg.max_seq_len
  budgets = []
  for i, prompt in enumerate(prompts):
    param = "prompt" if len(prompts) == 1 else f"prompt.{i}"
    if not prompt:
      raise APIError(400, f"{param}: the prompt is empty", param=param, code="invalid_value")
    if max(prompt) >= cfg.vocab_size:
      raise APIError(400, f"{param}: token ids must be below {cfg.vocab_size}", param=param,
                     code="invalid_value")
    if len(prompt) >= context:
      raise APIError(400, f"{param}: the prompt has {len(prompt)} tokens; the model's "
                     f"context is {context} tokens", param=param,
                     code="context_length_exceeded")
    budget = body.max_tokens
    if budget is None:
      budget = min(served.serve.default_max_tokens, context - len(prompt))
    if budget > context:
      raise APIError(400, f"max_tokens={budget} is out of range (1 to {context})",
                     param="max_tokens", code="invalid_value")
    if len(prompt) + budget > context:
      raise APIError(400, f"the prompt's {len(prompt)} tokens and max_tokens={budget} "
                     f"exceed the model's context of {context} tokens", param="max_tokens",
                     code="context_length_exceeded")
    budgets.append(budget)
  if served.engine.queue_depth() + len(prompts) > served.serve.max_queue:
    raise APIError(429, "the server's queue is full; retry later", type="rate_limit_error",
                   code="queue_full")
  return budgets


async def _generate(served: Served, body, prompts: list[list[int]], *, chat: bool,
                    episode: str | None = None):
  """One engine request a prompt, each of n candidates; choice p*n + j is prompt p's j-th."""
  budgets = _check(served, body, prompts)
  stop_ids = served.chat_stop_ids if chat else served.stop_ids
  text = responses.Text(served.tokenizer, stop_ids, body.stop)
  seed = body.seed if body.seed is not None else secrets.randbits(32)
  loop = asyncio.get_running_loop()
  queue: asyncio.Queue | None = asyncio.Queue() if body.stream else None
  grammar = (await anyio.to_thread.run_sync(  # a first grammar builds the token trie
      constrain.grammar_for, body, served.tokenizer, served.engine.cfg.vocab_size)
             if chat else None)
  requests, dones = [], []
  for p, (prompt, budget) in enumerate(zip(prompts, budgets)):
    done: asyncio.Future = loop.create_future()

    def on_done(result, done=done):
      loop.call_soon_threadsafe(lambda: done.done() or done.set_result(result))

    def on_token(c, tok, lp, top, first=p * body.n):
      if queue is not None:
        loop.call_soon_threadsafe(queue.put_nowait, (first + c, tok, lp, top))

    requests.append(engine_lib.Request(
        prompt=prompt, max_tokens=budget, n=body.n, temperature=body.temperature,
        top_p=body.top_p, seed=seed, stop_tokens=stop_ids, top_logprobs=True,
        stop_check=(lambda c, toks: text.stopped(toks)) if body.stop else None,
        on_token=on_token, on_done=on_done, grammar=grammar))
    dones.append(done)
  for request in requests:
    served.engine.submit(request)
  rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
  params = {"temperature": body.temperature, "top_p": body.top_p, "seed": seed,
            "stop": body.stop,
            "endpoint": "chat" if chat else "completions"}
  for key in ("user", "metadata"):
    if getattr(body, key, None) is not None:
      params[key] = getattr(body, key)
  all_done = asyncio.gather(*dones)
  if body.stream:
    return StreamingResponse(
        _stream(served, body, rid, requests, text, params, all_done, queue, chat, episode),
        media_type="text/event-stream")
  results = await all_done
  if any(r.error is not None for r in results):
    raise APIError(500, "generation failed", type="server_error")
  out = _choices(served, body, results, text, chat)
  await _record(served, rid, requests, results, out, text, params, episode)
  version = min(r.policy_version for r in results)
  return JSONResponse(
      {"id": rid, "object": "chat.completion" if chat else "text_completion",
       "created": int(time.time()), "model": served.name, "choices": out,
       "usage": _usage(requests, results), "policy_version": version},
      headers={"X-Policy-Version": str(version)})


def _usage(requests, results) -> dict:
  return responses.usage(sum(len(r.prompt) for r in requests),
                         [c for r in results for c in r.candidates])


def _choices(served, body, results, text, chat: bool) -> list[dict]:
  out = []
  for i, cand in enumerate(c for r in results for c in r.candidates):
    content = text.final(cand.tokens)
    reason = cand.finish_reason
    if not chat:
      choice = {"index": i, "text": content, "finish_reason": reason, "logprobs": None}
      if body.logprobs is not None:
        choice["logprobs"] = responses.completion_logprobs(
            served.tokenizer, cand.tokens, cand.logprobs, cand.top, body.logprobs)
      out.append(choice)
      continue
    message = {"role": "assistant", "content": content}
    if body.parses_tool_calls():
      message["content"], calls = responses.tool_calls(content)
      if calls:
        message["tool_calls"] = calls
        reason = "tool_calls"
    choice = {"index": i, "message": message, "finish_reason": reason, "logprobs": None}
    if body.logprobs:
      choice["logprobs"] = responses.chat_logprobs(served.tokenizer, cand.tokens, cand.logprobs,
                                                   cand.top, body.top_logprobs or 0)
    out.append(choice)
  return out


async def _record(served, rid, requests, results, choices, text, params, episode) -> None:
  """The candidates in the log (their text as sampled, tool calls unparsed), each with its
  own prompt and policy version; `n` counts the response's choices, which feedback's
  `chosen` and `index` name."""
  cands = [(request, result, c) for request, result in zip(requests, results)
           for c in result.candidates]
  rows = [log_lib.Served(
      id=rid, index=i, policy_version=result.policy_version, model=served.name,
      prompt_tokens=request.prompt, tokens=c.tokens, logprobs=c.logprobs,
      text=text.final(c.tokens), finish_reason=choice["finish_reason"],
      params=dict(params, max_tokens=request.max_tokens), n=len(choices))
      for i, ((request, result, c), choice) in enumerate(zip(cands, choices))]
  await anyio.to_thread.run_sync(served.log.record, rows)
  if episode is not None:  # an episode's call: its tokens appended to its trajectory
    episodes.record(served.episodes, episode, rid, requests, results)


async def _stream(served, body, rid, requests, text, params, done, queue, chat, episode):
  """Server-sent events: a chunk per decoded piece of text (with its tokens' log-probs
  when asked: the chunks' together are the unstreamed response's), the finish reasons,
  the usage when stream_options asks for it (a last chunk with no choices, as OpenAI
  sends), [DONE]."""
  kind = "chat.completion.chunk" if chat else "text_completion"
  count = len(requests) * body.n
  sent = [""] * count
  tokens, lps, tops = ([[] for _ in range(count)] for _ in range(3))
  logged, offsets = [0] * count, [0] * count
  wants_logprobs = bool(body.logprobs) if chat else body.logprobs is not None
  holds_calls = chat and body.parses_tool_calls()

  def logprobs(i, toks, lp, top):
    """The log-probs of candidate i's tokens not yet sent (those after `logged[i]`)."""
    if not wants_logprobs:
      return None
    at = logged[i]
    logged[i] = len(toks)
    if chat:
      return responses.chat_logprobs(served.tokenizer, toks[at:], lp[at:], top[at:],
                                     body.top_logprobs or 0)
    out = responses.completion_logprobs(served.tokenizer, toks[at:], lp[at:], top[at:],
                                        body.logprobs, offsets[i])
    offsets[i] += sum(map(len, out["tokens"]))
    return out

  def event(choices, **more):
    out = {"id": rid, "object": kind, "created": int(time.time()), "model": served.name,
           "choices": choices, "policy_version": served.engine.version}
    if body.include_usage:
      out["usage"] = None
    out.update(more)
    return f"data: {json.dumps(out)}\n\n"

  def chunk(i, piece, reason=None, extra=None, lp=None):
    if chat:
      delta = {"content": piece} if piece else {}
      delta.update(extra or {})
      choice = {"index": i, "delta": delta, "finish_reason": reason, "logprobs": lp}
    else:
      choice = {"index": i, "text": piece, "finish_reason": reason, "logprobs": lp}
    return event([choice])

  if chat:
    for i in range(count):
      yield chunk(i, "", extra={"role": "assistant"})
  while not (done.done() and queue.empty()):
    getter = asyncio.ensure_future(queue.get())
    finished, _ = await asyncio.wait({getter, done}, return_when=asyncio.FIRST_COMPLETED)
    if getter not in finished:
      getter.cancel()
      continue
    c, tok, lp, top = getter.result()
    tokens[c].append(tok)
    lps[c].append(lp)
    tops[c].append(top)
    # With tools the text may be a call: it is sent whole at the end, parsed.
    safe = "" if holds_calls else text.safe(tokens[c])
    if len(safe) > len(sent[c]):
      yield chunk(c, safe[len(sent[c]):], lp=logprobs(c, tokens[c], lps[c], tops[c]))
      sent[c] = safe
  results = done.result()
  if any(r.error is not None for r in results):
    error = APIError(500, "generation failed", type="server_error").body()
    yield f"data: {json.dumps(error)}\n\n"
    return
  final = _choices(served, body, results, text, chat)
  cands = [c for r in results for c in r.candidates]
  for i, (choice, cand) in enumerate(zip(final, cands)):
    extra = None
    if chat:
      content = choice["message"]["content"] or ""
      if "tool_calls" in choice["message"]:
        extra = {"tool_calls": [dict(call, index=j)
                                for j, call in enumerate(choice["message"]["tool_calls"])]}
    else:
      content = choice["text"]
    rest = content[len(sent[i]):] if content.startswith(sent[i]) else ""
    lp = logprobs(i, cand.tokens, cand.logprobs, cand.top) if logged[i] < len(cand.tokens) else None
    if rest or extra or lp:
      yield chunk(i, rest, None, extra, lp)
    yield chunk(i, "", choice["finish_reason"])
  await _record(served, rid, requests, results, final, text, params, episode)
  if body.include_usage:
    yield event([], usage=_usage(requests, results))
  yield "data: [DONE]\n\n"


def _metrics(served: Served) -> dict:
  eng = served.engine
  now, tokens = time.time(), eng.stats["tokens"]
  served.rate.append((now, tokens))
  served.rate[:] = [(t, n) for t, n in served.rate if now - t <= 60]
  t0, n0 = served.rate[0]
  return {"policy_version": eng.version, "queue_depth": eng.queue_depth(),
          "busy_slots": eng.busy_rows(), "slots": eng.max_rows, "tokens_total": tokens,
          "tokens_per_s": (tokens - n0) / (now - t0) if now > t0 else 0.0,
          "engine_steps": eng.stats["steps"], "weight_swaps": eng.stats["swaps"],
          "kv_pages": eng.pool.num_pages - 1, "kv_pages_used": eng.pool.used(),
          "prefix_hit_tokens": eng.stats["prefix_hit_tokens"],
          "preemptions": eng.stats["preemptions"],
          "engine_shapes_to_compile": len(eng.warm),
          "uptime_s": now - served.started, **served.counters,
          **served.episodes.stats()}


async def _watch(served: Served) -> None:
  """Swaps in weights newer than the served ones as they are published."""
  every = served.serve.watch_seconds
  if not served.publish_dir or every <= 0:
    return
  while True:
    await asyncio.sleep(every)
    try:
      version = weights.newest(served.publish_dir)
      if version is not None and version > served.engine.version:
        state = await anyio.to_thread.run_sync(weights.load, served.publish_dir, version,
                                               served.engine.state)
        served.engine.publish(state, version)
        log.info("policy version %d published", version)
    except Exception:  # a bad file must not take the server down; it is tried again
      log.exception("loading published weights failed")
