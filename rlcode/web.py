"""A uvicorn server on a thread of this process (the in-process OpenAI server, the local
OpenEnv server)."""

from __future__ import annotations

import threading
import time


def start_in_thread(server, sock, name: str, start_timeout: float):
  """(thread, started): the uvicorn `server` listening on the bound `sock` in a daemon
  thread named `name`, and whether it started within `start_timeout` seconds (the caller
  closes it when not)."""
  thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=name,
                            daemon=True)
  thread.start()
  deadline = time.monotonic() + start_timeout
  while not server.started:  # uvicorn offers no event to wait on
    if not thread.is_alive() or time.monotonic() > deadline:
      return thread, False
    time.sleep(0.01)
  return thread, True
