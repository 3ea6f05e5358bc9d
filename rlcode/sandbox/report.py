"""Reading a run's raw streams into a Result: the nonce-keyed report alone decides passes.

`interpret` checks the harness's report line by line (every line carries the
run's nonce, each test is reported once, `done` comes last) and turns it, with
the exit code, how the program process died if it did, and what the supervisor
observed (timeout, caps), into a status. It never looks at stdout or exit codes
to count a pass, and starts nothing.
"""

from __future__ import annotations

import dataclasses
import json
import signal

from rlcode.sandbox import codec
from rlcode.sandbox.jobs import Limits, Result
from rlcode.sandbox.testplan import TestPlan


@dataclasses.dataclass
class Streams:
  """What the supervisor collected from one run."""

  out: bytearray
  err: bytearray
  report: bytearray
  info: bytearray
  output_total: int
  timed_out: bool
  output_exceeded: bool
  report_exceeded: bool
  exit_code: int | None


def _signal_name(code: int | None) -> str | None:
  if code is None or code <= 128:
    return None
  try:
    return signal.Signals(code - 128).name
  except ValueError:
    return None


def _program_death(why: str, limits: Limits) -> tuple[str, str]:
  """(status, error) for the harness's `program_died WHY`: the run ends incomplete."""
  what, _, rest = why.partition(" ")
  if what == "protocol":
    return "crash", f"the program broke the call protocol: {rest}"
  detail, _, cpu_text = rest.partition(" cpu ")
  try:
    cpu = float(cpu_text)
  except ValueError:
    cpu = 0.0
  if what == "signal" and detail == "SIGXCPU":
    return "timeout", f"CPU limit of {limits.cpu_seconds} s exceeded by the program"
  if what == "signal" and detail == "SIGKILL" and cpu >= limits.cpu_seconds:
    return "timeout", (f"program killed by SIGKILL: the CPU hard limit of "
                       f"{limits.cpu_seconds} + 1 s")
  if what == "signal":
    return "crash", f"program killed by {detail} before the report completed"
  return "crash", f"program exited with code {detail} before the report completed"


def _output(verdict: str, text: str) -> tuple[str, object] | None:
  """A probe's answer from its report line (None: malformed)."""
  if verdict == "return":
    try:
      return ("return", codec.decode(bytes.fromhex(text)))
    except (ValueError, RecursionError):
      return None
  if verdict == "raise" and text.isidentifier():
    return ("raise", text)
  if verdict == "large" and len(text) == 64 and all(c in "0123456789abcdef" for c in text):
    return ("large", text)
  return None


