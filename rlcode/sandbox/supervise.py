"""Running one job: the job fd, the launch, the wall clock, stream collection, the kill.

`execute` hands a job, with the launcher's strict seccomp filter (which the
harness installs in each of its processes), to a launcher's sandboxed
interpreter, reads its stdout, stderr and report incrementally under the wall
clock and the output caps, kills the run's pid namespace when a limit is
passed, and leaves judging the report to `report.interpret`. It does not choose
a launcher or know how one isolates.
"""

from __future__ import annotations

import logging
import marshal
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import time

from rlcode.sandbox.jobs import Job, Limits, Result
from rlcode.sandbox.testplan import GEN_NAME, TestPlan, context_names
from rlcode.sandbox.report import Streams, interpret

log = logging.getLogger(__name__)

_MAX_REPORT_BYTES = 1 << 20
_KILL_GRACE_S = 5.0


def kill(proc: subprocess.Popen) -> None:
  """Kills the sandbox's init so the launcher can reap it and exit.

  Killing the launcher instead would orphan the init to the host's pid 1, which
  may be slow to reap it (or never reap it, in some containers). The kernel
  kills everything left in the pid namespace when its init dies. While the
  launcher has not forked yet, or has no child left, its group is killed.
  """
  try:
    with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
      children = [int(c) for c in f.read().split()]
  except OSError:
    children = []
  for child in children:
    try:
      # A pidfd pins the process: no signal to a recycled pid.
      fd = os.pidfd_open(child)
    except OSError:
      continue
    try:
      signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
      pass
    finally:
      os.close(fd)
  if not children:
    kill_group(proc)


def kill_group(proc: subprocess.Popen) -> None:
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass


def _remove_tree(path: str) -> None:
  # A killed run's processes may still be dying; retry until the tree is gone.
  for _ in range(100):
    shutil.rmtree(path, ignore_errors=True)
    if not os.path.exists(path):
      return
    time.sleep(0.01)
  log.warning("rlcode.sandbox: could not remove work dir %s", path)


def _write_all(fd: int, data: bytes) -> None:
  view = memoryview(data)
  while view:
    view = view[os.write(fd, view):]


def execute(launcher, plan: TestPlan, job: Job, limits: Limits) -> Result:
  """Runs `job` as planned by `plan` through `launcher` under `limits`."""
  nonce = secrets.token_hex(16)
  payload = marshal.dumps({
      "nonce": nonce, "rlimits": limits.rlimits(), "seccomp": launcher.seccomp,
      "program": job.program, "context": job.context, "tests": plan.source,
      "format": plan.format, "gen_name": GEN_NAME, "entry_point": plan.entry_point,
      "names": sorted(set(plan.names) | set(context_names(job.context))),
      "program_names": [job.entry_point] if job.entry_point else [],
      "cases": [list(c) for c in plan.cases], "n_tests": plan.n_tests,
      "module_name": job.module_name, "probes": [list(a) for a in job.probes],
  })
  job_fd = os.memfd_create("rlcode-job")
  _write_all(job_fd, payload)
  os.lseek(job_fd, 0, os.SEEK_SET)
  report_r, report_w = os.pipe()
  start = time.monotonic()
  launch = launcher.launch(limits, job_fd, report_w)
  try:
    proc = subprocess.Popen(
        launch.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, pass_fds=launch.pass_fds, env=launch.env,
        cwd=launch.cwd, start_new_session=True)
  except OSError as e:
    for fd in (report_r, *launch.close_after_spawn,
               *([launch.info_fd] if launch.info_fd is not None else [])):
      os.close(fd)
    for path in launch.cleanup:
      _remove_tree(path)
    return Result("sandbox_error", plan.n_tests, error=f"cannot start {launcher.name}: {e}")
  finally:
    os.close(job_fd)
  for fd in launch.close_after_spawn:
    os.close(fd)
  try:
    streams = _collect(proc, report_r, launch.info_fd, limits, start)
  finally:
    for path in launch.cleanup:
      _remove_tree(path)
  return interpret(streams, plan, nonce, limits, time.monotonic() - start,
                   n_probes=len(job.probes))



def _collect(proc: subprocess.Popen, report_r: int, info_r: int | None,
             limits: Limits, start: float) -> Streams:
  """Reads every stream incrementally until EOF, enforcing the wall clock and caps."""
  s = Streams(bytearray(), bytearray(), bytearray(), bytearray(), 0, False, False,
               False, None)
  fds = {proc.stdout.fileno(): "out", proc.stderr.fileno(): "err", report_r: "report"}
  if info_r is not None:
    fds[info_r] = "info"
  sel = selectors.DefaultSelector()
  for fd in fds:
    sel.register(fd, selectors.EVENT_READ)
  deadline = start + limits.wall_seconds
  killed_at = None
  try:
    while sel.get_map():
      now = time.monotonic()
      if killed_at is None and now >= deadline:
        s.timed_out = True
        kill(proc)
        killed_at = now
      if killed_at is not None and now >= killed_at + _KILL_GRACE_S:
        log.warning("rlcode.sandbox: streams still open %.1f s after kill", _KILL_GRACE_S)
        break
      limit = deadline if killed_at is None else killed_at + _KILL_GRACE_S
      for key, _ in sel.select(max(0.0, limit - now)):
        data = os.read(key.fd, 1 << 16)
        if not data:
          sel.unregister(key.fd)
          continue
        kind = fds[key.fd]
        if kind in ("out", "err"):
          buf = s.out if kind == "out" else s.err
          keep = limits.max_output_bytes - len(buf)
          if keep > 0:
            buf += data[:keep]
          s.output_total += len(data)
          if s.output_total > limits.output_limit_bytes and killed_at is None:
            s.output_exceeded = True
            kill(proc)
            killed_at = time.monotonic()
        elif kind == "report":
          if len(s.report) + len(data) > _MAX_REPORT_BYTES:
            if killed_at is None:
              s.report_exceeded = True
              kill(proc)
              killed_at = time.monotonic()
          else:
            s.report += data
        else:
          s.info += data
  finally:
    sel.close()
    os.close(report_r)
    if info_r is not None:
      os.close(info_r)
    proc.stdout.close()
    proc.stderr.close()
  try:
    s.exit_code = proc.wait(timeout=_KILL_GRACE_S)
  except subprocess.TimeoutExpired:
    kill_group(proc)
    s.exit_code = proc.wait()
  return s

