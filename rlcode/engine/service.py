"""The engine in a process of its own: weights in and finished groups out over a socket.

    RemoteEngine(model, num_pages=..., ...)   what rlcode.engine.Engine offers a rollout
        .start() / .submit(request) / .publish(state, version) / .stop() / .stats

A RemoteEngine spawns a fresh Python process that builds the same model (from its config)
and runs an Engine there, bound to 127.0.0.1; the trainer's process streams it weights and
requests and reads back each finished request whole. The wire is one TCP connection of
frames: an 8-byte length, a JSON header, then raw bytes (a weight's array, in the header's
dtype and shape: the leaves of the sampling model's nnx.State in tree order). Nothing
crosses it as pickle and nothing goes through a shared disk.

A request's result travels in one frame after the request is done, so a request is either
answered whole or not at all. When the process dies (a crash, an OOM kill, SIGKILL), the
client starts a new one, publishes the newest weights it sent (it keeps them on the host)
and submits again every request not yet answered, with the same seeds and rows: a lost
process loses no finished request and never hands back part of one (`restarts` counts
them). A request the engine refuses fails alone (checked at submit, and in the process);
weights that do not fit the process's model, or MAX_BARREN_RESTARTS processes in a row
that die before answering anything, end it: every request is told EngineLost and later
ones are refused. Requests with callbacks per token, stop checks or grammars stay
in-process (refused here). Each process takes its default device with no memory
preallocated; placing processes on accelerators of their own is not done.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import struct
import threading

import jax
import numpy as np
from flax import nnx

from rlcode.engine.requests import Candidate, Request, Result, call_done, check

_LENGTH = struct.Struct(">Q")
_HEADER = struct.Struct(">I")


# Processes started in a row that each died before answering anything: a request or a
# model that kills every process, not a crash to recover from.
MAX_BARREN_RESTARTS = 3


class EngineLost(RuntimeError):
  """The engine's process went away and could not be started again."""


def _send(sock: socket.socket, header: dict, blobs=()) -> None:
  head = json.dumps(header).encode()
  body = [_HEADER.pack(len(head)), head, *[memoryview(b).cast("B") for b in blobs]]
  sock.sendall(_LENGTH.pack(sum(len(b) for b in body)))
  for part in body:
    sock.sendall(part)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
  buf = bytearray(n)
  view, got = memoryview(buf), 0
  while got < n:
    k = sock.recv_into(view[got:])
    if not k:
      raise ConnectionError("the peer closed the connection")
    got += k
  return bytes(buf)


def _recv(sock: socket.socket) -> tuple[dict, bytes]:
  """(header, the raw bytes after it) of one frame."""
  (n,) = _LENGTH.unpack(_recv_exact(sock, _LENGTH.size))
  frame = _recv_exact(sock, n)
  (h,) = _HEADER.unpack_from(frame)
  return json.loads(frame[_HEADER.size:_HEADER.size + h]), frame[_HEADER.size + h:]


def _weights_frame(leaves: list[np.ndarray], version: int) -> tuple[dict, list]:
  return ({"op": "publish", "version": int(version),
           "leaves": [[str(a.dtype), list(a.shape)] for a in leaves]},
          [np.ascontiguousarray(a) for a in leaves])


def _leaves_from(blob: bytes, specs) -> list[np.ndarray]:
  out, at = [], 0
  for dtype, shape in specs:
    a = np.frombuffer(blob, dtype=np.dtype(dtype), count=int(np.prod(shape)), offset=at)
    out.append(a.reshape(shape))
    at += a.nbytes
  return out


