"""The config sections of serving and online learning: `serve` (rlcode.serve) and `online`
(rlcode.train.online_loop); rlcode.config.schema composes them into the Config."""

from __future__ import annotations

import dataclasses

from rlcode.fields import key


@dataclasses.dataclass(frozen=True)
class Serve:
  """`rlcode serve`: the OpenAI-compatible server (rlcode.serve).

  Attributes:
    slots: the most candidates decoded at once (a request's n at most).
    batching: "continuous" (requests join and leave the running batch between decode
      steps) or "serial" (one request at a time, on the same engine: a baseline).
    page_size: positions per page of the paged KV cache (rlcode.engine).
    kv_pages: pages in each layer's pool; None: enough for `slots` rows of the whole
      context (the memory a fixed cache per slot would take).
    prefill_tokens: the most prompt tokens prefilled in one engine step (chunked prefill
      beside the decoding rows).
    prefix_cache: keep finished blocks of KV for later prompts that start with them (a
      system prompt, a conversation's earlier turns).
    warmup: while idle, compile every program shape the engine's steps can meet, so that
      requests do not wait for compiles (rlcode.engine.warmup); /metrics counts the shapes
      left (engine_shapes_to_compile).
    model_name: the model's name in the API (/v1/models, requests' "model"); None: "rlcode".
    log_url: the interaction log's SQLAlchemy URL; None: SQLite at workdir/interactions.sqlite.
    max_body_bytes: a request body larger than this is refused (413).
    max_queue: requests waiting for slots beyond this are refused (429).
    default_max_tokens: a chat request's budget when it names none (at most what the
      context leaves).
    max_n: the most candidates one request may ask for (at most `slots`).
    watch_seconds: how often the server looks for newer published weights in
      workdir/published (an online run's); 0: never.
    chat_template: a directory with tokenizer_config.json or chat_template.jinja, or a
      .jinja file, overriding the checkpoint's template; None: the checkpoint's.
    graceful_seconds: on SIGTERM, how long in-flight requests may take to finish.
  """

  slots: int = key(16, ge=1)
  batching: str = key("continuous", choices=("continuous", "serial"))
  page_size: int = key(16, ge=1)
  kv_pages: int | None = key(None, ge=2)
  prefill_tokens: int = key(512, ge=16)
  prefix_cache: bool = key(True)
  warmup: bool = key(True)
  model_name: str | None = key(None)
  log_url: str | None = key(None, only=("sample", "online"))
  max_body_bytes: int = key(1 << 20, ge=1024)
  max_queue: int = key(1024, ge=1)
  default_max_tokens: int = key(256, ge=1)
  max_n: int = key(8, ge=1)
  watch_seconds: float = key(0.2, ge=0, only=("sample", "online"))
  chat_template: str | None = key(None)
  graceful_seconds: float = key(30.0, gt=0)


@dataclasses.dataclass(frozen=True)
class Online:
  """`rlcode learn-online`: updates from the interaction log (rlcode.train.online_loop).

  Attributes:
    init_from: the policy the server starts from and the learner updates (a workdir, its
      warm_start/ or a checkpoint directory); None: config.model as built.
    reward: what a user's feedback pays a candidate: "feedback" (chosen of n: 1 the chosen,
      0 the others; else accepted 1 / rejected 0; else the kept fraction), "chosen",
      "accepted" or "kept" (rows without it are skipped).
    baseline: "ema" (a moving average of the rewards: sound for one sample per prompt) or
      "loo" (the mean of the request's other candidates when it has several, else "ema").
    baseline_decay: the moving average's decay per row.
    batch_rows: candidates per update (a fixed shape: the update compiles once per length).
    max_tokens: candidates' tokens beyond this are left out of the update.
    max_lag: candidates sampled more than this many versions before the learner's are
      skipped (counted): when users send feedback faster than the learner trains, it keeps
      to what recent policies did instead of falling ever further behind; None: keep all.
    poll_seconds: how often the learner looks for new feedback.
  """

  init_from: str | None = key(None)
  reward: str = key("feedback", choices=("feedback", "chosen", "accepted", "kept"))
  baseline: str = key("ema", choices=("ema", "loo"))
  baseline_decay: float = key(0.95, ge=0, lt=1)
  batch_rows: int = key(16, ge=1)
  max_tokens: int = key(128, ge=1)
  max_lag: int | None = key(None, ge=0)
  poll_seconds: float = key(0.5, gt=0)

