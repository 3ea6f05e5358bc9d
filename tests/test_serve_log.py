"""The interaction log: whole rows, idempotent feedback, conflicts, the learner's cursor; on
SQLite (the default) and on a real PostgreSQL server started by the test. A damaged log, or
one of another model or schema version, is refused in one line and left as it was; moved
aside only when asked."""

import glob
import os
import pwd
import re
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import threading

import pytest

from rlcode.serve import log as log_lib


def _served(rid, n=2, version=3):
  return [log_lib.Served(id=rid, index=i, policy_version=version, model="m",
                         prompt_tokens=[1, 2, 3], tokens=[4 + i, 5], logprobs=[-0.5, -1.25],
                         text=f"t{i}", finish_reason="length",
                         params={"temperature": 1.0, "top_p": 1.0, "seed": 9}, n=n)
          for i in range(n)]


def _exercise(store):
  store.record(_served("a"))
  store.record(_served("b", n=1))
  assert store.feedback({"id": "a", "chosen": 1}) is True
  assert store.feedback({"id": "a", "chosen": 1}) is False  # the same body again: a no-op
  with pytest.raises(log_lib.Conflict):
    store.feedback({"id": "a", "chosen": 0})
  with pytest.raises(log_lib.UnknownCompletion):
    store.feedback({"id": "zzz", "accepted": True})
  with pytest.raises(ValueError, match="not a candidate"):
    store.feedback({"id": "b", "chosen": 1})
  assert store.feedback({"id": "b", "rejected": True, "final_text": "mine"}) is True
  rows = store.feedback_after(0, 10)
  assert [r["id"] for r in rows] == ["a", "b"]
  a, b = rows
  assert a["chosen"] == 1 and [c["tokens"] for c in a["candidates"]] == [[4, 5], [5, 5]]
  assert a["candidates"][1]["logprobs"] == [-0.5, -1.25]
  assert a["candidates"][0]["params"]["seed"] == 9 and a["candidates"][0]["policy_version"] == 3
  assert b["accepted"] is False and b["final_text"] == "mine"
  assert [r["id"] for r in store.feedback_after(a["seq"], 10)] == ["b"]
  assert store.counts() == {"completions": 2, "candidates": 3, "feedback": 2}


def _race(store_a, store_b):
  """Two servers record feedback for the same ids at once: each id is stored once."""
  ids = [f"r{i}" for i in range(20)]
  for rid in ids:
    store_a.record(_served(rid, n=1))
  results = {"a": [], "b": []}

  def send(name, store):
    for rid in ids:
      try:
        results[name].append(store.feedback({"id": rid, "accepted": True}))
      except log_lib.Conflict:
        results[name].append("conflict")

  threads = [threading.Thread(target=send, args=(n, s)) for n, s in (("a", store_a),
                                                                      ("b", store_b))]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  new = sum(x is True for x in results["a"] + results["b"])
  assert new == len(ids)
  stored = [r["id"] for r in store_a.feedback_after(0, 1000) if r["id"].startswith("r")]
  assert sorted(stored) == sorted(ids)


def test_sqlite(tmp_path):
  url = log_lib.default_url(str(tmp_path))
  store = log_lib.InteractionLog(url)
  try:
    _exercise(store)
    other = log_lib.InteractionLog(url)
    try:
      _race(store, other)
    finally:
      other.close()
    with store.engine.connect() as conn:
      assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
      assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
  finally:
    store.close()


def test_completions_recorded_at_once_share_a_transaction_and_a_bad_one_fails_alone(tmp_path):
  """Group commit: completions queued while a commit runs go in the next one transaction;
  a group holding a completion the log refuses (its id already recorded) is committed
  again one by one, so that caller alone gets the error and the others' rows are kept."""
  import sqlalchemy as sa
  store = log_lib.InteractionLog(log_lib.default_url(str(tmp_path)))
  commits = []
  sa.event.listen(store.engine, "commit", lambda conn: commits.append(1))
  try:
    store.record(_served("old", n=1))
    errors = {}

    def record(rid):
      try:
        store.record(_served(rid, n=1))
      except Exception as e:  # noqa: BLE001
        errors[rid] = e

    for ids in (["g0", "g1", "g2", "g3"], ["h0", "old", "h1"]):
      commits.clear()
      with store._commit_lock:  # a commit in progress: the callers queue behind it
        threads = [threading.Thread(target=record, args=(rid,)) for rid in ids]
        for t in threads:
          t.start()
        while len(store._waiting) < len(ids):
          threading.Event().wait(0.01)
      for t in threads:
        t.join()
      if "old" not in ids:
        assert len(commits) == 1 and not errors  # four completions, one transaction
      else:
        assert set(errors) == {"old"} and isinstance(errors["old"], sa.exc.IntegrityError)
    assert store.counts()["completions"] == 1 + 4 + 2

    # A commit interrupted by something other than the database (here a BaseException in
    # the writer) leaves no caller of its group believing its rows were committed.
    class Interrupted(BaseException):
      pass

    def interrupted(group):
      raise Interrupted

    store._commit = interrupted
    raised = {}

    def record_any(rid):
      try:
        store.record(_served(rid, n=1))
      except BaseException as e:  # noqa: BLE001
        raised[rid] = type(e)

    with store._commit_lock:
      threads = [threading.Thread(target=record_any, args=(rid,)) for rid in ("i0", "i1")]
      for t in threads:
        t.start()
      while len(store._waiting) < 2:
        threading.Event().wait(0.01)
    for t in threads:
      t.join()
    assert sorted(raised.values(), key=lambda t: t.__name__) == [Interrupted, RuntimeError]
  finally:
    store.close()