def interpret(s: Streams, plan: TestPlan, nonce: str, limits: Limits,
              seconds: float, n_probes: int = 0) -> Result:
  """Turns the raw streams into a Result; the report alone decides passes. The
  probes' answers count only in a complete report that has every one of them."""
  n = plan.n_tests
  outcomes: list[str | None] = [None] * n
  outputs: list[tuple[str, object] | None] = [None] * n_probes
  events: dict[str, str] = {}
  invalid = ""
  done = False
  lines = bytes(s.report).split(b"\n")
  tail = lines.pop()  # empty when the report ends with a newline
  head = nonce.encode() + b" "
  for raw in lines:
    if done:
      invalid = "lines after done"
      break
    if not raw.startswith(head):
      invalid = "a line without the run's nonce"
      break
    line = raw[len(head):].decode("utf-8", "replace")
    kind, _, rest = line.partition(" ")
    if kind == "test":
      index_text, _, rest = rest.partition(" ")
      verdict, _, message = rest.partition(" ")
      if (not index_text.isdigit() or int(index_text) >= n
          or outcomes[int(index_text)] is not None
          or verdict not in ("pass", "fail", "skip")):
        invalid = f"bad test line {line[:80]!r}"
        break
      i = int(index_text)
      outcomes[i] = ("pass" if verdict == "pass" else "skip" if verdict == "skip"
                     else f"fail: {plan.labels[i]} -> {message}")
    elif kind == "output":
      index_text, _, rest = rest.partition(" ")
      verdict, _, text = rest.partition(" ")
      answer = _output(verdict, text)
      if (not index_text.isdigit() or int(index_text) >= n_probes
          or outputs[int(index_text)] is not None or answer is None):
        invalid = f"bad output line {line[:80]!r}"
        break
      outputs[int(index_text)] = answer
    elif kind in ("start", "syntax_error", "program_error", "setup_error", "program",
                  "program_died"):
      if kind in events:
        invalid = f"repeated event {kind!r}"
        break
      events[kind] = rest
    elif kind == "done":
      done = True
    else:
      invalid = f"unknown event {kind!r}"
      break
  if tail and not invalid:
    invalid = "" if not done else "trailing bytes after done"
  if done and not invalid and any(o is None for o in outcomes):
    invalid = "done before every test was reported"
  complete = done and not invalid
  answered = complete and all(o is not None for o in outputs)
  run = sum(1 for o in outcomes if o is not None and o != "skip")
  passed = sum(1 for o in outcomes if o == "pass")
  memory = any("MemoryError" in (events.get(k) or "") for k in ("program_error", "setup_error"))
  memory |= any(o is not None and "-> MemoryError" in o for o in outcomes)
  signame = _signal_name(s.exit_code)

  if invalid:
    status, error = "crash", f"invalid report: {invalid}"
  elif complete:
    if "syntax_error" in events:
      status, error = "syntax_error", events["syntax_error"]
    elif passed == n:
      status, error = "passed", ""
    elif memory:
      status, error = "memory", "MemoryError"
    else:
      status = "failed"
      first_fail = next((o for o in outcomes if o.startswith("fail")), "")
      error = (f"program raised {events['program_error']}" if "program_error" in events
               else f"test setup raised {events['setup_error']}" if "setup_error" in events
               else first_fail)
  elif "start" not in events and not s.timed_out:
    stderr_tail = bytes(s.err[-500:]).decode("utf-8", "replace").strip()
    status, error = "sandbox_error", f"harness did not start (exit {s.exit_code}): {stderr_tail}"
  elif s.timed_out:
    status, error = "timeout", f"wall clock of {limits.wall_seconds} s exceeded"
  elif s.output_exceeded:
    status, error = "crash", f"output exceeded {limits.output_limit_bytes} bytes"
  elif s.report_exceeded:
    status, error = "crash", "report exceeded its size cap"
  elif "program_died" in events:
    status, error = _program_death(events["program_died"], limits)
  elif signame == "SIGXCPU":
    status, error = "timeout", f"CPU limit of {limits.cpu_seconds} s exceeded"
  elif signame == "SIGKILL":
    # The harness is the namespace's init: no process inside can SIGKILL it,
    # and we did not (no timeout, no cap), so the kernel did.
    status, error = "timeout", (f"killed by SIGKILL: the CPU hard limit of "
                                f"{limits.cpu_seconds} + 1 s (or the host's OOM killer)")
  elif memory:
    status, error = "memory", "MemoryError, then the run ended before the report completed"
  elif signame:
    status, error = "crash", f"killed by {signame} before the report completed"
  else:
    status, error = "crash", f"exited with code {s.exit_code} before the report completed"

  pid_ns = None
  if s.info:
    try:
      pid_ns = json.loads(bytes(s.info)).get("pid-namespace")
    except ValueError:
      pid_ns = None
  return Result(
      status=status, tests_total=n, tests_run=run, tests_passed=passed,
      complete=complete, error=error[:500],
      outcomes=tuple(o or "skip" for o in outcomes),
      outputs=tuple(outputs) if answered else (),
      stdout=bytes(s.out).decode("utf-8", "replace"),
      stderr=bytes(s.err).decode("utf-8", "replace"),
      exit_code=s.exit_code, seconds=seconds, pid_namespace=pid_ns)