# ------------------------------------------------------------------ the engine's process
def _serve(cfg, engine_kwargs: dict, port_out) -> None:
  """The process's body: build the model and engine, take one connection, serve it until
  it closes or says stop."""
  from rlcode.engine.engine import Engine  # deferred: the child imports what it runs
  from rlcode.models import Decoder  # deferred: as above

  engine = Engine(Decoder(cfg, rngs=nnx.Rngs(0)), **engine_kwargs)
  treedef = jax.tree.structure(engine.state)
  shapes = [np.shape(x) for x in jax.tree.leaves(engine.state)]
  server = socket.create_server(("127.0.0.1", 0))
  port_out.send(server.getsockname()[1])
  conn, _ = server.accept()
  server.close()
  lock = threading.Lock()

  def answer(rid: int, result: Result) -> None:
    header = {"op": "done", "id": rid, "version": result.policy_version,
              "prompt_tokens": result.prompt_tokens,
              "error": None if result.error is None else repr(result.error),
              "busy_seconds": engine.stats["busy_seconds"],
              "candidates": [{"tokens": c.tokens, "logprobs": c.logprobs,
                              "versions": c.versions, "finish_reason": c.finish_reason,
                              "restarts": c.restarts} for c in result.candidates]}
    with lock:
      try:
        _send(conn, header)
      except OSError:  # the trainer went away: nothing to tell
        pass

  engine.start()
  try:
    while True:
      header, blob = _recv(conn)
      if header["op"] == "publish":
        leaves = _leaves_from(blob, header["leaves"])
        if [tuple(s) for _, s in header["leaves"]] != [tuple(s) for s in shapes]:
          with lock:  # the trainer's model is not this one: nothing here can run
            _send(conn, {"op": "fatal", "error": "the published weights do not match the "
                                                 "engine process's model"})
          break
        engine.publish(jax.tree.unflatten(treedef, [jax.numpy.asarray(a) for a in leaves]),
                       header["version"])
      elif header["op"] == "submit":
        rid = header.pop("id")
        del header["op"]
        header["stop_tokens"] = tuple(header["stop_tokens"])
        try:
          engine.submit(Request(**header, on_done=lambda r, rid=rid: answer(rid, r)))
        except Exception as e:  # this request alone fails; the engine goes on
          answer(rid, Result([], -1, len(header["prompt"]), error=e))
      elif header["op"] == "stop":
        break
  except ConnectionError:
    pass
  finally:
    engine.stop(cancel=True)
    conn.close()