def _postgres_bin():
  found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
  return os.path.dirname(found[-1]) if found else None


@pytest.fixture
def postgres():
  """A PostgreSQL server on 127.0.0.1 at a free port, in a temporary directory, run as the
  `postgres` user when the tests run as root (initdb refuses root)."""
  bindir = _postgres_bin()
  if bindir is None:
    pytest.skip("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb; "
                "apt-get install postgresql, as .ci/run tries)")
  pytest.importorskip("psycopg", reason="the psycopg driver is not installed")
  user = None
  if os.geteuid() == 0:
    try:
      user = pwd.getpwnam("postgres")
    except KeyError:
      pytest.skip("running as root and there is no 'postgres' user to run the server as")
  data = tempfile.mkdtemp(prefix="rlcode-pg-")
  if user is not None:
    os.chown(data, user.pw_uid, user.pw_gid)
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  run = lambda *args: subprocess.run(args, check=True, capture_output=True, timeout=120,
                                     user=user.pw_uid if user else None,
                                     group=user.pw_gid if user else None)
  try:
    run(os.path.join(bindir, "initdb"), "-D", os.path.join(data, "db"), "-A", "trust",
        "-U", "rlcode", "--no-sync")
    run(os.path.join(bindir, "pg_ctl"), "-D", os.path.join(data, "db"), "-w", "-t", "60",
        "-l", os.path.join(data, "log"), "-o",
        f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
    yield f"postgresql+psycopg://rlcode@127.0.0.1:{port}/postgres"
  finally:
    subprocess.run([os.path.join(bindir, "pg_ctl"), "-D", os.path.join(data, "db"), "-m",
                    "immediate", "stop"], capture_output=True, timeout=60,
                   user=user.pw_uid if user else None, group=user.pw_gid if user else None)
    shutil.rmtree(data, ignore_errors=True)


@pytest.mark.slow
def test_postgresql(postgres):
  store = log_lib.InteractionLog(postgres, MODEL)
  other = log_lib.InteractionLog(postgres, MODEL)
  try:
    assert store.engine.dialect.name == "postgresql"
    _exercise(store)
    _race(store, other)
  finally:
    store.close()
    other.close()
  with pytest.raises(log_lib.LogRefused, match="another model's completions"):
    log_lib.InteractionLog(postgres, {**MODEL, "seed": 1})


# ---------------------------------------------------------------- a log's integrity at start

MODEL = {"name": "m", "arch": {"hidden_size": 32}, "seed": 0}


@pytest.fixture(scope="module")
def good_log(tmp_path_factory):
  """The bytes of a healthy log of MODEL: 240 completions of 4 candidates, with feedback
  (about 170 KB, its WAL folded in at close)."""
  url = log_lib.default_url(str(tmp_path_factory.mktemp("good")))
  store = log_lib.InteractionLog(url, MODEL)
  for i in range(240):
    store.record(_served(f"c{i}", n=4))
    store.feedback({"id": f"c{i}", "chosen": i % 4})
  store.close()
  with open(log_lib.sqlite_path(url), "rb") as f:
    good = f.read()
  assert len(good) > 2 * 65536  # room for 64 KB of garbage mid-file, with pages either side
  return good


def _garbage_mid_file(good):
  mid = len(good) // 2
  return good[:mid - 32768] + bytes(range(256)) * 256 + good[mid + 32768:]


DAMAGE = {
    "emptied": (lambda good: b"", "is empty (0 bytes)"),
    "garbage_mid_file": (_garbage_mid_file, "is damaged"),
    "cut_in_half": (lambda good: good[:len(good) // 2], "is damaged"),
    "header_overwritten": (lambda good: b"\xff" * 100 + good[100:], "SQLite's header"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_log_is_refused_and_left_as_it_was(damage, good_log, tmp_path):
  make, says = DAMAGE[damage]
  url = log_lib.default_url(str(tmp_path))
  path = log_lib.sqlite_path(url)
  damaged = make(good_log)
  with open(path, "wb") as f:
    f.write(damaged)
  with pytest.raises(log_lib.LogRefused) as refused:
    log_lib.InteractionLog(url, MODEL)
  message = refused.value.message
  assert says in message and path in message and "--move-log-aside" in message
  assert "\n" not in message
  with open(path, "rb") as f:
    assert f.read() == damaged


def test_the_healthy_log_opens_with_its_rows(good_log, tmp_path):
  url = log_lib.default_url(str(tmp_path))
  with open(log_lib.sqlite_path(url), "wb") as f:
    f.write(good_log)
  store = log_lib.InteractionLog(url, MODEL)
  try:
    assert store.counts() == {"completions": 240, "candidates": 960, "feedback": 240}
  finally:
    store.close()


def _edited(good_log, tmp_path, *statements):
  """A copy of the healthy log after `statements`; its URL."""
  url = log_lib.default_url(str(tmp_path))
  with open(log_lib.sqlite_path(url), "wb") as f:
    f.write(good_log)
  with sqlite3.connect(log_lib.sqlite_path(url)) as conn:
    for statement in statements:
      conn.execute(statement)
  return url


@pytest.mark.parametrize("statements,model,says", [
    ((), {**MODEL, "seed": 1}, "another model's completions (seed: 0 there, 1 here)"),
    (("UPDATE rlcode_log SET value = '2' WHERE key = 'schema_version'",), MODEL,
     "schema version 2"),
    (("DROP TABLE feedback",), MODEL, "lacks its feedback table"),
    (("ALTER TABLE feedback ADD COLUMN extra TEXT",), MODEL, "its feedback table has columns"),
    (("DROP TABLE feedback", "DROP TABLE completions", "DROP TABLE rlcode_log",
      "CREATE TABLE users (name TEXT)"), MODEL, "holds other tables (users)"),
], ids=["another_model", "another_schema_version", "a_table_missing", "other_columns",
        "not_a_log"])
def test_a_log_that_is_not_this_ones_is_refused(statements, model, says, good_log, tmp_path):
  url = _edited(good_log, tmp_path, *statements)
  with pytest.raises(log_lib.LogRefused, match=r"interaction log .*" + re.escape(says)):
    log_lib.InteractionLog(url, model)


def test_a_log_from_before_the_version_table_is_adopted(good_log, tmp_path):
  url = _edited(good_log, tmp_path, "DROP TABLE rlcode_log")
  store = log_lib.InteractionLog(url, MODEL)
  try:
    assert store.counts()["feedback"] == 240
  finally:
    store.close()
  with pytest.raises(log_lib.LogRefused, match="another model's"):  # stamped with MODEL
    log_lib.InteractionLog(url, {**MODEL, "name": "other"})


def test_a_refused_log_is_moved_aside_only_when_asked(good_log, tmp_path, capsys):
  from rlcode.serve import server
  url = log_lib.default_url(str(tmp_path))
  path = log_lib.sqlite_path(url)
  damaged = _garbage_mid_file(good_log)
  with open(path, "wb") as f:
    f.write(damaged)
  with pytest.raises(log_lib.LogRefused):
    server.open_log(url, MODEL)
  store = server.open_log(url, MODEL, move_aside=True)
  try:
    assert store.counts() == {"completions": 0, "candidates": 0, "feedback": 0}
    store.record(_served("new", n=1))
    assert store.feedback({"id": "new", "accepted": True})
  finally:
    store.close()
  err = capsys.readouterr().err
  aside = err.split("moved aside to ")[1].split(";")[0]
  assert os.path.dirname(aside) == str(tmp_path) and path in err and "is damaged" in err
  with open(aside, "rb") as f:
    assert f.read() == damaged
  healthy = server.open_log(url, MODEL, move_aside=True)  # nothing refused: nothing moved
  healthy.close()
  assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(aside),
                                                 os.path.basename(path)])


# ---------------------------------------------------------------- unavailable, not damaged

def test_a_locked_log_is_unavailable_not_damaged_and_never_moved_aside(good_log, tmp_path):
  """Another writer holding the file's lock past the busy timeout is named as that: the
  refusal does not call the log damaged, --move-log-aside leaves it where it is, and it
  opens once the lock is let go."""
  url = log_lib.default_url(str(tmp_path))
  path = log_lib.sqlite_path(url)
  with open(path, "wb") as f:
    f.write(good_log)
  holder = sqlite3.connect(path, isolation_level=None)
  try:
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    with pytest.raises(log_lib.LogUnavailable) as refused:
      log_lib.InteractionLog(url, MODEL, busy_timeout_s=0.2)
    message = refused.value.message
    assert "is locked by another process" in message and path in message, message
    assert "damaged" not in message and "--move-log-aside" not in message and "\n" not in message
    # not a LogRefused: `rlcode serve --move-log-aside` (server.open_log) passes it on
    assert not isinstance(refused.value, log_lib.LogRefused)
    assert not [name for name in os.listdir(tmp_path) if "aside" in name]
  finally:
    holder.close()
  store = log_lib.InteractionLog(url, MODEL, busy_timeout_s=0.2)
  try:
    assert store.counts()["feedback"] == 240
  finally:
    store.close()


def _closed_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.parametrize("where,says", [
    ("under_a_file", "cannot be made (a file is there)"),
    ("under_a_file_twice", "cannot be made (Not a directory)"),
    ("postgres_refusing", "cannot be opened (postgresql: "),
])
def test_a_log_that_cannot_be_opened_is_one_line_not_damage(where, says, tmp_path):
  (tmp_path / "file").write_text("")
  url = {"under_a_file": f"sqlite:///{tmp_path}/file/interactions.sqlite",
         "under_a_file_twice": f"sqlite:///{tmp_path}/file/x/interactions.sqlite",
         "postgres_refusing": f"postgresql://u:secret@127.0.0.1:{_closed_port()}/db"}[where]
  with pytest.raises(log_lib.LogUnavailable) as refused:
    log_lib.InteractionLog(url, MODEL)
  message = refused.value.message
  assert says in message and "\n" not in message and "secret" not in message, message
  assert "damaged" not in message and "--move-log-aside" not in message, message
  assert sorted(os.listdir(tmp_path)) == ["file"]


def test_two_processes_creating_the_log_at_once_share_its_tables(tmp_path, monkeypatch):
  """Another process creates the tables between this one's look and its create (SQLite
  then says "table ... already exists"): this one uses theirs."""
  import sqlalchemy as sa
  url = log_lib.default_url(str(tmp_path))
  real = log_lib.METADATA.create_all
  raced = []

  def create_all(bind, checkfirst=True, **kwargs):
    if not raced:
      raced.append(True)
      other = sa.create_engine(url)
      real(other)
      other.dispose()
      return real(bind, checkfirst=False, **kwargs)  # our look came before theirs
    return real(bind, checkfirst=checkfirst, **kwargs)
  monkeypatch.setattr(log_lib.METADATA, "create_all", create_all)
  store = log_lib.InteractionLog(url, MODEL)
  try:
    assert raced and store.counts() == {"completions": 0, "candidates": 0, "feedback": 0}
    _exercise(store)
  finally:
    store.close()


def test_an_oserror_moving_a_log_aside_is_one_line(good_log, tmp_path, monkeypatch):
  url = log_lib.default_url(str(tmp_path))
  path = log_lib.sqlite_path(url)
  with open(path, "wb") as f:
    f.write(good_log)

  def replace(src, dst):
    raise PermissionError(13, "Permission denied")
  monkeypatch.setattr(log_lib.os, "replace", replace)
  with pytest.raises(log_lib.LogUnavailable, match=r"cannot rename .*interactions.sqlite to "
                     r".*aside.* \(Permission denied\); the log is where it was$"):
    log_lib.move_aside(url)


def test_a_failed_move_aside_puts_back_what_it_moved(good_log, tmp_path, monkeypatch):
  """The -wal file goes first; when the log file then cannot move, the -wal comes back
  (a log without its -wal would lose the rows not yet checkpointed into it)."""
  url = log_lib.default_url(str(tmp_path))
  path = log_lib.sqlite_path(url)
  with open(path, "wb") as f:
    f.write(good_log)
  with open(path + "-wal", "wb") as f:
    f.write(b"wal frames")
  real = os.replace

  def replace(src, dst):
    if src == path:
      raise PermissionError(13, "Permission denied")
    real(src, dst)
  monkeypatch.setattr(log_lib.os, "replace", replace)
  with pytest.raises(log_lib.LogUnavailable, match="the log is where it was"):
    log_lib.move_aside(url)
  assert sorted(os.listdir(tmp_path)) == ["interactions.sqlite", "interactions.sqlite-wal"]
  with open(path + "-wal", "rb") as f:
    assert f.read() == b"wal frames"
