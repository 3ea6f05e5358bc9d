"""The read-only test environment a repository's tests run with: pytest, the repository's
declared pure-Python test dependencies, and our report plugin, copied from this host's
Python environment into one directory that sandboxes bind at `MOUNT`.

Distributions are found by name in the host's environment (importlib.metadata), with
their requirements followed (markers evaluated for the host's Python, extras not taken);
each is copied file by file from its RECORD (what pip installed, nothing else). The
sandbox's interpreter may be another build than this process's (a root host runs
sessions with /usr/bin/python3), so a distribution that ships compiled extensions is
copied only when every one of them is built for that interpreter (its file name ends in
one of the interpreter's extension suffixes, such as cpython-311-x86_64-linux-gnu.so or
abi3.so: hypothesis ships one since 6.1xx); otherwise it is left out. A name the host
does not have is left out too; both are reported (`TestEnv.missing`,
`TestEnv.compiled`), and a test that imports one fails to collect, which the miner
counts as a missing dependency.

The directory is compiled once, as it is built, for the sandbox's interpreter: every
module to a hash-checked .pyc, and the modules pytest rewrites (those of every
distribution with a pytest plugin, such as hypothesis) to pytest's own cached .pyc, by a
pytest run that imports them (`_precompile`). A sandbox binds the directory
read-only, so neither Python nor pytest could write these caches there: without them
every run compiled pytest and re-rewrote hypothesis (measured: a 3-test attrs run took
1.1 s, and takes 0.45 s with them). Both kinds of cache are checked against their
source's hash when read, so a stale or missing one is only slower, never different.

When hypothesis is in it, the directory also holds hypothesis's Unicode tables
(`HYPOTHESIS_DATA`), computed by hypothesis itself for the sandbox's interpreter: the
character categories and the characters each common codec encodes. Hypothesis keeps them
in its storage directory, .hypothesis/ in the workspace, which every run starts without,
so every run that drew from st.text() (whose alphabet is the utf-8 codec's) recomputed
them by encoding every code point: about 1 s a run (measured: an attrs run of
tests/test_make.py took 4.8 s, 3.8 s with the tables in place). A run copies them into
its workspace (rlcode.swe.runner), and hypothesis reads them instead; they are the
tables it would have computed, so no test sees a difference.

The directory is cached under a hash of what it holds (names, versions, the plugin's
text, the build's format), made in a temporary directory beside it and renamed into
place, world-readable (a root host runs sessions as uid 65534). Its location:
$RLCODE_TESTENV_DIR, else ~/.cache/rlcode/testenv when uid 65534 can reach it, else
<tmp>/rlcode-testenv-<uid>.

This module must not run a repository's tests nor read repositories: it assembles a
directory (its one pytest run imports the directory's own modules).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata as metadata
import os
import re
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path

from packaging.markers import InvalidMarker, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement

from rlcode.sandbox import session

ENV_VAR = "RLCODE_TESTENV_DIR"
MOUNT = "/opt/testenv"
PLUGIN_MODULE = "rlcode_pytest_report"
PLUGIN_SOURCE = Path(__file__).with_name("pytest_plugin.py").read_text()
_FORMAT = "3"  # bump when a change here changes what a built directory holds
# Hypothesis's Unicode tables, computed for the sandbox's interpreter (`_hypothesis_data`):
# a run copies this directory to .hypothesis/unicode_data in its workspace.
HYPOTHESIS_DATA = "hypothesis-unicode-data"
# The codecs whose tables are computed: st.text()'s default alphabet is utf-8.
_CODECS = ("utf-8", "ascii", "iso8859-1")
_HYPOTHESIS_TABLES = """\
import sys
from hypothesis.internal import charmap
charmap.charmap()
for codec in sys.argv[1:]:
  charmap.intervals_from_codec(codec)
"""
_WARM_SECONDS = 600
# Imports every submodule of the modules named in $RLCODE_WARM, under pytest's
# assertion rewriting (a module that does not import is passed over: an optional
# dependency this environment lacks).
_WARM_TEST = """\
import importlib, os, pkgutil


def test_import_every_rewritten_module():
  for name in os.environ["RLCODE_WARM"].split(","):
    try:
      module = importlib.import_module(name)
    except BaseException:
      continue
    path = getattr(module, "__path__", None)
    for info in pkgutil.walk_packages(path or [], name + ".", onerror=lambda _: None):
      try:
        importlib.import_module(info.name)
      except BaseException:
        pass
"""
_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class TestEnv:
  """A built test environment: its host directory and what went into it.

  Attributes:
    path: the host directory (bind it read-only at MOUNT).
    versions: distribution name -> version, of everything copied.
    missing: asked-for names (or their requirements) the host does not have.
    compiled: names left out because they ship compiled code.
  """

  __test__ = False  # not a pytest class

  path: str
  versions: dict[str, str]
  missing: tuple[str, ...]
  compiled: tuple[str, ...]


def canonical(name: str) -> str:
  """PEP 503's normalised project name."""
  return re.sub(r"[-_.]+", "-", name).lower()


