"""gs:// paths (the `.[gcs]` extra) against an in-process stand-in for gcsfs.

epath opens gs:// through fsspec's "gcs" filesystem. `FakeGcs` is fsspec's memory
filesystem with gcsfs's conventions (protocols gs and gcs, paths named "bucket/key" with
the scheme stripped, no leading slash), registered under both protocols for one test
and removed after, so everything below reads and writes memory, never the network.
What goes through it: sections sources (files and directories), git bundles (mining),
and a checkpoint directory's existence check. A gs:// checkpoint's arrays go through
tensorstore's own GCS driver, which no fsspec filesystem stands in for: not tested here.
A workdir is local (its metrics are local files), and a gs:// one is refused at load.
"""

from __future__ import annotations

import collections
import importlib
import subprocess
from typing import ClassVar

import fsspec
import pytest
from etils.epath import backend as epath_backend
from fsspec.implementations.memory import MemoryFileSystem
from fsspec.utils import stringify_path
from git_repos import Repo

from rlcode import cli
from rlcode.config import loader
from rlcode.data import sections as S
from rlcode.data.git import CACHE_ENV, MiningConfig, NotARepositoryError, mine
from rlcode.data.git.repo import BundleError, checkout
from rlcode.data.tasks import load_tasks
from rlcode.errors import BadInput, MissingInput
from rlcode.runs.checkpoint import Checkpointer

PROTOCOLS = ("gs", "gcs")
# The module, not the read-only view `fsspec.registry` that shadows its name.
REGISTRY = importlib.import_module("fsspec.registry")


def _fake_gcs_class():
  class FakeGcs(MemoryFileSystem):
    protocol = PROTOCOLS
    root_marker = ""
    store: ClassVar[dict] = {}
    pseudo_dirs: ClassVar[list] = [""]

    @classmethod
    def _strip_protocol(cls, path):
      path = stringify_path(path)
      for protocol in PROTOCOLS:
        path = path.removeprefix(f"{protocol}://")
      return path.rstrip("/")

  return FakeGcs


def _clear_epath_filesystems():
  # epath keeps the filesystem it got per protocol; a stale one would outlive the test.
  epath_backend.fsspec_backend._get_filesystem.cache_clear()


@pytest.fixture
def gcs(monkeypatch, tmp_path):
  """A fresh, empty FakeGcs behind gs:// for one test."""
  monkeypatch.setenv("EPATH_USE_TF", "false")  # with TensorFlow, epath would bypass fsspec
  monkeypatch.setenv(CACHE_ENV, str(tmp_path / "git-cache"))
  fake = _fake_gcs_class()
  for protocol in PROTOCOLS:
    monkeypatch.setitem(REGISTRY._registry, protocol, fake)
  _clear_epath_filesystems()
  yield fsspec.filesystem("gcs")
  fake.clear_instance_cache()
  _clear_epath_filesystems()


@pytest.fixture
def no_gcsfs(monkeypatch, tmp_path):
  """gs:// as it is without gcsfs installed, whether or not this machine has it."""
  monkeypatch.setenv("EPATH_USE_TF", "false")
  monkeypatch.setenv(CACHE_ENV, str(tmp_path / "git-cache"))
  for protocol in PROTOCOLS:
    monkeypatch.delitem(REGISTRY._registry, protocol, raising=False)
    monkeypatch.setitem(REGISTRY.known_implementations, protocol,
                        {"class": "rlcode_no_such_module.GCSFileSystem",
                         "err": "Please install gcsfs to access Google Storage"})
  _clear_epath_filesystems()
  yield
  _clear_epath_filesystems()


def _corpus(root):
  """A small tree with every kind of file the reader keeps, skips or counts."""
  files = {
      "guide.md": b"# Guide\n\nIntro.\n\n## Part\n\nThe body of the part is here.\n",
      "sub/notes.rst": b"Notes\n=====\n\nFirst.\n\nMore\n----\n\nThe second part's body.\n",
      "sub/deeper/mod.py": b"def f():\n  return 1\n\n\ndef g():\n  return 2\n",
      "sub/blob.md": b"\x00\x01binary",
      "latin.md": b"caf\xe9\n",
      "empty.txt": b"  \n",
      "image.png": b"\x89PNG",
      ".hidden.md": b"# Hidden\n",
      ".git/config": b"[core]\n",
  }
  for name, data in files.items():
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_sections_from_gs_match_the_same_files_read_locally(gcs, tmp_path, monkeypatch):
  local = tmp_path / "corpus"
  _corpus(local)
  gcs.put(str(local), "gs://bucket/corpus", recursive=True)
  # A local tree at the bucket's key, relative to the working directory: a gs:// walk
  # whose folders lost their scheme would read these instead, silently.
  monkeypatch.chdir(tmp_path)
  (tmp_path / "bucket" / "corpus").mkdir(parents=True)
  (tmp_path / "bucket" / "corpus" / "guide.md").write_text("# Decoy\n\nWrong.\n")

  local_stats, remote_stats = collections.Counter(), collections.Counter()
  want = S.read_documents([str(local)], local_stats)
  got = S.read_documents(["gs://bucket/corpus"], remote_stats)
  assert [d.id for d in got] == ["corpus/guide.md", "corpus/sub/deeper/mod.py",
                                 "corpus/sub/notes.rst"]
  assert got == want
  assert remote_stats == local_stats == {"skipped_binary": 1, "skipped_undecodable": 1,
                                         "skipped_empty": 1, "skipped_hidden": 2,
                                         "skipped_suffix": 1}
  one = S.read_documents(["gs://bucket/corpus/sub/notes.rst"])
  assert [(d.id, d.text) for d in one] == [("notes.rst", want[2].text)]


