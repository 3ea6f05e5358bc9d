"""`rlcode serve`: the policy of a config or a checkpoint, behind the HTTP API, under uvicorn.

    rlcode serve --checkpoint WORKDIR [--host 127.0.0.1] [--port 8000] [--api-key-file F]
    rlcode serve --config configs/online_tiny.py [--config.serve.slots=32 ...]

What is served: `--checkpoint` the latest policy of a grpo, agent or online run's workdir
(or its warm_start/), built by the run's recorded config, with the schema's serve defaults
where that config has no serve section (a reward model's workdir is refused); `--config`
the config's model as built (model.hf_path, or the arch from config.seed). An online run
(trainer "online") starts from the newest version published in its workdir/published,
else online.init_from, and swaps in each version its learner publishes. The server listens
on one socket it binds itself (port 0: the OS chooses) and prints `listening on
http://HOST:PORT` once it answers; SIGTERM (or Ctrl-C) stops taking connections and lets
the requests in flight finish (serve.graceful_seconds) before it exits.

Uvicorn under FastAPI (docs/design.md says why). One process, one engine thread, one
device: the policies served here fit one.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
import sys
from typing import Any

import ml_collections

from rlcode.config import record, serving
from rlcode.errors import BadInput, MissingInput
from rlcode.models import chat_template
from rlcode.models.build import build_model
from rlcode.models.tokenizer import split_tokenizer_name
from rlcode.policy import policy_eval
from rlcode.parallel import sharding
from rlcode import engine as engine_lib
from rlcode.serve import log as log_lib
from rlcode.serve import weights

log = logging.getLogger(__name__)
PUBLISHED = "published"


def published_dir(workdir: str) -> str:
  """Where a run in `workdir` publishes its policy versions."""
  return os.path.join(workdir, PUBLISHED)


def initial_policy(init: str | None, model_cfg, seed: int, mesh):
  """(model, tokenizer, where from) an online run starts from: the run at `init`
  (online.init_from, with its recorded config), else `model_cfg` (config.model) as built
  from `seed`."""
  if init:
    model, tokenizer, step, where = policy_eval.restore_run(init, mesh, "online.init_from")
    return model, tokenizer, f"{where}@{step}"
  model, tokenizer = build_model(model_cfg, mesh, seed)
  return model, tokenizer, "config.model"


def serve_section(serve):
  """A config's serve section, or the schema's defaults where it has none (None: the
  recorded config of a grpo or agent run, whose trainer reads no serve section)."""
  if serve is not None:
    return serve
  return ml_collections.ConfigDict(dataclasses.asdict(serving.Serve()))


def checkpoint_config(checkpoint: str):
  """The recorded config of the run `--checkpoint` names; a run that trained no policy
  (a reward model's) is refused."""
  saved = record.recorded_config(checkpoint, "--checkpoint")
  if saved.trainer == "rm":
    raise BadInput(f"--checkpoint {checkpoint!r} is a reward model's run (trainer 'rm'): it "
                   "scores completions and writes none; serve a policy's workdir (a grpo, "
                   "agent or online run)")
  return saved


@dataclasses.dataclass
class Loaded:
  """What `rlcode serve` serves, before its engine starts: the policy and where it came
  from, the serve section, the chat template, the interaction log (checked and open) and
  the directory of published versions."""

  model: Any
  tokenizer: Any
  version: int
  source: str
  serve: Any
  template: chat_template.ChatTemplate | None
  log: log_lib.InteractionLog
  publish_dir: str | None


def model_identity(name: str, model_cfg, seed: int, init_from: str | None = None
                   ) -> dict[str, Any]:
  """What the interaction log records as its model, so that one log never mixes two
  policies' completions: the served name, the model section's (config.model)
  architecture, weights, tokenizer, adapters and dtype, the seed of weights built from
  scratch, and an online run's starting point (`init_from`: online.init_from). A
  checkpoint's step is not part of it: a run's later checkpoint is the same policy,
  trained further."""
  model = record.plain(model_cfg)
  ident = {"name": name, **{k: model[k] for k in ("arch", "hf_path", "tokenizer", "lora",
                                                  "param_dtype")}}
  if not model["hf_path"]:
    ident["seed"] = seed
  if init_from is not None:
    ident["init_from"] = init_from
  return ident



def open_log(url: str, model: dict[str, Any], move_aside: bool = False):
  """The interaction log at `url`, checked (rlcode.serve.log); a refused one is renamed
  aside (its new path printed) and a new one begun only when `move_aside`."""
  try:
    return log_lib.InteractionLog(url, model)
  except log_lib.LogRefused as e:
    if not move_aside:
      raise
    refused = e.message.split(";")[0]
  aside = log_lib.move_aside(url)
  print(f"rlcode serve: {refused}: moved aside to {aside}; a new log begins", file=sys.stderr,
        flush=True)
  return log_lib.InteractionLog(url, model)


def load(config, checkpoint: str | None = None, move_log_aside: bool = False) -> Loaded:
  """The policy of `checkpoint` (a workdir of any policy trainer, or its warm_start/; with
  its recorded config) or else of `config`, and how to serve it: `config`'s serve section
  when given, else the run's, else the schema's defaults. The interaction log is checked
  before the policy is restored."""
  from flax import nnx

  if checkpoint:
    policy_cfg, workdir = checkpoint_config(checkpoint), _workdir_of(checkpoint)
  else:
    policy_cfg, workdir = config, config.workdir
  given = config if config is not None else policy_cfg
  serve = serve_section(given.serve if "serve" in given else None)
  init = policy_cfg.online.init_from if policy_cfg.trainer == "online" else None
  identity = model_identity(serve.model_name or "rlcode", policy_cfg.model, policy_cfg.seed,
                            init)
  store = open_log(serve.log_url or log_lib.default_url(workdir), identity, move_log_aside)
  try:
    mesh = sharding.make_mesh()  # one device: the engine's programs are single-device
    if checkpoint:
      recipe = policy_eval.Recipe.of(policy_cfg.model, policy_cfg.optimizer, policy_cfg.rl,
                                     policy_cfg.seed)
      model, tokenizer, step, where = policy_eval.restore_policy(recipe, checkpoint, mesh)
      source = f"{where}@{step}"
    elif config.trainer == "online":
      model, tokenizer, source = initial_policy(config.online.init_from, config.model,
                                                config.seed, mesh)
    else:
      model, tokenizer = build_model(config.model, mesh, config.seed)
      source = "config.model"
    version = 0
    # An online run's server swaps in what its learner publishes, from the start.
    publish_dir = os.path.join(workdir, PUBLISHED) if policy_cfg.trainer == "online" else None
    newest = weights.newest(publish_dir) if publish_dir else None
    if newest is not None:
      graphdef, state = nnx.split(model)
      model = nnx.merge(graphdef, weights.load(publish_dir, newest, state))
      version, source = newest, f"{publish_dir}@{newest}"
    template = template_for(serve, policy_cfg.model)
  except BaseException:
    store.close()
    raise
  return Loaded(model=model, tokenizer=tokenizer, version=version, source=source,
                serve=serve, template=template, log=store, publish_dir=publish_dir)


def template_for(serve, model_cfg):
  """The chat template: serve.chat_template, else the checkpoint's or tokenizer's
  directory's (model.hf_path, model.tokenizer), else None (the compact fallback)."""
  if serve.chat_template:
    path = serve.chat_template
    if path.endswith(".jinja") and os.path.isfile(path):
      with open(path, encoding="utf-8") as f:
        return chat_template.ChatTemplate({"default": f.read()}, {})
    found = chat_template.load_chat_template(path)
    if found is None:
      raise MissingInput(f"serve.chat_template={path!r}: no chat template there")
    return found
  for path in (model_cfg.hf_path,
               split_tokenizer_name(model_cfg.tokenizer)[0] if model_cfg.tokenizer else None):
    if path and os.path.isdir(path):
      found = chat_template.load_chat_template(path)
      if found is not None:
        return found
  return None


def start_engine(model, serve: serving.Serve, version: int = 0) -> engine_lib.Engine:
  """The served engine, started: enough pages for every slot's whole context unless
  `serve.kv_pages` says how many."""
  pages = serve.kv_pages or serve.slots * math.ceil(model.cfg.max_seq_len
                                                   / serve.page_size) + 1
  return engine_lib.Engine(model, num_pages=pages, page_size=serve.page_size,
                           max_rows=serve.slots, prefill_tokens=serve.prefill_tokens,
                           prefix_cache=serve.prefix_cache, version=version,
                           mode=serve.batching, warmup=serve.warmup).start()


def chat_stop_ids(tokenizer, template) -> tuple[int, ...]:
  """Where a chat completion stops: the tokenizer's end tokens and the template's own."""
  stops = tuple(tokenizer.eos_ids)
  eos = template.special_tokens.get("eos_token") if template is not None else None
  eos_id = tokenizer.special_id(eos) if eos else None
  return stops + (eos_id,) if eos_id is not None and eos_id not in stops else stops


def build(config, checkpoint: str | None = None, api_key: str | None = None,
          move_log_aside: bool = False):
  """The app's `Served`: what `load` finds, its engine started and warmed up on one
  request."""
  from rlcode.serve.app import Served  # deferred: FastAPI (the serve extra), only to serve
  got = load(config, checkpoint, move_log_aside)
  serve, tokenizer, template = got.serve, got.tokenizer, got.template
  eng = start_engine(got.model, serve, got.version)
  chat_stops = chat_stop_ids(tokenizer, template)
  served = Served(
      engine=eng, tokenizer=tokenizer, template=template,
      name=serve.model_name or "rlcode",
      log=got.log,
      serve=serve, api_key=api_key, publish_dir=got.publish_dir,
      stop_ids=tuple(tokenizer.eos_ids), chat_stop_ids=chat_stops)
  warm_up(eng)
  log.info("serving %s (policy version %d)", got.source, got.version)
  return served


def warm_up(eng: engine_lib.Engine) -> None:
  """One request through the engine, so the first client does not wait for compiles of
  the step and of the smallest prefill."""
  import threading
  done = threading.Event()
  eng.submit(engine_lib.Request(prompt=[0], max_tokens=2, temperature=0.0,
                                on_done=lambda r: done.set()))
  done.wait()


def _workdir_of(checkpoint: str) -> str:
  path = os.path.abspath(checkpoint)
  for where in (path, os.path.dirname(path)):
    if os.path.isfile(os.path.join(where, "config.json")):
      return where
  return path


def read_api_key(path: str | None) -> str | None:
  if not path:
    return None
  if not os.path.isfile(path):
    raise MissingInput(f"--api-key-file {path!r}: no such file")
  with open(path, encoding="utf-8") as f:
    key = f.read().strip()
  if not key:
    raise BadInput(f"--api-key-file {path!r} is empty")
  return key


def serve(config, *, checkpoint: str | None, host: str, port: int,
          api_key_file: str | None, move_log_aside: bool = False) -> None:
  """Runs the server until SIGTERM or SIGINT; `move_log_aside`: a refused interaction log
  is renamed aside and a new one begun (`open_log`)."""
  import uvicorn

  from rlcode.serve.app import create_app  # deferred: FastAPI (the serve extra)
  api_key = read_api_key(api_key_file)
  sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    sock.bind((host, port))
  except OSError as e:
    raise BadInput(f"--host {host} --port {port}: cannot listen there ({e.strerror})") from None
  served = build(config, checkpoint, api_key, move_log_aside)
  app = create_app(served)

  class Announcing(uvicorn.Server):
    async def startup(self, sockets=None):
      await super().startup(sockets)
      bound = sock.getsockname()
      print(f"rlcode serve: listening on http://{bound[0]}:{bound[1]} "
            f"(policy version {served.engine.version})", flush=True)

  server = Announcing(uvicorn.Config(
      app, log_level="warning", timeout_graceful_shutdown=int(served.serve.graceful_seconds),
      access_log=False, lifespan="on"))
  server.run(sockets=[sock])
