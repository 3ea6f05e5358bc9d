"""The interaction log: whole rows, idempotent feedback, conflicts, the learner's cursor; on
SQLite (the default) and on a real PostgreSQL server started by the test."""

import glob
import os
import pwd
import shutil
import socket
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
  store = log_lib.InteractionLog(postgres)
  other = log_lib.InteractionLog(postgres)
  try:
    assert store.engine.dialect.name == "postgresql"
    _exercise(store)
    _race(store, other)
  finally:
    store.close()
    other.close()
