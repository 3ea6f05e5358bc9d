"""The interaction log: every served completion and what its user did with it.

Two tables through SQLAlchemy Core, so any SQLAlchemy URL works (SQLite in the workdir by
default, PostgreSQL for several servers sharing one log):

  completions  one row per candidate: (completion id, index) -> prompt and completion
               tokens, the behaviour log-probs, the policy version, the sampling
               parameters, the text, the finish reason, the time
  feedback     one row per completion id, in arrival order (`seq`): accepted, rejected,
               kept fraction, the final edited text, the chosen candidate

Each write is committed before the caller answers (SQLite in WAL mode with
synchronous=FULL: a reply sent means the row survives a crash). Completions that finish
together are committed together (group commit: one transaction, one sync to disk, for
every completion that was waiting when the last commit ended); a group that fails is
committed again completion by completion, so a bad one fails alone. Feedback is
idempotent by id: the same body again is a no-op, a different body for an id already
recorded is refused (`Conflict`). The learner (rlcode.train.online_loop) reads feedback
rows after a cursor (`seq`) with their completions.

A third table, `rlcode_log`, holds what the log is: its schema version, a random id made
with it (a learner's cursor belongs to one log), and the model whose completions it holds.
Opening a log checks, before anything is written: for SQLite, that the file is not empty,
begins with SQLite's header and passes `PRAGMA quick_check` (PostgreSQL checks its own
pages; there quick_check does not apply); for both, that the tables present are the
log's, with its columns, of this schema version and of the same model. A log that fails is
refused (`LogRefused`, one line naming it and what to do), never replaced: `move_aside`
renames a SQLite log (with its WAL files) so that a new one can start beside it. Only
SQLite's own word for pages it cannot read ("malformed", "not a database") is damage: a
database that refuses the connection, a SQLite file still locked by another writer after
the busy timeout, a file or folder the process cannot open or make (and any OSError
there) is `LogUnavailable`, one line naming the cause, with nothing to restore or move
aside. Two processes creating the tables at once both go on with the tables one made. A
log written before the version table existed, with today's columns, is adopted as
version 1. This module must not know about HTTP or training.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from rlcode.errors import BadInput

# The layout of the tables below; a log of another version is refused, not migrated.
SCHEMA_VERSION = 1
SQLITE_HEADER = b"SQLite format 3\x00"
MOVE_ASIDE_FLAG = "--move-log-aside"
METADATA = sa.MetaData()
META = sa.Table(
    "rlcode_log", METADATA,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)
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


class LogRefused(BadInput):
  """An interaction log that is damaged, of another schema version or of another model:
  nothing is written to it."""


class LogUnavailable(BadInput):
  """An interaction log that cannot be reached, opened or locked now; nothing says it is
  damaged (so it is never moved aside) and nothing was written to it."""


# What SQLite says of pages it cannot read (SQLITE_CORRUPT and SQLITE_NOTADB): the only
# database errors that mean the file is damaged.
_SQLITE_DAMAGE = ("malformed", "not a database")


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


def sqlite_path(url: str) -> str | None:
  """The file of a SQLite URL; None for another database or an in-memory one."""
  if not url.startswith("sqlite:///") or url in ("sqlite:///", "sqlite:///:memory:"):
    return None
  return url[len("sqlite:///"):].split("?")[0]


def move_aside(url: str) -> str:
  """Renames a SQLite log (and its -wal and -shm files) to PATH.aside-TIME; returns the
  new path of the log file."""
  path = sqlite_path(url)
  if path is None:
    raise BadInput(f"{MOVE_ASIDE_FLAG}: {url!r} is not a SQLite file; a PostgreSQL log is "
                   "set aside in the database (drop or rename its completions, feedback and "
                   "rlcode_log tables)")
  aside = f"{path}.aside-{time.strftime('%Y%m%d-%H%M%S')}"
  while os.path.exists(aside):
    aside += "x"
  moved = []
  for suffix in ("-wal", "-shm", ""):  # the log file last: a crash midway leaves it found
    if os.path.exists(path + suffix):
      try:
        os.replace(path + suffix, aside + suffix)
      except OSError as e:
        # The files already moved go back: a log without its -wal would lose its last rows.
        for done in reversed(moved):
          os.replace(aside + done, path + done)
        raise LogUnavailable(f"{MOVE_ASIDE_FLAG}: cannot rename {path + suffix} to "
                             f"{aside + suffix} ({e.strerror}); the log is where it was"
                             ) from None
      moved.append(suffix)
  return aside


def _sqlite_pragmas(busy_timeout_s: float):
  def on_connect(dbapi_connection, _record):
    cursor = dbapi_connection.cursor()
    # First: the journal-mode switch below already waits on another writer's lock.
    cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.close()
  return on_connect


def _refuse(where: str, what: str) -> LogRefused:
  return LogRefused(f"interaction log {where}: {what}; nothing was written to it: restore it "
                    f"from a copy, point serve.log_url elsewhere, or run `rlcode serve "
                    f"{MOVE_ASIDE_FLAG}` to rename it aside (kept, its new path printed) and "
                    "begin a new log")


def _unavailable(where: str, what: str) -> LogUnavailable:
  return LogUnavailable(f"interaction log {where}: {what}; nothing was written to it")


def _failure(where: str, dialect: str, busy_timeout_s: float,
             e: sa.exc.DBAPIError) -> BadInput:
  """A database error while opening the log, as damage (`LogRefused`) only when SQLite
  says its pages cannot be read."""
  said = " ".join(str(e.orig).split())
  name = "SQLite" if dialect == "sqlite" else dialect
  if dialect == "sqlite" and any(word in said for word in _SQLITE_DAMAGE):
    return _refuse(where, f"is damaged (SQLite: {said})")
  if dialect == "sqlite" and "locked" in said:
    return _unavailable(where, f"is locked by another process past the busy timeout of "
                        f"{busy_timeout_s:g} s (SQLite: {said}): stop the other writer or "
                        "try again")
  if dialect == "sqlite" and "unable to open" in said:
    return _unavailable(where, f"cannot be opened (SQLite: {said}): check that its folder "
                        "exists and that this user may read and write there")
  return _unavailable(where, f"cannot be opened ({name}: {said}): check that the database "
                      "is running, reachable at serve.log_url and open to this user")


def _check_sqlite_file(path: str) -> None:
  """Refuses a file that SQLite would read as an empty database or not read at all."""
  if not os.path.exists(path):
    return
  if not os.path.isfile(path):
    raise _refuse(path, "is not a file")
  try:
    with open(path, "rb") as f:
      head = f.read(len(SQLITE_HEADER))
  except OSError as e:
    raise _unavailable(path, f"cannot be read ({e.strerror})") from None
  if not head and not os.path.exists(path + "-wal"):
    raise _refuse(path, "is empty (0 bytes): its rows are gone")
  if head and head != SQLITE_HEADER:
    raise _refuse(path, f"does not begin with SQLite's header (found {head[:16]!r})")


@dataclasses.dataclass
class _Pending:
  """One completion's rows waiting for a group commit: done once committed or refused
  (`error`)."""

  rows: list[dict]
  done: bool = False
  error: BaseException | None = None


class InteractionLog:
  """The log at a SQLAlchemy URL: checked as the module docstring says, its tables created
  when the database holds none. `model`: what identifies the policy whose completions it
  holds (stored in a new log, compared with an existing one's); None: not checked (a
  reader such as a test or an analysis). `busy_timeout_s`: how long a SQLite write waits
  on another writer's lock before it fails."""

  def __init__(self, url: str, model: Mapping[str, Any] | None = None, *,
               busy_timeout_s: float = 30.0):
    self.url, self.busy_timeout_s = url, busy_timeout_s
    path = sqlite_path(url)
    self.where = path or sa.engine.make_url(url).render_as_string(hide_password=True)
    if path is not None:
      _check_sqlite_file(path)
      folder = os.path.dirname(os.path.abspath(path))
      try:
        os.makedirs(folder, exist_ok=True)
      except OSError as e:
        why = "a file is there" if isinstance(e, FileExistsError) else e.strerror
        raise _unavailable(path, f"its folder {folder} cannot be made ({why})") from None
    self.engine = sa.create_engine(url, pool_pre_ping=True)
    # Group commit (`record`): completions waiting for the next transaction, and the lock
    # its writer holds while it commits them.
    self._waiting: list[_Pending] = []
    self._waiting_lock, self._commit_lock = threading.Lock(), threading.Lock()
    if self.engine.dialect.name == "sqlite":
      sa.event.listen(self.engine, "connect", _sqlite_pragmas(busy_timeout_s))
    try:
      self._check(model)
    except BaseException:
      self.engine.dispose()
      raise

  def _check(self, model: Mapping[str, Any] | None) -> None:
    try:
      if self.engine.dialect.name == "sqlite":
        with self.engine.connect() as conn:
          found = [r[0] for r in conn.exec_driver_sql("PRAGMA quick_check").fetchall()]
        if found != ["ok"]:
          raise _refuse(self.where, f"fails SQLite's quick_check ({'; '.join(found[:2])})")
      tables = set(sa.inspect(self.engine).get_table_names())
      ours = {t.name for t in METADATA.sorted_tables}
      if not tables & ours:
        others = sorted(tables)
        if others and self.engine.dialect.name == "sqlite":
          raise _refuse(self.where, f"holds other tables ({', '.join(others[:5])}), not an "
                        "interaction log")
        tables |= self._create_tables()
      self._check_tables(tables & ours)
      self.log_id = self._check_meta(model)
    except sa.exc.DBAPIError as e:
      raise _failure(self.where, self.engine.dialect.name, self.busy_timeout_s, e) from None

  def _create_tables(self) -> set[str]:
    """Creates the log's tables; the names of those present after."""
    try:
      METADATA.create_all(self.engine)
    except (sa.exc.OperationalError, sa.exc.ProgrammingError, sa.exc.IntegrityError) as e:
      # Another process made them between our look and our create (SQLite and PostgreSQL
      # say "already exists"; PostgreSQL may instead trip over its catalog's unique
      # index): use theirs.
      if "already exists" not in str(e.orig) and not isinstance(e, sa.exc.IntegrityError):
        raise
      METADATA.create_all(self.engine)  # checks first: makes only what is still missing
    return set(sa.inspect(self.engine).get_table_names())

  def _check_tables(self, present: set[str]) -> None:
    """Every table of the log with exactly its columns (a partial log is refused)."""
    if not present:
      return
    inspector = sa.inspect(self.engine)
    data = {"completions", "feedback"}
    for table in METADATA.sorted_tables:
      if table.name not in present:
        if table is META and data <= present:
          continue  # a log from before the version table: adopted below if its columns fit
        raise _refuse(self.where, f"lacks its {table.name} table (it has "
                      f"{', '.join(sorted(present))})")
      columns = {c["name"] for c in inspector.get_columns(table.name)}
      if columns != {c.name for c in table.columns}:
        raise _refuse(self.where, f"its {table.name} table has columns {sorted(columns)}, "
                      f"schema version {SCHEMA_VERSION}'s are {sorted(table.c.keys())}")
    META.create(self.engine, checkfirst=True)

  def _check_meta(self, model: Mapping[str, Any] | None) -> str:
    """The log's id, after its version and model are checked (and stamped where absent)."""
    want = {"schema_version": str(SCHEMA_VERSION), "log_id": uuid.uuid4().hex}
    if model is not None:
      want["model"] = json.dumps(dict(model), sort_keys=True)
    have = self._meta()
    missing = [{"key": k, "value": v} for k, v in want.items() if k not in have]
    if missing:
      try:
        with self.engine.begin() as conn:
          conn.execute(META.insert(), missing)
      except sa.exc.IntegrityError:  # another server stamped it first: theirs stands
        pass
      have = self._meta()
    if have["schema_version"] != str(SCHEMA_VERSION):
      raise _refuse(self.where, f"is of schema version {have['schema_version']}, this rlcode "
                    f"writes version {SCHEMA_VERSION}")
    if model is not None and have["model"] != want["model"]:
      theirs, ours = json.loads(have["model"]), json.loads(want["model"])
      differ = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
      shown = "; ".join(f"{k}: {theirs.get(k)!r} there, {ours.get(k)!r} here"
                        for k in differ[:2])
      raise _refuse(self.where, f"holds another model's completions ({shown})")
    return have["log_id"]

  def _meta(self) -> dict[str, str]:
    with self.engine.connect() as conn:
      return dict(conn.execute(sa.select(META.c.key, META.c.value)).all())

  def close(self) -> None:
    self.engine.dispose()

  # ------------------------------------------------------------ the server's writes
  def record(self, candidates: Sequence[Served]) -> None:
    """The candidates of one completion, all or none, committed when this returns.

    Threads that record at once share a transaction: each queues its rows, then takes the
    commit lock; the first to get it commits every queued completion, and the others
    find theirs done. If that transaction fails, each completion in it is committed in a
    transaction of its own, so only a bad one raises (in its own caller)."""
    now = time.time()
    rows = [{"id": c.id, "idx": c.index, "created": now, "policy_version": c.policy_version,
             "model": c.model, "prompt_tokens": json.dumps(list(map(int, c.prompt_tokens))),
             "tokens": json.dumps(list(map(int, c.tokens))),
             "logprobs": json.dumps([float(x) for x in c.logprobs]), "text": c.text,
             "finish_reason": c.finish_reason, "params": json.dumps(dict(c.params)),
             "n": c.n} for c in candidates]
    mine = _Pending(rows)
    with self._waiting_lock:
      self._waiting.append(mine)
    with self._commit_lock:
      if not mine.done:
        with self._waiting_lock:
          group, self._waiting = self._waiting, []
        try:
          self._commit(group)
        finally:  # interrupted (not by a database error): none of it is known committed
          for pending in group:
            if not pending.done:
              pending.error = RuntimeError("the interaction log's commit was interrupted")
              pending.done = True
    if mine.error is not None:
      raise mine.error

  def _commit(self, group: list[_Pending]) -> None:
    """Commits a group's completions in one transaction, or (when that fails) each in its
    own; marks each done, with the error that refused it."""
    try:
      with self.engine.begin() as conn:
        conn.execute(COMPLETIONS.insert(), [row for p in group for row in p.rows])
    except Exception as e:  # noqa: BLE001 (handed to the caller whose rows it refused)
      if len(group) == 1:
        group[0].error, group[0].done = e, True
        return
      for pending in group:
        self._commit([pending])
      return
    for pending in group:
      pending.done = True

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
