"""Sandbox sessions: one workspace across calls, per-call limits, and hostile commands.

Each hostile command must leave the host untouched and the session usable for the
next call (or, when the server itself is gone, end the session cleanly).
"""

import os
import time

import pytest

from rlcode.sandbox.session import Session, SessionError, SessionLimits


@pytest.fixture
def session():
  with Session(SessionLimits(command_seconds=3.0, max_output_bytes=4096)) as s:
    yield s


def test_files_persist_across_calls_and_commands_run_in_the_workspace(session):
  session.write("pkg/notes.txt", "K = 7\n")
  r = session.exec("cat pkg/notes.txt; echo err >&2; pwd; echo 'x = 1' > made.py; exit 3")
  assert r.output == "K = 7\nerr\n/sandbox\n" and r.exit_code == 3
  assert not r.timed_out and not r.truncated
  assert session.read("made.py") == "x = 1\n"
  assert session.files() == ["made.py", "pkg/notes.txt"]
  assert session.exec("python3 -c 'import made; print(made.x + 1)'").output == "2\n"


def test_commands_see_no_host_files_no_network_and_a_plain_user(session):
  probe = os.path.abspath(__file__)
  r = session.exec(f"cat {probe}; ls /work /root /home /etc; id -u; "
                   "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), 1)'")
  assert "No such file or directory" in r.output and "def test_" not in r.output
  assert "65534" in r.output
  assert "Network is unreachable" in r.output or "OSError" in r.output


@pytest.mark.parametrize("path", ["../outside.txt", "/etc/passwd", "a/../../b",
                                  "/sandbox/../proc/1/environ"])
def test_paths_outside_the_workspace_are_refused(session, path):
  with pytest.raises(SessionError, match="outside the workspace"):
    session.read(path)
  with pytest.raises(SessionError, match="outside the workspace"):
    session.write(path, "x")


def test_symlinks_do_not_lead_out_of_the_workspace(session):
  session.exec("ln -s /usr/lib/os-release os; ln -s / root; mkdir d; ln -s /tmp d/t")
  for path in ("os", "root/usr/lib/os-release", "d/t/x"):
    with pytest.raises(SessionError, match="outside the workspace"):
      session.read(path)
    with pytest.raises(SessionError, match="outside the workspace"):
      session.write(path, "x")
  assert session.files() == []  # links are not listed, nor followed


def test_a_fork_bomb_is_contained(session):
  start = time.monotonic()
  session.exec(":(){ :|:& };:", timeout=3.0)
  assert time.monotonic() - start < 10
  # Nothing of it is left: the server killed every process after the call.
  r = session.exec("ls /proc | grep -c '^[0-9]'")
  assert int(r.output) <= 4, r.output  # the server, bash, ls, grep
  assert session.exec("echo alive").output == "alive\n"


@pytest.mark.slow
def test_endless_commands_are_killed_at_their_timeout(session):
  start = time.monotonic()
  r = session.exec("sleep 30", timeout=1.0)
  assert r.timed_out and r.exit_code is None
  assert time.monotonic() - start < 5
  r = session.exec("python3 -c 'while True: pass'", timeout=1.0)
  assert r.timed_out
  assert session.exec("echo alive").output == "alive\n"


def test_huge_output_is_capped_and_stopped(session):
  start = time.monotonic()
  r = session.exec("yes")
  assert r.truncated and len(r.output.encode()) == 4096
  assert time.monotonic() - start < 5
  r = session.exec("head -c 100000000 /dev/zero > big; ls -l big")
  assert "File too large" in r.output or "No space" in r.output


def test_background_processes_end_with_their_command(session):
  r = session.exec("sleep 100 & echo started")
  assert r.output == "started\n" and not r.timed_out
  assert int(session.exec("ls /proc | grep -c '^[0-9]'").output) <= 4


def test_the_server_cannot_be_read_or_killed_from_inside(session):
  r = session.exec("cat /proc/1/environ /proc/1/mem; ls /proc/1/fd; kill -9 1; echo done")
  assert "Permission denied" in r.output and r.output.endswith("done\n")
  assert session.exec("echo alive").output == "alive\n"


def test_a_closed_or_dead_session_refuses_calls():
  s = Session()
  s.write("a.txt", "a")
  s.close()
  assert not s.alive
  with pytest.raises(SessionError, match="ended"):
    s.read("a.txt")


def test_sessions_do_not_share_a_workspace():
  with Session() as a, Session() as b:
    a.write("only_a.txt", "a")
    assert b.files() == []
    assert "No such file" in b.exec("cat only_a.txt").output


def test_limits_are_checked():
  with pytest.raises(ValueError, match="command_seconds must be a positive number"):
    SessionLimits(command_seconds=0)
  with pytest.raises(ValueError, match="at least 4"):
    SessionLimits(max_processes=2)
  with Session(SessionLimits(max_file_bytes=10)) as s:
    with pytest.raises(SessionError, match="more than 10 bytes"):
      s.write("big.txt", "x" * 11)
