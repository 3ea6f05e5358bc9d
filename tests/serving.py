"""Starting `rlcode serve` in a subprocess for the tests: a tiny policy taught one tool call,
a ChatML template, a loopback port the OS picks, and waits on conditions, never sleeps."""

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import httpx

from chat_templates import write_tokenizer_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "online_tiny.py") + ":test"
MODEL = "rlcode-tiny"
KEY = "test-key-0123456789"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def config(workdir, *overrides):
  from rlcode.config import loader
  return loader.load_config(CONFIG, [f"--config.workdir={workdir}", *overrides])


def taught_policy(workdir):
  """The test config's policy after 150 supervised steps on one chat (ASK through the ChatML
  template, answered by CALL), published as version 1 in workdir/published (where the
  server starts from); returns (model, tokenizer, template dir)."""
  from flax import nnx

  from rlcode import optim
  from rlcode.data.tasks import Task
  from rlcode.models import chat_template
  from rlcode.models.build import build_model
  from rlcode.parallel import sharding
  from rlcode.serve import weights
  from rlcode.policy import sft
  template_dir = write_tokenizer_dir(os.path.join(workdir, "template"), "chatml")
  cfg = config(workdir)
  mesh = sharding.make_mesh()
  model, tokenizer = build_model(cfg.model, mesh, cfg.seed)
  prompt = chat_template.load_chat_template(template_dir).render(ASK, add_generation_prompt=True)
  graphdef, params = nnx.split(model, nnx.Param)
  params, _ = sft.run(graphdef, params, [Task(id="call", prompt=prompt, reference=CALL)] * 8,
                      tokenizer, mesh, optimizer=optim.OptimizerConfig(
                          learning_rate=1e-2, warmup_steps=5, decay_steps=150),
                      batch_size=8, seed=0, steps=150)
  weights.publish(os.path.join(workdir, "published"), 1, params)
  return nnx.merge(graphdef, params), tokenizer, template_dir


class ServeProcess:
  """A `rlcode serve` subprocess: its output read on a thread, `url` once it prints
  `listening on` (bounded in time), stopped by SIGTERM, then SIGKILL after 60 s."""

  def __init__(self, args, cwd, env=None, timeout=240):
    self.proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
    self.lines: queue.Queue = queue.Queue()
    self.output: list[str] = []
    threading.Thread(target=self._read, daemon=True).start()
    self.url = self._wait_listening(timeout)

  def _read(self):
    for line in self.proc.stdout:
      self.output.append(line)
      self.lines.put(line)
    self.lines.put(None)

  def _wait_listening(self, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      try:
        line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
      except queue.Empty:
        break
      if line is None:
        break
      if "listening on " in line:
        return line.split("listening on ")[1].split()[0]
    self.stop()
    raise RuntimeError(f"{args_text(self.proc.args)}: the server did not start:\n"
                       + "".join(self.output))

  def signal(self, sig):
    self.proc.send_signal(sig)

  def wait(self, timeout=120):
    return self.proc.wait(timeout)

  def stop(self) -> bool:
    """True when SIGTERM alone stopped it (uvicorn, once shut down, raises the signal it
    caught again: -SIGTERM is its clean exit)."""
    if self.proc.poll() is None:
      self.proc.send_signal(signal.SIGTERM)
      try:
        self.proc.wait(60)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait()
        return False
    return self.proc.returncode in (0, -signal.SIGTERM)


def args_text(args) -> str:
  return " ".join(map(str, args))


class Server(ServeProcess):
  """A running `rlcode serve` of the online config's test variant in `workdir`."""

  def __init__(self, workdir, *overrides, api_key=KEY):
    self.workdir = workdir
    args = [sys.executable, "-m", "rlcode.cli", "serve", "--config", CONFIG,
            f"--config.workdir={workdir}", "--port", "0", *overrides]
    if api_key:
      key_file = os.path.join(workdir, "api_key")
      os.makedirs(workdir, exist_ok=True)
      with open(key_file, "w") as f:
        f.write(api_key + "\n")
      args += ["--api-key-file", key_file]
    super().__init__(args, ROOT)
    self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

  def client(self, **kw):
    return httpx.Client(base_url=self.url, headers=self.headers, timeout=120, **kw)

  def openai(self):
    import openai
    return openai.OpenAI(base_url=self.url + "/v1", api_key=KEY, timeout=120, max_retries=0)


@contextlib.contextmanager
def running(workdir, *overrides, api_key=KEY):
  server = Server(workdir, *overrides, api_key=api_key)
  try:
    yield server
  finally:
    server.stop()
