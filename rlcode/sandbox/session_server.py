"""The workspace server that runs inside a sandbox session: one request at a time.

`rlcode.sandbox.session` passes the text of this file to the sandboxed interpreter
with `python -c`; rlcode never imports it. Standard library only. It is the pid
namespace's init, holds the workspace (its working directory, a private tmpfs), and
serves requests that arrive as frames on REQUEST_FD, answering each with one frame
on RESPONSE_FD. A frame is a 4-byte big-endian length and that many bytes of JSON.

argv is `[-c, REQUEST_FD, RESPONSE_FD]`. The first frame is the configuration:
  rlimits  {"RLIMIT_...": [soft, hard]} applied to every command, not to the server.
  env      the commands' environment.
  max_output_bytes, output_limit_bytes, max_read_bytes, max_files.
Then requests, each answered {"ok": true, ...} or {"ok": false, "error": MSG}:
  {"op": "exec", "command": str, "timeout": float}
      -> output (stdout and stderr interleaved, the first max_output_bytes),
         exit_code (None when killed), timed_out, truncated
  {"op": "read", "path": str} -> text           (a regular file in the workspace)
  {"op": "write", "path": str, "text": str}     (parents created; no symlinks followed)
  {"op": "files"} -> files                      (regular files, relative, sorted)
  {"op": "close"}                               (the server exits)

Commands run as `bash -c COMMAND` in a new process group with the rlimits set
(RLIMIT_NPROC bounds a fork bomb: the session runs as a non-root host user, see
session.py); the server reads their output until the command exits and its output
pipe closes, or the timeout or the output limit passes, then kills every other
process of the namespace (as init, kill(-1) reaches them all and not itself), so
no command outlives its call and nothing runs between requests. The server makes
itself non-dumpable first: processes of the same uid cannot open its /proc files
(memory, fds) or trace it.
"""


def _main():
  import ctypes
  import json
  import os
  import resource
  import select
  import signal
  import struct
  import sys
  import time

  req_fd, resp_fd = int(sys.argv[1]), int(sys.argv[2])
  ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
  workspace = os.getcwd()

  def read_exact(n):
    data = b""
    while len(data) < n:
      chunk = os.read(req_fd, n - len(data))
      if not chunk:
        raise EOFError
      data += chunk
    return data

  def receive():
    (n,) = struct.unpack(">I", read_exact(4))
    return json.loads(read_exact(n))

  def send(obj):
    data = json.dumps(obj).encode()
    data = struct.pack(">I", len(data)) + data
    while data:
      data = data[os.write(resp_fd, data):]

  config = receive()
  rlimits = [(getattr(resource, k), tuple(v)) for k, v in config["rlimits"].items()]
  env = config["env"]

  def reap():
    while True:
      try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
      except ChildProcessError:
        return
      if pid == 0:
        return

  def kill_all():
    try:
      os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
      pass
    while True:  # killed processes die promptly; reap every one
      try:
        os.waitpid(-1, 0)
      except ChildProcessError:
        return
      except InterruptedError:
        continue

  def limit_child():
    for which, value in rlimits:
      resource.setrlimit(which, value)

  def run(command, timeout):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the command's process: its own group, limits, then bash
      try:
        os.setsid()
        os.dup2(w, 1)
        os.dup2(w, 2)
        fd = os.open("/dev/null", os.O_RDONLY)
        os.dup2(fd, 0)
        os.closerange(3, 1 << 16)
        limit_child()
        os.execve("/bin/bash", ["bash", "-c", command], env)
      finally:
        os._exit(127)
    os.close(w)
    out, total, truncated, timed_out, status = bytearray(), 0, False, False, None
    deadline = time.monotonic() + timeout
    pipe_open = True
    while True:
      if status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
          status = st
      if status is not None and not pipe_open:
        break
      left = deadline - time.monotonic()
      if left <= 0:
        timed_out = status is None
        break
      if not pipe_open:
        time.sleep(min(left, 0.005))
        continue
      ready, _, _ = select.select([r], [], [], min(left, 0.05))
      if ready:
        data = os.read(r, 1 << 16)
        if not data:
          pipe_open = False
          continue
        keep = config["max_output_bytes"] - len(out)
        if keep > 0:
          out += data[:keep]
        total += len(data)
        if total > config["max_output_bytes"]:
          truncated = True
        if total > config["output_limit_bytes"]:
          break
      elif status is not None:
        break  # the command exited; what holds its pipe open is killed below
    os.close(r)
    kill_all()
    if status is None:
      code = None
    elif os.WIFEXITED(status):
      code = os.WEXITSTATUS(status)
    else:
      code = 128 + os.WTERMSIG(status)
    return {"output": out.decode("utf-8", "replace"), "exit_code": code,
            "timed_out": timed_out, "truncated": truncated}

  def resolve(path):
    if not isinstance(path, str) or not path or "\0" in path:
      raise ValueError("a path must be a non-empty string")
    full = os.path.realpath(os.path.join(workspace, path))
    if full != workspace and not full.startswith(workspace + "/"):
      raise ValueError(f"{path}: outside the workspace")
    return full

  def read(path):
    full = resolve(path)
    if not os.path.isfile(full):
      raise ValueError(f"{path}: no such file")
    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
      if os.fstat(fd).st_size > config["max_read_bytes"]:
        raise ValueError(f"{path}: larger than {config['max_read_bytes']} bytes")
      data = os.read(fd, config["max_read_bytes"] + 1)
    finally:
      os.close(fd)
    return data[:config["max_read_bytes"]].decode("utf-8", "replace")

  def write(path, text):
    full = resolve(path)
    if os.path.isdir(full):
      raise ValueError(f"{path}: is a directory")
    os.makedirs(os.path.dirname(full), exist_ok=True)
    fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
      data = text.encode("utf-8")
      while data:
        data = data[os.write(fd, data):]
    finally:
      os.close(fd)

  def files():
    found = []
    for root, dirs, names in os.walk(workspace):
      dirs.sort()
      for name in sorted(names):
        full = os.path.join(root, name)
        if os.path.isfile(full) and not os.path.islink(full):
          # A name that is not UTF-8 is shown with replacement characters (the policy's
          # tools only name files in text).
          rel = os.path.relpath(full, workspace)
          found.append(os.fsencode(rel).decode("utf-8", "replace"))
          if len(found) >= config["max_files"]:
            return found
    return found

  send({"ok": True})
  while True:
    try:
      req = receive()
    except (EOFError, OSError, ValueError):
      return
    op = req.get("op")
    try:
      if op == "exec":
        reply = run(req["command"], float(req["timeout"]))
      elif op == "read":
        reply = {"text": read(req["path"])}
      elif op == "write":
        write(req["path"], req["text"])
        reply = {}
      elif op == "files":
        reply = {"files": files()}
      elif op == "close":
        send({"ok": True})
        return
      else:
        raise ValueError(f"unknown op {op!r}")
    except OSError as e:
      reply = {"ok": False, "error": f"{e.strerror or e}"}
    except ValueError as e:
      reply = {"ok": False, "error": str(e)}
    reply.setdefault("ok", True)
    reap()
    send(reply)


_main()
