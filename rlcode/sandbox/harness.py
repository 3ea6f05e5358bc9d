"""The harness that runs inside the sandbox: a program process, the tests, a report.

`rlcode.sandbox.launch` passes the text of harness_codec.py and of this file, in that
order, to the sandboxed interpreter with `python -c`; rlcode never imports either
(tests do, for the codec). Standard library only, and only cheap modules: `json` (re)
or `signal` (enum) would cost a fresh interpreter several milliseconds a run.

Two processes. The harness is the pid namespace's init; it makes itself
non-dumpable (its /proc files and memory do not open for the same uid) and,
before it reads its job, forks the program process: the program's memory never
holds the tests, the nonce or the report fd, and the child closes those fds at
once. The harness reads the job, sends the child the program's source, rlimits,
seccomp filter and the names the tests use, and while the child applies the
limits and the filter and runs the program in a fresh namespace, applies the
same to itself. The tests run in the harness, in a namespace of their own with
the real builtins and the job's trusted context; each name the tests use that
the program defines (the entry point always, builtins never) is there either as
its value, if plain data, or as a proxy: calling it sends (name, args, kwargs)
down a pipe, the child calls its function and answers with the result or the
exception. Only plain data crosses: None, bool, int, float, complex, str, bytes
and list, tuple, dict, set, frozenset of them, checked by exact type on the way
out (`_encode`) and rebuilt by the receiver (`_decode`); anything else, a
subclass included, is an error for the test that sent or asked for it.
Exceptions come back as the nearest builtin Exception type with its message,
others (SystemExit, KeyboardInterrupt) as `ProgramError`. Arguments go by value:
a program's mutation of them is not seen by the tests. The functions of this
file see only their locals and a private globals dict holding a snapshot of the
builtins, so a program that rebinds names in `builtins`, `__main__` or `os`
does not change what the program process's call loop does.

Protocol. argv is `[-c, JOB_FD, REPORT_FD]`. JOB_FD holds one marshal'd dict:
  nonce      per-run random token; every report line starts with it.
  rlimits    {"RLIMIT_...": [soft, hard]}, applied to both processes.
  seccomp    the strict filter (classic BPF bytes) both install, or None.
  program    source of the untrusted program.
  context    trusted source run before the tests in their namespace.
  tests      the test plan's source; names: the identifiers it and the
             context use; program_names: names taken from the program even
             if they are builtins' (the entry point).
  format     "generator" (tests define `GEN(*args)` yielding `(index, error)`
             per test, `error` None on a pass) or "unittest".
  gen_name, entry_point (passed to GEN), cases (unittest: [[class, method],
  ...]), n_tests, module_name (the program's `__name__`).
  probes     argument lists for calls of the entry point after the tests.
The harness writes lines `<nonce> <event>` to REPORT_FD as things happen:
  start | syntax_error MSG | program_error MSG | program ok | setup_error MSG |
  test I pass | test I fail MSG | test I skip | program_died WHY |
  output I return HEX | output I raise NAME | output I large SHA256 | done
`done` comes last, after every test index was reported exactly once, and, when
the tests ran to their end, every probe: HEX is `_encode` of the answer as the
harness rebuilt it (plain data by construction), NAME the exception's type as
the harness raised it (a builtin's name or ProgramError), and an answer whose
encoding passes 16 KiB is reported by its digest. When the
program process dies or breaks the call protocol the harness writes
`program_died exit N cpu S`, `program_died signal NAME cpu S` or
`program_died protocol MSG` and stops without `done`: the tests that called it
and all after them count for nothing.

Between the processes: 8-byte length-prefixed frames of `_encode`d messages
(harness_codec.py).
To the child: the init dict, then ["call", name, args, kwargs]. From it:
["syntax_error", text], ["program_error", text] or ["ready", [[name, "call"] |
[name, "value", value], ...]], then per call ["return", value], ["raise",
builtin type name, text] or ["unplain", text].
"""
# ruff: noqa: F821 (_encode and _decode are harness_codec.py's, sent before this file)


def _channel(os, read_fd, write_fd):
  """(send, receive) of length-prefixed frames; receive gives None at EOF."""
  read, write = os.read, os.write

  def send(data):
    view = memoryview(len(data).to_bytes(8, "little") + data)
    while view:
      view = view[write(write_fd, view):]

  def read_exactly(size):
    parts = []
    while size:
      part = read(read_fd, min(size, 1 << 20))
      if not part:
        return None
      parts.append(part)
      size -= len(part)
    return b"".join(parts)

  def receive():
    header = read_exactly(8)
    if header is None:
      return None
    size = int.from_bytes(header, "little")
    if size > 1 << 28:
      raise ValueError(f"a frame of {size} bytes")
    return read_exactly(size)

  return send, receive


