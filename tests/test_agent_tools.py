"""Each tool against a real sandbox session, and hostile calls through them."""

import zlib

import numpy as np
import pytest

from rlcode.agent import env as env_lib, tools
from rlcode.agent.memory import Memory
from rlcode.data.tasks import Task
from rlcode.sandbox.session import Session, SessionLimits

TASK = Task(id="t", prompt="p", tests="assert f(1) == 2\nassert f(2) == 3\nassert f(0) == 1\n",
            extra={"solution": "solution.py", "assemble": "completion",
                   "tests_format": "script", "tests_visible": "assert f(1) == 2\n"})
T = {t.name: t for t in tools.make_tools(tuple(tools.TOOLS))}


def bag_of_words(texts):
  """A stand-in embedding (words hashed with crc32, which unlike `hash` is not salted per
  process), for ranking tests that need no model."""
  out = np.zeros((len(texts), 64), np.float32)
  for i, text in enumerate(texts):
    for word in text.lower().replace("=", " ").split():
      out[i, zlib.crc32(word.encode()) % 64] += 1.0
  return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-6)


@pytest.fixture(scope="module")
def scorer():
  return env_lib.Scorer({"tests": 1.0})


@pytest.fixture
def ctx(scorer):
  with Session(SessionLimits(max_output_bytes=2048)) as s:
    yield tools.Context(session=s, task=TASK, run_tests=scorer.run_tests,
                        memory=Memory("all").episode(), embed=bag_of_words, bash_seconds=2.0)


@pytest.mark.slow
def test_bash_runs_in_the_workspace_with_limits(ctx):
  r = T["bash"](ctx, {"command": "echo hi > a.txt; cat a.txt; false"})
  assert r.text == "hi\n[exit code 1]" and not r.done
  assert ctx.session.read("a.txt") == "hi\n"
  r = T["bash"](ctx, {"command": "sleep 20"})
  assert "[killed after 2 s]" in r.text
  r = T["bash"](ctx, {"command": "yes | head -c 100000"})
  assert r.text.endswith("[output truncated: the first 2,048 bytes are shown]")
  assert len(r.text) < 2100


def test_hostile_bash_calls_are_contained(ctx):
  r = T["bash"](ctx, {"command": "cat /work/notes/*.md /root/.bashrc /etc/hostname"})
  assert r.text.count("No such file") == 3
  root = set(T["bash"](ctx, {"command": "ls ../.. /"}).text.split())
  assert not root & {"work", "root", "home", "etc"} and {"sandbox", "usr"} <= root
  r = T["bash"](ctx, {"command": "f(){ f|f& };f; sleep 1"})
  r = T["bash"](ctx, {"command": "ls /proc | grep -c '^[0-9]'"})
  assert int(r.text) <= 4
  r = T["bash"](ctx, {"command": "cat /dev/urandom"})
  assert "[output truncated: the first 2,048 bytes are shown]" in r.text
  assert len(r.text.encode("utf-8", "surrogatepass")) < 2048 * 3 + 100
  assert T["bash"](ctx, {"command": "echo still here"}).text == "still here\n"


def test_editor_view_create_replace_insert(ctx):
  e = T["editor"]
  assert "Wrote a/b.py (2 lines)" in e(ctx, {"command": "create", "path": "a/b.py",
                                           "file_text": "x = 1\ny = 2\n"}).text
  assert e(ctx, {"command": "view", "path": "a/b.py"}).text == "   1 x = 1\n   2 y = 2"
  assert e(ctx, {"command": "view", "path": "a/b.py", "view_range": [2, 2]}).text == "   2 y = 2"
  assert e(ctx, {"command": "view", "path": "."}).text == "a/b.py"
  assert "Replaced" in e(ctx, {"command": "str_replace", "path": "a/b.py", "old_str": "y = 2",
                              "new_str": "y = 3"}).text
  assert "Inserted after line 1" in e(ctx, {"command": "insert", "path": "a/b.py",
                                           "insert_line": 1, "new_str": "z = 0"}).text
  assert ctx.session.read("a/b.py") == "x = 1\nz = 0\ny = 3\n"


@pytest.mark.parametrize("args, message", [
    ({"command": "view", "path": "missing.py"}, "missing.py: no such file"),
    ({"command": "view", "path": "f.py", "view_range": [3, 9]}, "view_range must be"),
    ({"command": "str_replace", "path": "f.py", "old_str": "a"}, "occurs 2 times"),
    ({"command": "str_replace", "path": "f.py", "old_str": "q"}, "occurs 0 times"),
    ({"command": "insert", "path": "f.py", "insert_line": 9, "new_str": "x"},
     "insert_line must be in 0..2"),
    ({"command": "create", "path": "f.py"}, "needs ['file_text']"),
    ({"command": "create", "path": "../../etc/x", "file_text": "x"}, "outside the workspace"),
    ({"command": "view", "path": "/etc/passwd"}, "outside the workspace"),
])
def test_editor_errors_are_observations(ctx, args, message):
  ctx.session.write("f.py", "a\na\n")
  r = T["editor"](ctx, args)
  assert r.text.startswith("error:") and message in r.text and r.info["error"]