# ------------------------------------------------------------------ the trainer's side
class RemoteEngine:
  """An Engine in its own process (see the module docstring). Arguments as Engine's
  (`mesh` aside: the process uses its own default device); `model` gives the config and
  the first weights."""

  def __init__(self, model, *, version: int = 0, start_timeout: float = 300.0, **engine_kwargs):
    if engine_kwargs.pop("mesh", None) is not None:
      raise ValueError("a RemoteEngine uses its process's own devices: no mesh")
    sampling = model.for_sampling()
    self.cfg = sampling.cfg
    self.engine_kwargs = {**engine_kwargs, "version": version}
    self.start_timeout = start_timeout
    self._weights = _weights_frame([np.asarray(a) for a in jax.tree.leaves(
        nnx.state(sampling))], version)
    self._pending: dict[int, Request] = {}
    self._next_id = 0
    self._lock = threading.Lock()
    self._sock: socket.socket | None = None
    self._process = None
    self._closing = False
    self._lost: BaseException | None = None  # set once no process can be started
    self._answered = True  # since the last restart (restarts that answer nothing: a loop)
    self._barren = 0  # restarts in a row that answered nothing
    self.restarts = 0
    self.stats = {"busy_seconds": 0.0}
    self._busy_before = 0.0  # busy seconds of the processes that died

  @property
  def pid(self) -> int | None:
    return None if self._process is None else self._process.pid

  def start(self) -> RemoteEngine:
    self._spawn()
    return self

  def _spawn(self) -> None:
    """A fresh process, the newest weights, and every unanswered request again."""
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe(duplex=False)
    saved = {k: os.environ.get(k) for k in ("XLA_FLAGS", "XLA_PYTHON_CLIENT_PREALLOCATE")}
    try:  # one device, no fake host devices, and no grab of most of an accelerator's memory
      if saved["XLA_FLAGS"]:
        os.environ["XLA_FLAGS"] = " ".join(f for f in saved["XLA_FLAGS"].split()
                                           if "force_host_platform_device_count" not in f)
      os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
      process = ctx.Process(target=_serve, args=(self.cfg, self.engine_kwargs, theirs),
                            name="rlcode-engine-service", daemon=True)
      process.start()
    finally:
      for k, v in saved.items():
        if v is None:
          os.environ.pop(k, None)
        else:
          os.environ[k] = v
    theirs.close()
    if not ours.poll(self.start_timeout):
      process.kill()
      raise EngineLost(f"the engine's process did not start in {self.start_timeout:.0f} s")
    port = ours.recv()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with self._lock:
      if self._closing:  # stopped while this one started: it is not wanted
        process.kill()
        sock.close()
        return
      self._process, self._sock = process, sock
      _send(sock, *self._weights)
      for rid, request in self._pending.items():
        _send(sock, _submit_header(rid, request))
    threading.Thread(target=self._read, args=(sock, process), name="rlcode-engine-client",
                     daemon=True).start()

  def submit(self, request: Request) -> None:
    if request.on_token or request.stop_check or request.grammar is not None or \
        request.experts or request.top_logprobs:
      raise ValueError("a RemoteEngine takes plain requests (no per-token callbacks, stop "
                       "checks, grammars, experts or top log-probs)")
    kw = self.engine_kwargs
    check(request, self.cfg.max_seq_len, kw.get("max_rows", 64), kw.get("page_size", 16),
          kw["num_pages"])
    if self._lost is not None:
      raise self._lost
    if self._sock is None:
      raise RuntimeError("start() the RemoteEngine before submitting to it")
    with self._lock:
      rid, self._next_id = self._next_id, self._next_id + 1
      self._pending[rid] = request
      try:
        _send(self._sock, _submit_header(rid, request))
      except OSError:  # the process is gone: the reader starts another, which gets it
        pass

  def publish(self, state, version: int) -> None:
    """New weights for the engine, swapped in between two of its steps; kept here for a
    process started later."""
    if self._lost is not None:
      raise self._lost
    frame = _weights_frame([np.asarray(a) for a in jax.tree.leaves(state)], version)
    with self._lock:
      self._weights = frame
      self.engine_kwargs["version"] = version
      try:
        if self._sock is not None:  # else the first process gets them when it starts
          _send(self._sock, *frame)
      except OSError:
        pass

  def _read(self, sock: socket.socket, process) -> None:
    fatal = None
    while True:
      try:
        header, _ = _recv(sock)
      except (ConnectionError, OSError):
        break
      if header["op"] == "fatal":
        fatal = header["error"]
        break
      with self._lock:
        request = self._pending.pop(header["id"], None)
        self.stats["busy_seconds"] = self._busy_before + header["busy_seconds"]
        self._answered = True
      if request is not None:
        call_done(request, _result(header))
    sock.close()
    process.join(5.0)
    if process.is_alive():  # gone quiet but not gone: it must not hold the device
      process.kill()
    if self._closing:
      return
    with self._lock:
      self._busy_before = self.stats["busy_seconds"]
      self._barren = 0 if self._answered else self._barren + 1
      self._answered = False
      self.restarts += 1
    try:
      if fatal is not None:
        raise EngineLost(fatal)
      if self._barren >= MAX_BARREN_RESTARTS:
        raise EngineLost(f"{MAX_BARREN_RESTARTS} processes in a row died before answering "
                         "any request")
      self._spawn()
    except Exception as e:  # nothing left to run them: each request told, later ones refused
      lost = e if isinstance(e, EngineLost) else EngineLost(f"the engine's process was "
                                                            f"lost: {e}")
      with self._lock:
        self._lost = lost
        pending, self._pending = self._pending, {}
      for request in pending.values():
        call_done(request, Result([], -1, len(request.prompt), error=lost))

  def stop(self, timeout: float | None = None, cancel: bool = True) -> None:
    """Ends the process; unanswered requests are dropped (each told, as Engine.stop with
    cancel tells them)."""
    self._closing = True
    with self._lock:
      pending, self._pending = self._pending, {}
      try:
        if self._sock is not None:
          _send(self._sock, {"op": "stop"})
      except OSError:
        pass
    if self._process is not None:
      self._process.join(timeout if timeout is not None else 10.0)
      if self._process.is_alive():
        self._process.kill()
    for request in pending.values():
      call_done(request, Result([], -1, len(request.prompt),
                                error=RuntimeError("the engine was stopped")))

  def kill(self) -> None:
    """SIGKILL to the engine's process (tests: what a crash does)."""
    os.kill(self._process.pid, 9)


def _submit_header(rid: int, request: Request) -> dict:
  return {"op": "submit", "id": rid, "prompt": [int(t) for t in request.prompt],
          "max_tokens": request.max_tokens, "n": request.n,
          "temperature": request.temperature, "top_p": request.top_p, "top_k": request.top_k,
          "seed": request.seed, "rows": None if request.rows is None else list(request.rows),
          "stop_tokens": [int(t) for t in request.stop_tokens]}


def _result(header: dict) -> Result:
  cands = [Candidate(tokens=c["tokens"], logprobs=c["logprobs"], versions=c["versions"],
                     finish_reason=c["finish_reason"], restarts=c["restarts"])
           for c in header["candidates"]]
  error = None if header["error"] is None else RuntimeError(header["error"])
  return Result(cands, header["version"], header["prompt_tokens"], error=error)
