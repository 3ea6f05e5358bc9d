"""Serving the policy over HTTP and learning online from what users do with it.

  protocol.py    the OpenAI request bodies, checked
  bodies.py      the error object, and a body's shape checked before its fields
  constrain.py   the grammar a request's output must follow (response_format, tool_choice)
  episodes.py    harness episodes: the X-Episode-Id header, /v1/episodes (rlcode.harness)
  responses.py   sampled tokens to response objects: text, stop strings, tool calls, log-probs
  app.py         the FastAPI app: completions, chat, models, feedback, health, metrics
  server.py      `rlcode serve`: what is served, under uvicorn
  local.py       a policy served inside a training process on a loopback port (harness rollouts)
  log.py         the interaction log (SQLAlchemy: SQLite by default, any URL)
  weights.py     published policy versions (the learner writes, the server swaps in)
  users.py       simulated users: choose among candidates by a hidden utility, report it

Requests are sampled by rlcode.engine (paged KV, continuous batching, weights swapped
between steps). The learner that reads the log is rlcode.train.online_loop (`rlcode
learn-online`).
"""