def _world_reachable(path: str) -> bool:
  parts = Path(os.path.realpath(path)).parts
  return all(os.stat(os.path.join(*parts[:i])).st_mode & 0o001
             for i in range(1, len(parts) + 1))


def root_dir() -> str:
  """Where test environments are cached (module docstring)."""
  if os.environ.get(ENV_VAR):
    return os.environ[ENV_VAR]
  home = os.path.join(os.path.expanduser("~"), ".cache", "rlcode", "testenv")
  parent = os.path.dirname(home)
  if os.geteuid() != 0 or (os.path.isdir(parent) and _world_reachable(parent)):
    return home
  return os.path.join(tempfile.gettempdir(), f"rlcode-testenv-{os.geteuid()}")


@functools.lru_cache(maxsize=None)
def extension_suffixes(python: str) -> tuple[str, ...]:
  """The file suffixes of extension modules the interpreter `python` loads."""
  out = subprocess.run([python, "-S", "-c", "import importlib.machinery as m; "
                        "print(chr(10).join(m.EXTENSION_SUFFIXES))"],
                       capture_output=True, text=True, check=True, timeout=60)
  return tuple(s for s in out.stdout.split() if s)


@functools.lru_cache(maxsize=None)
def python_version(python: str) -> str:
  """The version of the interpreter `python` ("3.11.2")."""
  out = subprocess.run([python, "-S", "-c", "import platform; print(platform.python_version())"],
                       capture_output=True, text=True, check=True, timeout=60)
  return out.stdout.strip()


def _foreign(dist: metadata.Distribution, suffixes: tuple[str, ...]) -> bool:
  """Whether `dist` ships an extension module the interpreter cannot load."""
  return any(str(f).endswith((".so", ".pyd")) and not str(f).endswith(suffixes)
             for f in dist.files or ())


def _requirements(dist: metadata.Distribution) -> list[str]:
  out = []
  for line in dist.requires or ():
    try:
      req = Requirement(line)
      if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    except (InvalidRequirement, InvalidMarker, UndefinedEnvironmentName):
      continue
    out.append(req.name)
  return out


def resolve(names: Iterable[str], suffixes: tuple[str, ...] = ()
            ) -> tuple[dict[str, metadata.Distribution], list[str], list[str]]:
  """(canonical name -> distribution, missing names, compiled names) of `names` and
  everything they require, from the host's environment; `suffixes`: the extension
  suffixes the sandbox's interpreter loads (others make a distribution "compiled")."""
  found: dict[str, metadata.Distribution] = {}
  missing, compiled = set(), set()
  todo = [canonical(n) for n in names]
  while todo:
    name = todo.pop()
    if name in found or name in missing or name in compiled:
      continue
    try:
      dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
      missing.add(name)
      continue
    if _foreign(dist, suffixes):
      compiled.add(name)
      continue
    found[name] = dist
    todo.extend(canonical(r) for r in _requirements(dist))
  return found, sorted(missing), sorted(compiled)


def _copy(dist: metadata.Distribution, target: str) -> None:
  """The distribution's installed files (those under its site directory) into `target`."""
  base = Path(dist.locate_file("")).resolve()
  for f in dist.files or ():
    source = Path(dist.locate_file(f)).resolve()
    try:
      rel = source.relative_to(base)
    except ValueError:  # scripts and data installed outside the site directory
      continue
    if "__pycache__" in rel.parts:
      continue
    if not source.is_file():
      continue
    out = os.path.join(target, str(rel))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    shutil.copyfile(source, out)


def _readable(path: str) -> None:
  """Everything under `path` readable (and directories enterable) by any user."""
  for root, dirs, files in os.walk(path):
    os.chmod(root, 0o755)
    for name in files:
      os.chmod(os.path.join(root, name), 0o644)
  os.chmod(path, 0o755)


def _publish(made: str, target: str) -> None:
  """The directory `made` world-readable and renamed to `target`, unless another process
  already put its identical directory there (both are named by what they hold)."""
  _readable(made)
  try:
    os.rename(made, target)
  except OSError:
    if not os.path.isdir(target):
      raise


def _safe_root(root: str) -> None:
  """Makes the cache root, refusing one another user could write into."""
  os.makedirs(root, mode=0o755, exist_ok=True)
  st = os.stat(root)
  if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
    raise PermissionError(f"{root}: the test environment cache must be owned by uid "
                          f"{os.geteuid()} and writable by it alone (set ${ENV_VAR})")
  os.chmod(root, 0o755)


