"""Running a repository's pytest tests over a tree of files in a sandbox.

`run(spec)` starts one sandbox (rlcode.sandbox.session: bubblewrap, a private workspace,
no network, rlimits, a wall clock), writes the tree into its workspace (one gzipped tar,
unpacked inside, with the test environment's hypothesis tables copied to
.hypothesis/unicode_data unless the tree has its own), binds the test environment
(rlcode.swe.testenv) read-only, runs `python3 -m pytest` on the spec's test files from
the workspace root with the report plugin (rlcode.swe.pytest_plugin), reads the plugin's
report back and ends the sandbox. `Runner` does that with each result cached on disk (and
`run_many` for many specs on a thread pool), under a hash of everything the run depends
on (the tree's contents, the test files, the test environment's versions, the limits,
and `attempt`, so that a second run meant to catch flaky tests is a real run).

What is trusted. The tests and the code under test run in one interpreter, which is the
sandbox's to contain: whatever they do (hang, exit, kill the interpreter, fill the disk,
try the network or the host's files) ends as a status here, never as an exception or a
hang of the caller. Their report is untrusted text: parsed line by line, each line must
carry the run's nonce and a known event, node ids are bounded, and a run whose report
does not end with `done` is a "timeout" (the wall clock passed) or a "crash" (anything
else), keeping the outcomes it did report. A test or code that means to forge its own
outcome can (it shares the interpreter with the plugin), as in SWE-bench; mining confirms
the passes it relies on with a second runner that reads each verdict from outside the
test's interpreter (rlcode.swe.crosscheck, with what that still cannot stop).

Node ids are pytest's, relative to the workspace root (`--rootdir`), so they run from the
repository's root. This module must not know about PRs, tasks or rewards.
"""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import hashlib
import io
import json
import os
import secrets
import shlex
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from tqdm import tqdm

from rlcode.sandbox.session import Session, SessionError, SessionLimits
from rlcode.swe import deps, testenv

OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
PASSING = ("passed", "xfailed")  # SWE-bench's PASSED and XFAIL
STATUSES = ("ok", "timeout", "crash", "sandbox_error")
RUNNER_VERSION = "3"  # bump when a change here changes results (it keys the cache)
_REPORT = ".rlcode_report.jsonl"
_ARGS = ".rlcode_args"
_TREE = ".rlcode_tree.b64"
_MAX_ID = 2000
_MAX_TESTS = 100_000
# Defines unpack(data): the gzipped tar `data` into the working directory, then
# hypothesis's Unicode tables from the test environment (testenv.HYPOTHESIS_DATA) unless
# the tree has its own .hypothesis/unicode_data. Standard library only (it runs in the
# sandbox; rlcode.swe.crosscheck's driver defines it too).
UNPACK_FUNCTION = ("def unpack(data):\n"
                   "  import io, os, shutil, tarfile\n"
                   "  tarfile.open(fileobj=io.BytesIO(data), mode='r:gz').extractall('.')\n"
                   f"  tables = {testenv.MOUNT + '/' + testenv.HYPOTHESIS_DATA!r}\n"
                   "  try:\n"
                   "    if os.path.isdir(tables) and not os.path.lexists('.hypothesis/unicode_data'):\n"
                   "      shutil.copytree(tables, '.hypothesis/unicode_data')\n"
                   "  except OSError:\n"
                   "    pass\n")