def test_section_tasks_build_from_gs(gcs, tmp_path):
  local = tmp_path / "corpus"
  _corpus(local)
  for i in range(6):
    (local / f"doc{i}.md").write_text(
        f"# Doc {i}\n\nIntro {i}.\n\n## Part\n\nThe body of part {i} is here.\n")
  gcs.put(str(local), "gs://bucket/corpus", recursive=True)
  opts = S.SectionOptions(held_out_fraction=0.5)
  want, counts = S.collect([str(local)], options=opts)
  assert counts["tasks_train"] and counts["tasks_test"]
  builder = S.SectionTasks(data_dir=str(tmp_path / "tfds"), sources=["gs://bucket/corpus"],
                           options=opts)
  for split in opts.splits:
    assert load_tasks(builder, split) == sorted(want[split], key=lambda t: t.id)
  assert builder.counts == counts


def _bundle(tmp_path):
  repo = Repo(tmp_path / "lin")
  for i in range(3):
    repo.commit(f"Step {i}", {"src/s.py": "".join(f"s{k} = {k}\n" for k in range(i + 2))})
  bundle = tmp_path / "lin.bundle"
  repo.git("bundle", "create", "-q", str(bundle), "HEAD", "main")
  return repo, bundle


def test_bundle_from_gs_mines_as_the_local_bundle(gcs, tmp_path):
  repo, bundle = _bundle(tmp_path)
  gcs.put(str(bundle), "gs://bucket/history/lin.bundle")
  cache = str(tmp_path / "cache")
  remote = checkout("gs://bucket/history/lin.bundle", cache)
  assert remote == checkout(str(bundle), cache)  # the clone is keyed by the bytes
  head = subprocess.run(["git", "--git-dir", remote, "rev-parse", "main"],
                        capture_output=True, check=True, text=True).stdout.strip()
  assert head == repo.git("rev-parse", "main")
  local = mine(MiningConfig(source=str(bundle), test_fraction=0.0))
  mined = mine(MiningConfig(source="gs://bucket/history/lin.bundle", test_fraction=0.0))
  assert mined.splits == local.splits and mined.report["commits_kept"] == 3


def test_bad_gs_inputs_fail_in_one_line(gcs, tmp_path, capsys):
  gcs.pipe("gs://bucket/junk.bundle", b"not a bundle")
  gcs.pipe("gs://bucket/dir/a.md", b"# A\n")
  with pytest.raises(MissingInput, match=r"'gs://bucket/nope' is neither a file nor"):
    S.read_documents(["gs://bucket/nope"])
  with pytest.raises(NotARepositoryError, match=r"'gs://bucket/nope.bundle': no such bundle"):
    checkout("gs://bucket/nope.bundle", str(tmp_path / "cache"))
  with pytest.raises(NotARepositoryError, match=r"'gs://bucket/dir': no such bundle"):
    checkout("gs://bucket/dir", str(tmp_path / "cache"))
  with pytest.raises(BundleError, match=r"'gs://bucket/junk.bundle' is a file but not"):
    checkout("gs://bucket/junk.bundle", str(tmp_path / "cache"))
  with pytest.raises(MissingInput, match="no checkpoint under gs://bucket/run"):
    Checkpointer("gs://bucket/run", create=False)
  with pytest.raises(BadInput, match=r"'s3://bucket/docs': s3:// is not read here"):
    S.read_documents(["s3://bucket/docs"])
  assert cli.main(["mine", "gs://bucket/nope.bundle", "--out", str(tmp_path / "o")]) == 2
  err = capsys.readouterr().err
  assert err == ("rlcode mine: error: source 'gs://bucket/nope.bundle': no such bundle "
                 "object\n")
  assert not (tmp_path / "o").exists()


def test_gs_without_gcsfs_fails_in_one_line(no_gcsfs, tmp_path, capsys):
  need = r"gs:// paths are read through gcsfs, which is not installed \(pip install"
  with pytest.raises(BadInput, match=rf"sections source 'gs://bucket/docs': {need}"):
    S.read_documents(["gs://bucket/docs"])
  with pytest.raises(BadInput, match=rf"source 'gs://bucket/a.bundle': {need}"):
    checkout("gs://bucket/a.bundle", str(tmp_path / "cache"))
  with pytest.raises(BadInput, match=rf"checkpoint directory 'gs://bucket/run': {need}"):
    Checkpointer("gs://bucket/run", create=False)
  assert not (tmp_path / "cache").exists()
  assert cli.main(["mine", "gs://bucket/a.bundle", "--out", str(tmp_path / "o")]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "'.[gcs]'" in err and "Traceback" not in err


def test_a_gs_workdir_is_refused_at_load():
  # A run's metrics and config record are local files: a gs:// workdir would split the
  # run between a bucket (checkpoints) and a local folder named "gs:".
  with pytest.raises(BadInput, match=r"config.workdir='gs://bucket/run': must be a local "
                                     "directory"):
    loader.load_config("configs/grpo_tiny.py", ["--config.workdir=gs://bucket/run"])