def _rewritten(dists: Iterable[metadata.Distribution]) -> list[str]:
  """The top-level modules pytest rewrites: all of each distribution that has a pytest
  plugin (an entry point in the group pytest11), as pytest marks them."""
  return sorted({m for d in dists if d.entry_points.select(group="pytest11")
                 for m in _modules(d)})


def _precompile(path: str, dists: Iterable[metadata.Distribution]) -> None:
  """Writes the bytecode caches of the environment at `path` for the sessions'
  interpreter (module docstring). Best effort: a module that does not compile or import
  is left to be compiled when a run imports it, as before."""
  python = session.interpreter_path()
  env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": path,
         "RLCODE_WARM": ",".join(_rewritten(dists))}
  with tempfile.TemporaryDirectory(prefix="warm-") as warm:
    with open(os.path.join(warm, "pytest.ini"), "w") as f:
      f.write("[pytest]\n")
    with open(os.path.join(warm, "test_warm.py"), "w") as f:
      f.write(_WARM_TEST)
    commands = [[python, "-S", "-m", "compileall", "-q", "-j", "0",
                 "--invalidation-mode", "checked-hash", path]]
    if env["RLCODE_WARM"]:
      commands.append([python, "-S", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                       "-c", "pytest.ini", "--rootdir", warm, "test_warm.py"])
    for command in commands:
      try:
        subprocess.run(command, cwd=warm, env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=_WARM_SECONDS, check=False)
      except (OSError, subprocess.SubprocessError):
        pass


def _hypothesis_data(path: str, root: str, version: str) -> None:
  """Hypothesis's Unicode tables, computed by the environment's own hypothesis (of
  `version`) for the sandbox's interpreter, into `path`/HYPOTHESIS_DATA (module
  docstring). They depend on nothing else, so they are computed once per hypothesis
  version under `root` and copied into each environment. Best effort: a table that could
  not be computed is computed by the runs that need it, as before."""
  python = session.interpreter_path()
  key = hashlib.sha256(repr((python, python_version(python), version, _CODECS)).encode()
                       ).hexdigest()[:16]
  shared = os.path.join(root, f"hypothesis-tables-{key}")
  if not os.path.isdir(shared):
    with tempfile.TemporaryDirectory(prefix="tables-", dir=root) as work:
      store = os.path.join(work, "store")
      env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": path,
             "HYPOTHESIS_STORAGE_DIRECTORY": store}
      try:
        subprocess.run([python, "-S", "-c", _HYPOTHESIS_TABLES, *_CODECS], cwd=work,
                       env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=_WARM_SECONDS, check=False)
      except (OSError, subprocess.SubprocessError):
        return
      tables = os.path.join(store, "unicode_data")
      if not os.path.isdir(tables):
        return
      _publish(tables, shared)
  shutil.copytree(shared, os.path.join(path, HYPOTHESIS_DATA))


def _modules(dist: metadata.Distribution) -> set[str]:
  """The top-level module names a distribution installs."""
  out = set()
  for f in dist.files or ():
    first = str(f).split("/", 1)[0]
    if first.endswith((".dist-info", ".egg-info", ".data")) or first in ("..", "__pycache__"):
      continue
    out.add(first.split(".", 1)[0])
  return out


def build(names: Iterable[str], root: str | None = None,
          exclude: Iterable[str] = ()) -> TestEnv:
  """The test environment of pytest plus `names` for the sandbox's interpreter (built
  once, then reused). `exclude`: module names the repository provides itself; a
  distribution installing one is left out, so that it cannot shadow the repository's
  own code (the environment comes first on sys.path)."""
  return _build(tuple(sorted(set(names))), root or root_dir(), frozenset(exclude))


@functools.lru_cache(maxsize=256)
def _build(names: tuple[str, ...], root: str, exclude: frozenset[str]) -> TestEnv:
  suffixes = extension_suffixes(session.interpreter_path())
  found, missing, compiled = resolve(["pytest", *names], suffixes)
  found = {n: d for n, d in found.items() if not _modules(d) & exclude}
  versions = {n: found[n].version for n in sorted(found)}
  key = hashlib.sha256(repr((sorted(versions.items()), PLUGIN_SOURCE, suffixes,
                             _FORMAT)).encode()).hexdigest()[:16]
  target = os.path.join(root, key)
  with _LOCK:
    if not os.path.isdir(target):
      _safe_root(root)
      tmp = tempfile.mkdtemp(prefix="build-", dir=root)
      try:
        for dist in found.values():
          _copy(dist, tmp)
        with open(os.path.join(tmp, PLUGIN_MODULE + ".py"), "w") as f:
          f.write(PLUGIN_SOURCE)
        _precompile(tmp, found.values())
        if "hypothesis" in found:
          _hypothesis_data(tmp, root, found["hypothesis"].version)
        _publish(tmp, target)
      finally:
        if os.path.isdir(tmp):
          shutil.rmtree(tmp)
  return TestEnv(target, versions, tuple(missing), tuple(compiled))