def _message(exc):
  try:
    return str(exc)[:300].replace("\n", "\\n")
  except BaseException:  # a hostile __str__ must not take the caller down
    return ""


def _describe(exc):
  message = _message(exc)
  return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _kernel(_ctypes):
  """(prctl, confine) through `_ctypes` alone: the ctypes package's import costs 2.5 ms a run.

  prctl(option, arg2, arg3=0) raises OSError on failure; confine(bpf) installs
  the classic-BPF seccomp filter `bpf` on this single-threaded process for good.
  """
  class Int(_ctypes._SimpleCData):
    _type_ = "i"

  class ULong(_ctypes._SimpleCData):
    _type_ = "L"

  class UShort(_ctypes._SimpleCData):
    _type_ = "H"

  class Byte(_ctypes._SimpleCData):
    _type_ = "B"

  class Prctl(_ctypes.CFuncPtr):
    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = Int
    _argtypes_ = (Int, ULong, ULong, ULong, ULong)

  class Program(_ctypes.Structure):  # struct sock_fprog
    _fields_ = [("len", UShort), ("filter", ULong)]

  function = Prctl(_ctypes.dlsym(_ctypes.dlopen(None, _ctypes.RTLD_LOCAL), "prctl"))

  def prctl(option, arg2, arg3=0):
    if function(option, arg2, arg3, 0, 0) != 0:
      raise OSError(_ctypes.get_errno(), f"prctl({option})")

  def confine(bpf):
    prctl(38, 1)  # PR_SET_NO_NEW_PRIVS
    code = (Byte * len(bpf)).from_buffer_copy(bpf)
    program = Program(len(bpf) // 8, _ctypes.addressof(code))
    prctl(22, 2, _ctypes.addressof(program))  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER

  return prctl, confine


def _program(modules, confine, read_fd, write_fd):
  """The program process: runs the program, then answers calls until EOF. Never returns."""
  builtins, os, resource, sys = modules
  exit_now = os._exit
  send, receive = _channel(os, read_fd, write_fd)
  stdout, stderr = sys.stdout, sys.stderr
  exception_names = {v: k for k, v in vars(builtins).items()
                     if type(v) is type and issubclass(v, BaseException)}

  def reply(message, fallback=None):
    """Sends `message`, or `fallback` if `message` is not plain data."""
    for stream in (stdout, stderr):
      try:
        stream.flush()
      except BaseException:
        pass
    try:
      try:
        data = _encode(message)
      except BaseException:
        data = _encode(fallback)
      send(data)
    except BaseException:  # the harness is gone, or the program broke the pipe
      exit_now(70)

  try:
    init = _decode(receive())
  except BaseException:  # EOF (None) included: the harness is gone
    exit_now(70)
  for name, (soft, hard) in init["rlimits"].items():
    resource.setrlimit(getattr(resource, name), (soft, hard))
  if init["seccomp"] is not None:
    confine(init["seccomp"])
  try:
    code = compile(init["program"], "<program>", "exec")
  except BaseException as e:  # SyntaxError, ValueError (NUL bytes), RecursionError, ...
    reply(["syntax_error", _describe(e)])
    exit_now(0)
  namespace = {"__name__": init["module_name"], "__builtins__": builtins}
  try:
    exec(code, namespace)
  except BaseException as e:  # SystemExit and KeyboardInterrupt included
    reply(["program_error", _describe(e)])
    exit_now(0)
  found = []
  for name in init["names"]:
    if name in namespace:
      value = namespace[name]
      try:
        _encode(value)
        found.append([name, "value", value])
      except BaseException:
        found.append([name, "call"])
  reply(["ready", found])

  while True:
    try:
      _, name, args, kwargs = _decode(receive())
    except BaseException:  # EOF (None) included: the harness is done
      exit_now(0)
    try:
      result = namespace[name](*args, **kwargs)
    except BaseException as e:
      builtin = next((exception_names[k] for k in type(e).__mro__ if k in exception_names),
                     "BaseException")
      own = type(e).__name__
      reply(["raise", builtin, _message(e) if own == builtin else _describe(e)])
      continue
    reply(["return", result],
          ["unplain", f"{name}() returned a value of type {type(result).__name__}, "
                      "which is not plain data"])


def _main():
  import _ctypes
  import _signal
  import _thread
  import builtins
  import marshal
  import os
  import resource
  import sys
  import time

  job_fd, report_fd = int(sys.argv[1]), int(sys.argv[2])
  prctl, confine = _kernel(_ctypes)
  # Non-dumpable (inherited by the child): the program process, same uid, cannot
  # open this process's /proc/1/{mem,fd,environ,...}.
  prctl(4, 0)  # PR_SET_DUMPABLE
  # As init, the harness gets only the signals it handles: none from the program.
  _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
  # The working directory is writable by the program: never import from it.
  sys.path[:] = [p for p in sys.path if p and p != os.getcwd()]

  to_child_r, to_child_w = os.pipe()
  from_child_r, from_child_w = os.pipe()
  child = os.fork()
  if child == 0:
    for fd in (job_fd, report_fd, to_child_w, from_child_r):
      os.close(fd)
    _program((builtins, os, resource, sys), confine, to_child_r, from_child_w)
  os.close(to_child_r)
  os.close(from_child_w)

  chunks = []
  while True:
    chunk = os.read(job_fd, 1 << 20)
    if not chunk:
      break
    chunks.append(chunk)
  os.close(job_fd)
  job = marshal.loads(b"".join(chunks))  # from the host: trusted
  del chunks

  write, exit_now = os.write, os._exit
  prefix = job.pop("nonce").encode() + b" "
  stdout, stderr = sys.stdout, sys.stderr
  send, receive = _channel(os, from_child_r, to_child_w)
  signal_names = {v: k for k, v in vars(_signal).items()
                  if k.startswith("SIG") and "_" not in k and type(v) is int}

  def emit(line):
    data = prefix + line.encode("utf-8", "replace") + b"\n"
    try:
      while data:
        data = data[write(report_fd, data):]
    except OSError:
      exit_now(70)

  n_tests = job["n_tests"]
  reported = [False] * n_tests

  def flush():
    for stream in (stdout, stderr):
      try:
        stream.flush()
      except BaseException:
        pass

  def finish(reason_event=None):
    if reason_event:
      emit(reason_event)
    for i in range(n_tests):
      if not reported[i]:
        emit(f"test {i} skip")
    emit("done")
    flush()
    exit_now(0)

  def program_died(broken=""):
    """Reports how the program process ended and stops: the report stays incomplete."""
    if not broken:  # EOF: the child is exiting, or closed its end and lives on
      for _ in range(100):
        pid, status, usage = os.wait4(child, os.WNOHANG)
        if pid:
          break
        time.sleep(0.01)
    if broken or not pid:
      os.kill(child, _signal.SIGKILL)
      _, status, usage = os.wait4(child, 0)
    cpu = f"{usage.ru_utime + usage.ru_stime:.2f}"
    if broken:
      emit(f"program_died protocol {broken[:200]}".replace("\n", "\\n"))
    elif os.WIFSIGNALED(status):
      number = os.WTERMSIG(status)
      emit(f"program_died signal {signal_names.get(number, number)} cpu {cpu}")
    else:
      emit(f"program_died exit {os.waitstatus_to_exitcode(status)} cpu {cpu}")
    flush()
    exit_now(0)

  def request(message):
    try:
      send(_encode(message))
    except OSError:
      program_died()

  def response():
    """The child's next message, or the end of the run if there is none."""
    try:
      frame = receive()
      answer = None if frame is None else _decode(frame)
    except BaseException as e:
      program_died(f"an unreadable reply: {_describe(e)}")
    if frame is None:
      program_died()
    if type(answer) is not list or not answer or type(answer[0]) is not str:
      program_died("a reply that is not a tagged list")
    return answer

  def clean(text):
    if type(text) is not str:
      program_died("a message that is not a string")
    return text[:300].replace("\n", "\\n")

  # The program starts at once; the harness sets itself up while it runs.
  emit("start")
  entry_point = job["entry_point"]
  wanted = {n for n in job["names"] if not n.startswith("__") and n not in vars(builtins)}
  wanted.update(job["program_names"], [entry_point] if entry_point else [])
  request({"program": job.pop("program"), "module_name": job["module_name"],
           "rlimits": job["rlimits"], "seccomp": job["seccomp"], "names": sorted(wanted)})

  cpu_limit = job["rlimits"]["RLIMIT_CPU"][0]

  def on_sigxcpu(*_):
    # Only the kernel's SIGXCPU counts: the program may send one too.
    if sum(os.times()[:2]) >= cpu_limit:
      os._exit(128 + _signal.SIGXCPU)

  # Init ignores signals it has no handler for, RLIMIT_CPU's SIGXCPU included.
  _signal.signal(_signal.SIGXCPU, on_sigxcpu)
  for name, (soft, hard) in job["rlimits"].items():
    resource.setrlimit(getattr(resource, name), (soft, hard))
  if job["seccomp"] is not None:
    confine(job["seccomp"])
  tests_code = compile(job["tests"], "<tests>", "exec")
  context_code = compile(job["context"], "<context>", "exec")
  if job["format"] == "unittest":
    import unittest
    test_result_cls = unittest.TestResult

  answer = response()
  if answer[0] in ("syntax_error", "program_error") and len(answer) == 2:
    finish(f"{answer[0]} {clean(answer[1])}")
  if answer[0] != "ready" or len(answer) != 2 or type(answer[1]) is not list:
    program_died(f"{answer[0][:20]!r} where 'ready' was due")
  emit("program ok")

  class ProgramError(Exception):
    """An error in the program process that is no builtin Exception type."""

  exceptions = {k: v for k, v in vars(builtins).items()
                if type(v) is type and issubclass(v, Exception)}
  channel_lock = _thread.allocate_lock()

  def proxy(name):
    def call(*args, **kwargs):
      try:
        message = _encode(["call", name, list(args), kwargs])
      except (TypeError, RecursionError) as e:
        raise ProgramError(f"{name}(): an argument is not plain data ({e})") from None
      with channel_lock:  # tests may call from threads; one exchange at a time
        try:
          send(message)
        except OSError:
          program_died()
        answer = response()
      kind = answer[0]
      if kind == "return" and len(answer) == 2:
        return answer[1]
      if kind == "raise" and len(answer) == 3 and type(answer[1]) is str:
        text = clean(answer[2])
        cls = exceptions.get(answer[1])
        try:
          error = ProgramError(f"{answer[1][:50]}: {text}") if cls is None else cls(text)
        except BaseException:
          error = ProgramError(f"{answer[1][:50]}: {text}")
        raise error
      if kind == "unplain" and len(answer) == 2:
        raise ProgramError(clean(answer[1]))
      program_died(f"a reply {kind[:20]!r} to a call")
    call.__name__ = call.__qualname__ = name
    return call

  program = {}
  for item in answer[1]:
    if type(item) is not list or not item or type(item[0]) is not str or item[0] not in wanted:
      program_died("a name that was not asked for")
    if item[1:] == ["call"]:
      program[item[0]] = proxy(item[0])
    elif len(item) == 3 and item[1] == "value":
      program[item[0]] = item[2]
    else:
      program_died("a malformed name entry")

  namespace = {"__name__": job["module_name"], "__builtins__": builtins, **program}
  try:
    exec(context_code, namespace)
    exec(tests_code, namespace)
    if job["format"] == "unittest":
      cases = [(namespace[c], m) for c, m in job["cases"]]
    else:
      args = (program[entry_point],) if entry_point else ()
      gen = namespace[job["gen_name"]](*args)
  except BaseException as e:
    finish(f"setup_error {_describe(e)}")

  def probe():
    """Calls the entry point on each probe's arguments and reports the answers as data."""
    call = program.get(entry_point)
    for i, args in enumerate(job["probes"]):
      try:
        if call is None:
          raise NameError(f"the program defines no {entry_point}")
        data = _encode(call(*args))
      except BaseException as e:  # the proxy's builtin exception or ProgramError
        emit(f"output {i} raise {type(e).__name__}")
        continue
      if len(data) > 1 << 14:
        import hashlib
        emit(f"output {i} large {hashlib.sha256(data).hexdigest()}")
      else:
        emit(f"output {i} return {data.hex()}")

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
        event = f"test {i} fail {_describe(e)}"
      reported[i] = True
      emit(event)
    probe()
    finish()

  while True:
    try:
      index, error = next(gen)
    except StopIteration:
      break
    except BaseException as e:  # a setup statement between tests raised
      finish(f"setup_error {_describe(e)}")
    if type(index) is not int or not 0 <= index < n_tests or reported[index]:
      finish(f"setup_error test plan yielded bad index {index!r}")
    reported[index] = True
    emit(f"test {index} pass" if error is None else f"test {index} fail {_describe(error)}")
  probe()
  finish()


if __name__ == "__main__":
  import builtins as _builtins
  _private = {"__builtins__": dict(vars(_builtins)), "__name__": "rlcode_harness"}
  for _function in (_encode, _decode, _channel, _message, _describe, _kernel, _program,
                    _main):
    _private[_function.__name__] = type(_main)(_function.__code__, _private)
  _private["_main"]()
