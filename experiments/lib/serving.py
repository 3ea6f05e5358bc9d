"""Servers and learners in subprocesses, for the serving experiments: their output kept in a
log file, waits on what they print (never fixed sleeps), SIGTERM then SIGKILL to stop."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time

from experiments.lib import ROOT


class Process:
  """A subprocess whose output is kept; `wait_for(text)` blocks until a line has it."""

  def __init__(self, args, log_path, cwd=ROOT, env=None):
    self.log = open(log_path, "w")
    self.proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
    self.lines: queue.Queue = queue.Queue()
    threading.Thread(target=self._read, daemon=True).start()

  def _read(self):
    for line in self.proc.stdout:
      self.log.write(line)
      self.log.flush()
      self.lines.put(line)
    self.lines.put(None)

  def wait_for(self, text, timeout=600) -> str:
    deadline = time.monotonic() + timeout
    while True:
      line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
      if line is None:
        raise RuntimeError(f"the process ended before saying {text!r}; see {self.log.name}")
      if text in line:
        return line

  def stop(self):
    if self.proc.poll() is None:
      self.proc.send_signal(signal.SIGTERM)
      try:
        self.proc.wait(120)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait()



def start_server(config: str, flags, log_path: str, tree: str = ROOT) -> tuple[Process, str]:
  """`rlcode serve --config CONFIG FLAGS --port 0`; (the process, its base URL) once it listens.

  `tree`: the checkout whose rlcode serves (another commit's worktree, for a baseline that
  HEAD no longer has), run by this interpreter with the tree first on its path."""
  env = None if tree == ROOT else {**os.environ, "PYTHONPATH": tree}
  server = Process([sys.executable, "-m", "rlcode", "serve", "--config", config, *flags,
                    "--port", "0"], log_path, cwd=tree, env=env)
  line = server.wait_for("listening on ")
  url = line.split("listening on ")[1].split()[0]
  compiled(url)
  return server, url


def compiled(url: str, timeout: float = 900.0) -> None:
  """Waits until the server's engine has compiled the shapes its warm-up lists
  (/metrics engine_shapes_to_compile; a server without the key has no warm-up)."""
  import httpx
  deadline = time.time() + timeout
  while time.time() < deadline:
    left = httpx.get(url + "/metrics", timeout=30).json().get("engine_shapes_to_compile", 0)
    if not left:
      return
    time.sleep(1.0)
  raise RuntimeError(f"{url}: still compiling after {timeout:.0f} s")