_UNPACK = (UNPACK_FUNCTION + "import base64, os\n"
           f"data = base64.b64decode(open({_TREE!r}).read()); os.remove({_TREE!r})\n"
           "unpack(data)\n")


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One pytest run.

  Attributes:
    files: the tree, path -> text, written into the workspace.
    tests: test files (or node ids) given to pytest, relative to the root.
    deps: distribution names of the test environment besides pytest (testenv.build).
    python_path: workspace directories on sys.path, after the test environment ("src"
      of a src layout, then ".").
    timeout: wall clock of the run, seconds; also its CPU seconds.
    hypothesis_examples: examples of each hypothesis test (0: the tests' own setting).
    attempt: a second run of the same tree is attempt 1 (a separate cache entry); it is
      also the run's PYTHONHASHSEED.
  """

  files: Mapping[str, str]
  tests: tuple[str, ...]
  deps: tuple[str, ...] = ()
  python_path: tuple[str, ...] = (".",)
  timeout: float = 120.0
  hypothesis_examples: int = 0
  attempt: int = 0


@dataclasses.dataclass(frozen=True)
class TestRun:
  """What one run gave back.

  Attributes:
    status: "ok" (the report ended with done), "timeout", "crash" or "sandbox_error".
    outcomes: node id -> one of OUTCOMES, for every test that reported.
    collect_errors: collector node id (a file) -> the end of its error text.
    exit_status: pytest's exit status when the run ended (None otherwise).
    seconds: wall time of the run (0 when it came from the cache).
    output: the end of pytest's own output (untrusted; for reading, not parsing).
  """

  __test__ = False  # not a pytest class

  status: str
  outcomes: Mapping[str, str] = dataclasses.field(default_factory=dict)
  collect_errors: Mapping[str, str] = dataclasses.field(default_factory=dict)
  exit_status: int | None = None
  seconds: float = 0.0
  output: str = ""

  def passing(self) -> frozenset[str]:
    return frozenset(t for t, o in self.outcomes.items() if o in PASSING)

  def to_json(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, d: Mapping) -> TestRun:
    return cls(d["status"], dict(d["outcomes"]), dict(d["collect_errors"]), d["exit_status"],
               0.0, d["output"])


def tree_hash(files: Mapping[str, str]) -> str:
  h = hashlib.sha256()
  for path in sorted(files):
    data = files[path].encode("utf-8", "surrogateescape")
    h.update(f"{path}\0{len(data)}\0".encode("utf-8", "surrogateescape") + data)
  return h.hexdigest()


def tarball(files: Mapping[str, str]) -> str:
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
    for path in sorted(files):
      data = files[path].encode("utf-8", "surrogateescape")
      info = tarfile.TarInfo(path)
      info.size, info.mode, info.mtime = len(data), 0o644, 0
      tar.addfile(info, io.BytesIO(data))
  return base64.b64encode(buf.getvalue()).decode("ascii")


def parse_report(text: str, nonce: str) -> tuple[dict, dict, int | None]:
  """(outcomes, collect errors, exit status or None) of the plugin's report; lines
  without the nonce, unknown events or malformed fields are ignored. A test reported
  twice keeps its worse outcome (not passing wins)."""
  outcomes: dict[str, str] = {}
  errors: dict[str, str] = {}
  status = None
  for line in text.splitlines():
    try:
      record = json.loads(line)
    except ValueError:
      continue
    if not isinstance(record, dict) or record.get("n") != nonce:
      continue
    event, node = record.get("e"), record.get("id")
    if event == "done" and type(record.get("status")) is int:
      status = record["status"]
    elif not isinstance(node, str) or len(node) > _MAX_ID:
      continue
    elif event == "test" and record.get("o") in OUTCOMES and len(outcomes) < _MAX_TESTS:
      before = outcomes.get(node)
      if before is None or before in PASSING and record["o"] not in PASSING:
        outcomes[node] = record["o"]
    elif event == "collect_error" and isinstance(record.get("msg"), str):
      errors[node] = record["msg"][-_MAX_ID:]
  return outcomes, errors, status


def session_limits(spec: RunSpec) -> SessionLimits:
  return SessionLimits(command_seconds=spec.timeout, cpu_seconds=int(spec.timeout) + 1,
                       memory_bytes=4 << 30, max_processes=256, max_file_bytes=64 << 20,
                       max_open_files=256, workdir_bytes=512 << 20,
                       max_output_bytes=8 << 10, output_limit_bytes=16 << 20,
                       max_read_bytes=32 << 20)


def python_path(spec: RunSpec) -> str:
  """PYTHONPATH of the tests' interpreter: the test environment first (a tree's pytest.py
  cannot stand in for pytest; the environment holds nothing the tree provides,
  testenv.build's exclude), then the tree's directories."""
  return ":".join([testenv.MOUNT] + ["/sandbox" if p == "." else f"/sandbox/{p}"
                                     for p in spec.python_path])


def command(spec: RunSpec, nonce: str) -> str:
  """The run's command line: python_path's sys.path, no site module (a tree's
  sitecustomize.py does not run)."""
  # Each attempt hashes strings with its own seed (the sandbox's default is 0, attempt 0's),
  # so that the miner's repeated runs of the gold patch see a test that depends on set or
  # dict order fail on some of them (rlcode.swe.validate).
  env = {"RLCODE_PYTEST_REPORT": f"/sandbox/{_REPORT}", "RLCODE_PYTEST_NONCE": nonce,
         "PYTHONPATH": python_path(spec), "PYTHONHASHSEED": str(spec.attempt)}
  if spec.hypothesis_examples:
    env["RLCODE_HYPOTHESIS_EXAMPLES"] = str(spec.hypothesis_examples)
  pytest = ["python3", "-S", "-m", "pytest", "-p", testenv.PLUGIN_MODULE, "-p", "no:cacheprovider",
            "--rootdir=/sandbox", "--continue-on-collection-errors", "-q", "--no-header",
            "--tb=line", "-o", "console_output_style=classic", f"@{_ARGS}"]
  return (" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " "
          + " ".join(shlex.quote(a) for a in pytest))


def environment(spec: RunSpec) -> testenv.TestEnv:
  return testenv.build(spec.deps, exclude=deps.top_level_names(spec.files))


def run(spec: RunSpec, env: testenv.TestEnv | None = None) -> TestRun:
  """One run of `spec` in a fresh session (module docstring); never raises for what the
  tests do."""
  env = env or environment(spec)
  nonce = secrets.token_hex(16)
  start = time.monotonic()
  try:
    with Session(session_limits(spec), mounts={testenv.MOUNT: env.path}) as session:
      session.write(_TREE, tarball(spec.files))
      unpacked = session.exec(f"python3 -S -c {shlex.quote(_UNPACK)}", timeout=60)
      if unpacked.exit_code != 0:
        return TestRun("sandbox_error", output=f"unpacking failed: {unpacked.output[-500:]}",
                       seconds=time.monotonic() - start)
      session.write(_ARGS, "".join(t + "\n" for t in spec.tests))
      result = session.exec(command(spec, nonce), timeout=spec.timeout)
      try:
        report = session.read(_REPORT)
      except SessionError:
        report = ""
  except SessionError as e:
    return TestRun("crash", output=f"the session died: {e}"[-2000:],
                   seconds=time.monotonic() - start)
  outcomes, errors, exit_status = parse_report(report, nonce)
  if exit_status is not None:
    status = "ok"
  else:
    status = "timeout" if result.timed_out else "crash"
  return TestRun(status, outcomes, errors, exit_status, time.monotonic() - start,
                 result.output[-2000:])


def cache_key(spec: RunSpec, env: testenv.TestEnv, how: str = "") -> str:
  """The cache's name of `spec`'s run in `env`; `how` names another way to run it (a
  second runner and its version)."""
  what = [RUNNER_VERSION, tree_hash(spec.files), list(spec.tests), sorted(env.versions.items()),
          list(spec.python_path), spec.timeout, spec.hypothesis_examples, spec.attempt,
          os.path.basename(env.path)] + ([how] if how else [])
  return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:32]


def cache_root(cache_dir: str | None = None) -> str:
  """Where runs are cached: `cache_dir`, else ~/.cache/rlcode/swe/runs (the miner's)."""
  return cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "rlcode", "swe", "runs")


class Runner:
  """`run` with a disk cache (module docstring): runs that end "ok", "timeout" or "crash"
  are kept under `cache_dir` (a sandbox error is not: it says nothing of the tree).
  Thread-safe; counts the runs it made (`ran`) and found (`cached`)."""

  def __init__(self, cache_dir: str | None = None, use_cache: bool = True):
    self.root, self.use_cache = cache_root(cache_dir), use_cache
    if use_cache:
      os.makedirs(self.root, exist_ok=True)
    self.ran = self.cached = 0
    self.seconds = 0.0
    self._lock = threading.Lock()

  def run(self, spec: RunSpec, how: Callable[[RunSpec, testenv.TestEnv], TestRun] = run,
          how_key: str = "", cache_timeouts: bool = True) -> TestRun:
    """`how(spec, env)`, this module's `run` unless given (a second runner, cached under
    `how_key`), or its cached result; cache_timeouts=False keeps a timed-out run out of
    the cache."""
    env = environment(spec)
    path = os.path.join(self.root, cache_key(spec, env, how_key) + ".json")
    if self.use_cache:
      found = _cached(path)
      if found is not None:
        with self._lock:
          self.cached += 1
        return found
    result = how(spec, env)
    with self._lock:
      self.ran += 1
      self.seconds += result.seconds
    if self.use_cache and result.status != "sandbox_error" and (
        cache_timeouts or result.status != "timeout"):
      _store(path, result)
    return result

  def run_many(self, specs: Sequence[RunSpec], *, workers: int = 1, progress: bool = False,
               desc: str = "tests") -> list[TestRun]:
    """`run` of every spec, `workers` at a time; results in order."""
    bar = tqdm(total=len(specs), desc=desc, unit="run", file=sys.stderr, leave=False,
               disable=not progress)
    with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
      futures = [pool.submit(self.run, s) for s in specs]
      for future in concurrent.futures.as_completed(futures):
        future.result()
        bar.update()
    bar.close()
    return [f.result() for f in futures]


def _cached(path: str) -> TestRun | None:
  try:
    with open(path) as f:
      return TestRun.from_json(json.load(f))
  except (OSError, ValueError, KeyError, TypeError):
    return None


def _store(path: str, result: TestRun) -> None:
  tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
  with open(tmp, "w") as f:
    json.dump(result.to_json(), f)
  os.replace(tmp, path)
