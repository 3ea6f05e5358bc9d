"""A policy served in this process: rlcode's engine behind rlcode's HTTP API, under uvicorn
on a thread, listening on a loopback port (the OS picks it unless one is given).

A trainer starts one over its policy, lets harnesses call it with the openai client (their
calls, named by X-Episode-Id, recorded token-exactly in `recorder`: rlcode.harness; its
rollouts, rlcode.harness.rollouts, take such a server), and
publishes each new version of its weights to the engine (`publish`: requests that arrive
afterwards sample with them; each token records the version that sampled it).

The interaction log: with `log_url` every completion is written there, as `rlcode serve`
does; without it nothing is logged (the episodes' records are what a trainer reads) and
/v1/feedback answers 404.
"""

from __future__ import annotations

import dataclasses
import logging
import socket

from rlcode import web
from rlcode.config import serving
from rlcode.errors import BadInput
from rlcode.serve import log as log_lib
from rlcode.serve import server

log = logging.getLogger(__name__)



class _NoLog:
  """The interaction log of a server that keeps none (`LocalServer` without log_url)."""

  def record(self, rows) -> None:
    del rows

  def feedback(self, body):
    raise log_lib.UnknownCompletion(body.get("id"))

  def close(self) -> None:
    pass


class LocalServer:
  """rlcode's server over `model` in this process (a context manager; `close` stops it).

  Args:
    model: the policy (an rlcode Decoder); its weights are version `version`.
    tokenizer: its tokenizer.
    template: the chat template (rlcode.models.chat_template.ChatTemplate) chat calls are
      rendered with; None: the compact fallback format.
    host, port: where to listen (port 0: a free port the OS picks).
    api_key: the key every /v1 call must carry (None: none needed).
    name: the model's name in the API.
    serve: fields of rlcode.config.serving.Serve to override (slots, page_size, kv_pages,
      prefill_tokens, prefix_cache, max_n, ...); warm-up is off unless asked for.
    log_url: the interaction log's SQLAlchemy URL; None: no log.
    start_timeout: seconds to wait for the server to listen.
  """

  def __init__(self, model, tokenizer, *, template=None, host: str = "127.0.0.1",
               port: int = 0, api_key: str | None = None, name: str = "rlcode",
               serve: dict | None = None, log_url: str | None = None, version: int = 0,
               start_timeout: float = 120.0):
    import uvicorn

    from rlcode.serve import app as app_lib  # deferred: FastAPI, only to serve
    fields = {f.name for f in dataclasses.fields(serving.Serve)}
    unknown = sorted(set(serve or {}) - fields)
    if unknown:
      raise BadInput(f"LocalServer serve={unknown}: not fields of the serve section; known: "
                     f"{sorted(fields)}")
    self.serve = dataclasses.replace(serving.Serve(), **{"warmup": False, "watch_seconds": 0,
                                                         "model_name": name, **(serve or {})})
    cfg = self.serve
    self.api_key, self.name = api_key, name
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
      sock.bind((host, port))
    except OSError as e:
      sock.close()
      raise BadInput(f"LocalServer host={host!r} port={port}: cannot listen there "
                     f"({e.strerror})") from None
    self.engine = server.start_engine(model, cfg, version)
    chat_stops = server.chat_stop_ids(tokenizer, template)
    store = (log_lib.InteractionLog(log_url, {"name": name, "served_by": "LocalServer"})
             if log_url else _NoLog())
    self.served = app_lib.Served(engine=self.engine, tokenizer=tokenizer, template=template,
                                 name=name, log=store, serve=cfg, api_key=api_key,
                                 stop_ids=tuple(tokenizer.eos_ids), chat_stop_ids=chat_stops)
    self._server = uvicorn.Server(uvicorn.Config(
        app_lib.create_app(self.served), log_level="warning", access_log=False,
        lifespan="on", timeout_graceful_shutdown=int(cfg.graceful_seconds)))
    self._thread, started = web.start_in_thread(self._server, sock, "rlcode-local-server",
                                                start_timeout)
    if not started:
      self.close()
      raise RuntimeError(f"LocalServer on {host}:{port}: the server did not start")
    bound = sock.getsockname()
    self.url = f"http://{'[' + bound[0] + ']' if ':' in bound[0] else bound[0]}:{bound[1]}"
    log.info("serving %s at %s (policy version %d)", name, self.url, version)

  @property
  def base_url(self) -> str:
    """What an openai client's base_url is."""
    return self.url + "/v1"

  @property
  def recorder(self):
    """The episodes its calls recorded (rlcode.harness.Recorder)."""
    return self.served.episodes

  @property
  def version(self) -> int:
    return self.engine.version

  def publish(self, model, version: int) -> None:
    """`model`'s weights as policy version `version`: calls submitted afterwards sample
    with them (the engine swaps them in before its next step)."""
    from flax import nnx
    self.engine.publish(nnx.state(model.for_sampling()), version)

  def close(self) -> None:
    """Stops listening, lets the calls in flight finish, stops the engine."""
    if self._thread.is_alive():
      self._server.should_exit = True
      self._thread.join()
    self.engine.stop(cancel=True)  # the app's shutdown stopped it, unless it never started

  def __enter__(self) -> LocalServer:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