def test_text_and_semantic_search(ctx):
  ctx.session.write("cfg/a.txt", "mode = fast\n")
  ctx.session.write("cfg/b.txt", "name = demo\nOFFSET = 7\n")
  r = T["search"](ctx, {"query": "OFFSET"})
  assert r.text == "cfg/b.txt:2: OFFSET = 7"
  assert T["search"](ctx, {"query": "nothing here"}).text == "no matches"
  r = T["search"](ctx, {"query": "offset 7", "mode": "semantic"})
  assert r.text.splitlines()[0].startswith("cfg/b.txt:1-2")


def test_semantic_search_with_the_minilm_encoder(ctx):
  from rlcode.rewards import semantic
  ctx.embed = lambda texts: semantic.embed(list(texts))
  ctx.session.write("a.txt", "The cat sat on the mat and purred.\n")
  ctx.session.write("b.txt", "Quarterly revenue grew by eight percent.\n")
  r = T["search"](ctx, {"query": "a kitten resting", "mode": "semantic"})
  assert r.text.splitlines()[0].startswith("a.txt:1-1")


def test_run_tests_reports_the_first_failure(ctx):
  r = T["run_tests"](ctx, {})
  assert r.text.startswith("error: solution.py: no such file")
  ctx.session.write("solution.py", "def g(x):\n    return x\n")
  r = T["run_tests"](ctx, {})
  assert r.text.startswith("failed: 0/1 passed") and "f" in r.text
  assert "NameError" in r.text and not r.info["tests_passed"]
  ctx.session.write("solution.py", "def f(x):\n    return x + 1\n")
  r = T["run_tests"](ctx, {})
  assert r.text == "passed 1/1 tests" and r.info["tests_passed"]


def test_think_memory_finish(ctx):
  assert T["think"](ctx, {"thought": "K is 7"}).text == ""
  assert T["memory"](ctx, {"action": "store", "text": "K is 7 in notes"}).text == "Noted."
  assert ctx.memory.proposed == ["K is 7 in notes"]
  ctx.memory.close(True, [])
  r = T["memory"](ctx, {"action": "retrieve", "text": "what is K"})
  assert r.text == "- K is 7 in notes"
  assert T["finish"](ctx, {}).done


def test_a_view_of_a_million_lines_is_cut_at_the_source(ctx):
  ctx.session.write("big.txt", "\n" * 1_000_000)
  r = T["editor"](ctx, {"command": "view", "path": "big.txt"})
  lines = r.text.splitlines()
  assert len(lines) == tools.MAX_LINES + 1 and lines[-2] == f"{tools.MAX_LINES:4d} "
  assert lines[-1] == ("[... 999,800 more lines not shown; view a range with "
                       "view_range=[201, 400]]")
  r = T["editor"](ctx, {"command": "view", "path": "big.txt",
                        "view_range": [999_990, 1_000_000]})
  assert r.text.splitlines()[-1] == "1000000 " and "not shown" not in r.text
  ctx.session.write("wide.py", "x = '" + "y" * 500_000 + "'\n")
  r = T["editor"](ctx, {"command": "view", "path": "wide.py"})
  assert len(r.text) < 400 and r.text.endswith(" [... 499,706 more characters]")


def test_search_hits_on_megabyte_lines_are_cut_around_the_match(ctx):
  for i in range(5):
    ctx.session.write(f"h{i}.txt", "y" * 999_000 + "NEEDLE" + "y" * 994 + "\n")
  r = T["search"](ctx, {"query": "NEEDLE"})
  hits = r.text.splitlines()
  assert len(hits) == 5 and len(r.text) < 5 * 400
  assert all("NEEDLE" in h and h.startswith(f"h{i}.txt:1: [... 998,925 characters] ")
             for i, h in enumerate(hits))
  r = T["search"](ctx, {"query": "NEEDLE", "mode": "semantic"})
  assert len(r.text) < 5 * 400


def test_memory_refuses_a_note_over_its_limit(ctx):
  from rlcode.agent.memory import MAX_NOTE_CHARS
  r = T["memory"](ctx, {"action": "store", "text": "n " * (2 << 20)})
  assert r.text == (f"error: a note holds at most {MAX_NOTE_CHARS:,} characters; this one "
                    "has 4,194,304, and was not stored") and r.info["error"]
  assert T["memory"](ctx, {"action": "store", "text": "n" * MAX_NOTE_CHARS}).text == "Noted."
  assert ctx.memory.proposed == ["n" * MAX_NOTE_CHARS]
  ctx.memory.memory.notes.append("error: e -> fix: " + "z" * 100_000)
  r = T["memory"](ctx, {"action": "retrieve", "text": "e fix"})
  assert len(r.text) < MAX_NOTE_CHARS + 100 and r.text.endswith("more characters]")


def test_listings_lint_messages_and_echoed_paths_are_cut(ctx):
  ctx.session.exec("for i in $(seq 500); do : > f$i.txt; done")
  r = T["editor"](ctx, {"command": "view", "path": "."})
  assert len(r.text.splitlines()) == tools.MAX_LINES + 1
  assert r.text.endswith("\n[... 300 more files not shown]")
  r = T["editor"](ctx, {"command": "view", "path": "z" * 100_000})
  assert r.info["error"] and len(r.text) < 400 and r.text.endswith("more characters]")
  ctx.session.write("lint.py", "x" * 500_000 + "\n")
  r = T["lint"](ctx, {"path": "lint.py"})
  assert "F821" in r.text and len(r.text) < 400
