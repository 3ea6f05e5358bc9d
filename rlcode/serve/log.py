"""The interaction log: every served completion and what its user did with it.

Two tables through SQLAlchemy Core, so any SQLAlchemy URL works (SQLite in the workdir by
default, PostgreSQL for several servers sharing one log):

  completions  one row per candidate: (completion id, index) -> prompt and completion
               tokens, the behaviour log-probs, the policy version, the sampling
               parameters, the text, the finish reason, the time
  feedback     one row per completion id, in arrival order (`seq`): accepted, rejected,
               kept fraction, the final edited text, the chosen candidate

Each write is one transaction committed before the caller answers (SQLite in WAL mode
with synchronous=FULL: a reply sent means the row survives a crash). Feedback is
idempotent by id: the same body again is a no-op, a different body for an id already
recorded is refused (`Conflict`). The learner (rlcode.train.online_loop) reads feedback
rows after a cursor (`seq`) with their completions. This module must not know about HTTP
or training.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

METADATA = sa.MetaData()
COMPLETIONS = sa.Table(
    "completions", METADATA,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("idx", sa.Integer, primary_key=True),
    sa.Column("created", sa.Float, nullable=False),
    sa.Column("policy_version", sa.Integer, nullable=False),
    sa.Column("model", sa.String(256), nullable=False),
    sa.Column("prompt_tokens", sa.Text, nullable=False),
    sa.Column("tokens", sa.Text, nullable=False),
    sa.Column("logprobs", sa.Text, nullable=False),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("finish_reason", sa.String(16), nullable=False),
    sa.Column("params", sa.Text, nullable=False),
    sa.Column("n", sa.Integer, nullable=False),
)
FEEDBACK = sa.Table(
    "feedback", METADATA,
    sa.Column("seq", sa.Integer, sa.Identity(), primary_key=True),
    sa.Column("id", sa.String(64), nullable=False, unique=True),
    sa.Column("created", sa.Float, nullable=False),
    sa.Column("accepted", sa.Boolean, nullable=True),
    sa.Column("kept", sa.Float, nullable=True),
    sa.Column("chosen", sa.Integer, nullable=True),
    sa.Column("index", sa.Integer, nullable=True),
    sa.Column("final_text", sa.Text, nullable=True),
    sa.Column("body", sa.Text, nullable=False),
)


class UnknownCompletion(KeyError):
  """Feedback names a completion the log does not hold."""


class Conflict(ValueError):
  """Feedback for an id already recorded, with a different body."""


@dataclasses.dataclass(frozen=True)
class Served:
  """One candidate of a served completion."""

  id: str
  index: int
  policy_version: int
  model: str
  prompt_tokens: Sequence[int]
  tokens: Sequence[int]
  logprobs: Sequence[float]
  text: str
  finish_reason: str
  params: Mapping[str, Any]
  n: int


def default_url(workdir: str) -> str:
  return "sqlite:///" + os.path.abspath(os.path.join(workdir, "interactions.sqlite"))


def _sqlite_pragmas(dbapi_connection, _record):
  cursor = dbapi_connection.cursor()
  cursor.execute("PRAGMA journal_mode=WAL")
  cursor.execute("PRAGMA synchronous=FULL")
  cursor.execute("PRAGMA busy_timeout=30000")
  cursor.close()


class InteractionLog:
  """The log at a SQLAlchemy URL; tables are created when missing."""

  def __init__(self, url: str):
    self.url = url
    if url.startswith("sqlite:///"):
      os.makedirs(os.path.dirname(os.path.abspath(url[len("sqlite:///"):])) or ".", exist_ok=True)
    self.engine = sa.create_engine(url, pool_pre_ping=True)
    if self.engine.dialect.name == "sqlite":
      sa.event.listen(self.engine, "connect", _sqlite_pragmas)
    METADATA.create_all(self.engine)

  def close(self) -> None:
    self.engine.dispose()

  # ------------------------------------------------------------ the server's writes
  def record(self, candidates: Sequence[Served]) -> None:
    """The candidates of one completion, in one transaction."""
    now = time.time()
    rows = [{"id": c.id, "idx": c.index, "created": now, "policy_version": c.policy_version,
             "model": c.model, "prompt_tokens": json.dumps(list(map(int, c.prompt_tokens))),
             "tokens": json.dumps(list(map(int, c.tokens))),
             "logprobs": json.dumps([float(x) for x in c.logprobs]), "text": c.text,
             "finish_reason": c.finish_reason, "params": json.dumps(dict(c.params)),
             "n": c.n} for c in candidates]
    with self.engine.begin() as conn:
      conn.execute(COMPLETIONS.insert(), rows)

  def feedback(self, body: Mapping[str, Any]) -> bool:
    """Records a feedback body ({"id", and any of accepted, rejected, kept, chosen, index,
    final_text}; checked by the caller); True when new, False when the same body was
    already recorded. Raises UnknownCompletion or Conflict."""
    fid = body["id"]
    canonical = json.dumps(dict(body), sort_keys=True)
    with self.engine.begin() as conn:
      n = conn.execute(sa.select(sa.func.max(COMPLETIONS.c.n)).where(
          COMPLETIONS.c.id == fid)).scalar()
      if n is None:
        raise UnknownCompletion(fid)
      for key in ("chosen", "index"):
        if body.get(key) is not None and not 0 <= body[key] < n:
          raise ValueError(f"{key}={body[key]} is not a candidate of {fid} (n={n})")
      old = conn.execute(sa.select(FEEDBACK.c.body).where(FEEDBACK.c.id == fid)).scalar()
      if old is not None:
        if old == canonical:
          return False
        raise Conflict(f"feedback for {fid} is already recorded with another body")
      accepted = body.get("accepted")
      if body.get("rejected") is not None:
        accepted = not body["rejected"] if accepted is None else accepted
      try:
        conn.execute(FEEDBACK.insert().values(
            id=fid, created=time.time(), accepted=accepted, kept=body.get("kept"),
            chosen=body.get("chosen"), index=body.get("index"),
            final_text=body.get("final_text"), body=canonical))
      except sa.exc.IntegrityError:  # another server recorded it between our read and write
        raise Conflict(f"feedback for {fid} was recorded concurrently") from None
    return True

  # ------------------------------------------------------------ the learner's reads
  def feedback_after(self, seq: int, limit: int) -> list[dict]:
    """Up to `limit` feedback rows with seq > `seq`, in order, each with its completion's
    candidates ("candidates": index-ordered dicts with tokens, logprobs, params...)."""
    with self.engine.connect() as conn:
      rows = conn.execute(sa.select(FEEDBACK).where(FEEDBACK.c.seq > seq)
                          .order_by(FEEDBACK.c.seq).limit(limit)).mappings().all()
      out = []
      for row in rows:
        cands = conn.execute(sa.select(COMPLETIONS).where(COMPLETIONS.c.id == row["id"])
                             .order_by(COMPLETIONS.c.idx)).mappings().all()
        out.append({**row, "candidates": [_candidate(c) for c in cands]})
    return out

  def counts(self) -> dict[str, int]:
    with self.engine.connect() as conn:
      return {"completions": conn.execute(sa.select(sa.func.count()).select_from(
                  sa.select(COMPLETIONS.c.id).distinct().subquery())).scalar(),
              "candidates": conn.execute(sa.select(sa.func.count()).select_from(
                  COMPLETIONS)).scalar(),
              "feedback": conn.execute(sa.select(sa.func.count()).select_from(
                  FEEDBACK)).scalar()}


def _candidate(row) -> dict:
  out = dict(row)
  for key in ("prompt_tokens", "tokens", "logprobs", "params"):
    out[key] = json.loads(out[key])
  return out
