"""The test harness that runs inside the sandbox: one program, its tests, a report.

`rlcode.sandbox.launch` passes the text of this file to the sandboxed interpreter
with `python -c`; rlcode never imports it. It must stay standard-library only, import
nothing once the untrusted program has started, and reach everything it needs
through locals of `_main`, whose globals are a private dict holding a snapshot of
the builtins: a program that rebinds names in `builtins`, `__main__` or `os` does
not change what the harness calls.

Protocol. argv is `[-c, JOB_FD, REPORT_FD]`. JOB_FD holds one JSON object:
  nonce      per-run random token; every report line starts with it.
  rlimits    {"RLIMIT_...": [soft, hard]}, applied before the program runs.
  program    source of the untrusted program.
  tests      source executed in the program's namespace after it (test plan).
  format     "generator" (tests define `GEN(*args)` yielding `(index, error)`
             per test, `error` None on a pass) or "unittest".
  gen_name, entry_point, cases (unittest: [[class, method], ...]), n_tests,
  module_name (the program's `__name__`).
The harness reads and closes JOB_FD before the program runs, then writes lines
`<nonce> <event>` to REPORT_FD, one per event as it happens:
  start | syntax_error MSG | program_error MSG | program ok | setup_error MSG |
  test I pass | test I fail MSG | test I skip | done
`done` comes last, after every test index was reported exactly once. Only the
process that started the harness writes; a forked copy exits silently.
"""


def _main():
  import builtins
  import json
  import os
  import resource
  import signal
  import sys

  job_fd, report_fd = int(sys.argv[1]), int(sys.argv[2])
  chunks = []
  while True:
    chunk = os.read(job_fd, 1 << 20)
    if not chunk:
      break
    chunks.append(chunk)
  os.close(job_fd)
  job = json.loads(b"".join(chunks))
  del chunks

  # The harness is the pid namespace's init, which ignores signals it has no
  # handler for, RLIMIT_CPU's SIGXCPU included.
  signal.signal(signal.SIGXCPU, lambda *_: os._exit(128 + signal.SIGXCPU))
  for name, (soft, hard) in job["rlimits"].items():
    resource.setrlimit(getattr(resource, name), (soft, hard))
  # The working directory is writable by the program: never import from it.
  sys.path[:] = [p for p in sys.path if p and p != os.getcwd()]

  getpid, write, exit_now = os.getpid, os.write, os._exit
  me = getpid()
  prefix = job.pop("nonce").encode() + b" "
  stdout, stderr = sys.stdout, sys.stderr

  def emit(line):
    if getpid() != me:
      exit_now(0)
    data = prefix + line.encode("utf-8", "replace") + b"\n"
    try:
      while data:
        data = data[write(report_fd, data):]
    except OSError:
      exit_now(70)

  def describe(exc):
    text = type(exc).__name__
    try:
      message = str(exc)
      if message:
        text = f"{text}: {message}"
    except BaseException:  # a hostile __str__ must not take the harness down
      pass
    return text[:300].replace("\n", "\\n")

  n_tests = job["n_tests"]
  reported = [False] * n_tests

  def finish(reason_event=None):
    if reason_event:
      emit(reason_event)
    for i in range(n_tests):
      if not reported[i]:
        emit(f"test {i} skip")
    emit("done")
    for stream in (stdout, stderr):
      try:
        stream.flush()
      except BaseException:
        pass
    exit_now(0)

  emit("start")
  tests_code = compile(job["tests"], "<tests>", "exec")
  if job["format"] == "unittest":
    import unittest
    test_result_cls = unittest.TestResult
  try:
    program_code = compile(job["program"], "<program>", "exec")
  except BaseException as e:  # SyntaxError, ValueError (NUL bytes), RecursionError, ...
    finish(f"syntax_error {describe(e)}")

  namespace = {"__name__": job["module_name"], "__builtins__": builtins}
  try:
    exec(program_code, namespace)
  except BaseException as e:  # SystemExit and KeyboardInterrupt included: no test ran
    finish(f"program_error {describe(e)}")
  emit("program ok")

  try:
    exec(tests_code, namespace)
    if job["format"] == "unittest":
      cases = [(namespace[c], m) for c, m in job["cases"]]
    else:
      args = (namespace[job["entry_point"]],) if job["entry_point"] else ()
      gen = namespace[job["gen_name"]](*args)
  except BaseException as e:
    finish(f"setup_error {describe(e)}")

  if job["format"] == "unittest":
    for i, (cls, method) in enumerate(cases):
      try:
        result = test_result_cls()
        cls(method).run(result)
        problems = (result.failures + result.errors + result.skipped
                    + result.unexpectedSuccesses)
        if result.testsRun == 1 and not problems:
          event = f"test {i} pass"
        else:
          detail = problems[0][1].strip().splitlines()[-1] if problems else "not run"
          event = f"test {i} fail {detail[:300]}"
      except BaseException as e:
        event = f"test {i} fail {describe(e)}"
      reported[i] = True
      emit(event)
    finish()

  while True:
    try:
      index, error = next(gen)
    except StopIteration:
      break
    except BaseException as e:  # a setup statement between tests raised
      finish(f"setup_error {describe(e)}")
    if type(index) is not int or not 0 <= index < n_tests or reported[index]:
      finish(f"setup_error test plan yielded bad index {index!r}")
    reported[index] = True
    emit(f"test {index} pass" if error is None else f"test {index} fail {describe(error)}")
  finish()


if __name__ == "__main__":
  import builtins as _builtins
  type(_main)(_main.__code__, {"__builtins__": dict(vars(_builtins)),
                               "__name__": "rlcode_harness"})()
