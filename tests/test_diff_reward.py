"""The SWE-RL diff reward on hand-written cases, and the answer formats.

Expected values are worked out by hand (the SequenceMatcher ratio of a small
case is counted character by character in a comment) or are the values
facebookresearch/swe-rl's own tests (tests/test_reward.py) assert for the
same inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlcode import rewards
from rlcode.data import edits
from rlcode.data.tasks import Task
from rlcode.rewards import diffs

FILE_A = "def add(a, b):\n    return a + b\n\ndef subtract(a, b):\n    return a - b"
FILE_A_ORACLE = ("def add(a: int, b: int) -> int:\n    return a + b\n\n"
                 "def subtract(a: float, b: float) -> float:\n    return a - b")
FILE_B = "def sort_list(lst):\n    return sorted(lst)"
FILE_B_ORACLE = "def sort_list(lst: list[int]) -> list[int]:\n    return sorted(lst)"
FILES = {"a.py": FILE_A, "b.py": FILE_B}
ORACLE = {"a.py": FILE_A_ORACLE, "b.py": FILE_B_ORACLE}


def block(path, search, replace, fence="```python"):
  return (f"{fence}\n### {path}\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n"
          ">>>>>>> REPLACE\n```")


def answer(*blocks, thought="dummy"):
  return (f"<think>\n{thought}\n</think>\n<solution>\n" + "\n\n".join(blocks)
          + "\n</solution>\n")


ADD = block("a.py", "def add(a, b):", "def add(a: int, b: int) -> int:", "```")
SUB = block("a.py", "def subtract(a, b):",
            "def subtract(a: float, b: float) -> float:")
SORT = block("b.py", "def sort_list(lst):",
             "def sort_list(lst: list[int]) -> list[int]:")

# (name, completion, expected reward, expected error code or None)
CASES = [
    # swe-rl tests/test_reward.py::test_multifile_edit
    ("exact multi-file", answer(ADD, SUB, SORT), 1.0, None),
    # ::test_zero_reward: only a new file the oracle does not touch; the mean
    # over {a.py, b.py, c.py} of 0, 0, 0.
    ("only a new file", answer(block("c.py", "", "# dummy", "```")), 0.0, None),
    # ::test_new_file: c.py made then edited, b.py exact: (0 + 1 + 0) / 3.
    ("new file and b", answer(block("c.py", "", "# dummy", "```"),
                              block("c.py", "# dummy", 'print("hello")', "```"),
                              block("b.py", "def sort_list(lst):",
                                    "def sort_list(lst: list[int]) -> list[int]:",
                                    "```")), 1 / 3, None),
    # b.py exact, a.py untouched by the prediction: (0 + 1) / 2.
    ("one of two files", answer(SORT), 0.5, None),
    # ::test_failed_parse, first output: no </solution>.
    ("truncated", "\n<think>\ndummy\n</think>\n<solution>\n", -1.0, "tag_count"),
    # ::test_failed_parse, second output: no >>>>>>> REPLACE, so no block.
    ("no replace marker", "<think>\ndummy\n</think>\n<solution>\n```\n### a.py\n"
     "<<<<<<< SEARCH\nreturn a + b\n=======\nreturn a - b\n```\n</solution>",
     -1.0, "no_edits"),
    ("two thoughts", "<think>x</think>" + answer(SORT), -1.0, "tag_count"),
    ("no think", answer(SORT).replace("<think>", ""), -1.0, "tag_count"),
    ("empty thought", answer(SORT, thought="  "), -1.0, "empty_thought"),
    ("no block", answer("I would change sort_list."), -1.0, "no_edits"),
    ("search not found", answer(block("b.py", "def sort(lst):", "x")), -1.0,
     "search_not_found"),
    # A SEARCH must start at a line start: the indentation is part of it.
    ("search without indentation",
     answer(block("b.py", "return sorted(lst)", "return lst")), -1.0,
     "search_not_found"),
    ("search equals replace",
     answer(SORT, block("a.py", "def add(a, b):", "def add(a, b):")), -1.0,
     "search_equals_replace"),
]


@pytest.mark.parametrize("name,completion,expected,error", CASES,
                         ids=[c[0] for c in CASES])
def test_reward_table(name, completion, expected, error):
  del name
  reward, details = diffs.score_details(completion, FILES, ORACLE)
  assert reward == pytest.approx(expected, abs=1e-12)
  assert details.get("error") == error
  assert diffs.score(completion, FILES, ORACLE) == reward


def test_hand_computed_ratio():
  # Normalized patches, 17 characters each:
  #   pred   "@@ -1 +1 @@\n-a\n+b"
  #   oracle "@@ -1 +1 @@\n-a\n+c"
  # The longest common block is the first 16 characters and nothing else
  # matches, so ratio = 2 * 16 / (17 + 17) = 16 / 17.
  files, oracle = {"f.py": "a\n"}, {"f.py": "c\n"}
  assert edits.normalized_patch("a\n", "b\n") == "@@ -1 +1 @@\n-a\n+b"
  reward, details = diffs.score_details(answer(block("f.py", "a", "b")),
                                        files, oracle)
  assert reward == 16 / 17
  assert details == {"similarities": {"f.py": 16 / 17}, "exact": False}


def test_two_file_mean_of_ratios():
  # f.py exact (1.0), g.py predicted "b" for oracle "c" (16/17): the mean.
  files = {"f.py": "x\n", "g.py": "a\n"}
  oracle = {"f.py": "y\n", "g.py": "c\n"}
  completion = answer(block("f.py", "x", "y"), block("g.py", "a", "b"))
  assert diffs.score(completion, files, oracle) == (1 + 16 / 17) / 2


def test_every_occurrence_is_replaced():
  # SWE-RL replaces all occurrences of a SEARCH text, not only the first.
  new = edits.apply_search_replace({"f.py": "x = 1\ny\nx = 1\n"},
                                   {"f.py": [("x = 1", "x = 2")]})
  assert new == {"f.py": "x = 2\ny\nx = 2\n"}


def test_final_newline_and_crlf_changes_are_invisible():
  assert edits.normalized_patch("a\nb", "a\nb\n") == ""
  assert edits.normalized_patch("a\nb\n", "a\r\nb\r\n") == ""
  with pytest.raises(ValueError, match="changes nothing"):
    diffs.score(answer(block("f.py", "a", "b")), {"f.py": "a"}, {"f.py": "a\n"})


# ---------------------------------------------------------------------------
# The unified-diff answer format.

def diff_answer(text):
  return answer("```diff\n" + text + "\n```")


def test_unified_diff_exact_and_hand_computed():
  files, oracle = {"f.py": "a\n"}, {"f.py": "c\n"}
  exact = diff_answer("--- a/f.py\n+++ b/f.py\n@@ -1 +1 @@\n-a\n+c")
  assert diffs.score(exact, files, oracle, "unified_diff") == 1.0
  near = diff_answer("--- a/f.py\n+++ b/f.py\n@@ -1,1 +1,1 @@\n-a\n+b")
  assert diffs.score(near, files, oracle, "unified_diff") == 16 / 17


def test_unified_diff_scores_the_effect_not_the_text():
  # Wrong line numbers, no context and no a/ b/ prefixes: the same effect as
  # the oracle, so the same score as an exact SEARCH/REPLACE answer.
  files = {"m.py": "".join(f"l{i}\n" for i in range(10))}
  oracle = {"m.py": files["m.py"].replace("l7\n", "seven\n")}
  text = "--- m.py\n+++ m.py\n@@ -3,1 +3,1 @@\n-l7\n+seven"
  assert diffs.score(diff_answer(text), files, oracle, "unified_diff") == 1.0


def test_unified_diff_new_file_and_no_newline_marker():
  files = {"f.py": "a\nb"}
  oracle = {"f.py": "a\nB\n", "new.py": "x = 1\n"}
  text = ("--- a/f.py\n+++ b/f.py\n@@ -1,2 +1,2 @@\n a\n-b\n"
          "\\ No newline at end of file\n+B\n"
          "--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+x = 1")
  assert edits.apply_completion(diff_answer(text), files, "unified_diff") == oracle


@pytest.mark.parametrize("text,code", [
    ("--- a/f.py\n+++ b/f.py\n@@ -1 +1 @@\n-zzz\n+c", "hunk_does_not_apply"),
    ("--- a/f.py\n+++ b/f.py\n@@ -1,2 +1,1 @@\n-a\n+c", "bad_hunk"),
    ("--- a/f.py\n+++ b/f.py\n@@ -1 +1 @@\n-a\n+c\n+d", "bad_hunk"),
    ("@@ -1 +1 @@\n-a\n+c", "bad_hunk"),
    ("--- a/f.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-a", "deletion"),
    ("I would replace a by c.", "no_edits"),
])
def test_unified_diff_format_errors(text, code):
  reward, details = diffs.score_details(diff_answer(text), {"f.py": "a\n"},
                                        {"f.py": "c\n"}, "unified_diff")
  assert (reward, details["error"]) == (-1.0, code)


# ---------------------------------------------------------------------------
# The line-edit answer format.

def lines_block(path, first, last, text):
  return f"### {path}\n<<<<<<< LINES {first}-{last}\n{text}>>>>>>> REPLACE"


FIVE = "l1\nl2\nl3\nl4\nl5\n"


def test_line_edits_replace_insert_delete_by_the_original_numbers():
  # Two blocks of one file, both numbered as the file was: line 2 becomes two
  # lines, then line 4 (still "l4", now the fifth line) is deleted, and an
  # insertion before line 1 (an empty range 1-0).
  completion = answer(lines_block("f.py", 1, 0, "top\n"),
                      lines_block("f.py", 2, 2, "two\nmore\n"),
                      lines_block("f.py", 4, 4, ""))
  assert edits.apply_completion(completion, {"f.py": FIVE}, "line_edit") == {
      "f.py": "top\nl1\ntwo\nmore\nl3\nl5\n"}
  # Prose and fences around the blocks are ignored.
  fenced = answer("Edit:\n```\n" + lines_block("f.py", 5, 5, "five\n") + "\n```")
  assert edits.apply_completion(fenced, {"f.py": FIVE}, "line_edit") == {
      "f.py": "l1\nl2\nl3\nl4\nfive\n"}


def test_line_edit_ranges_by_first_line_and_length():
  # A+N names the N lines from line A: the same edits as A-B, A+0 an insertion.
  def counted(path, first, n, text):
    return f"### {path}\n<<<<<<< LINES {first}+{n}\n{text}>>>>>>> REPLACE"
  assert edits.parse_line_edits(answer(counted("f.py", 1, 0, "top\n"),
                                       counted("f.py", 2, 2, "x\n"))) == {
      "f.py": [(1, 0, "top\n"), (2, 3, "x\n")]}
  completion = answer(counted("f.py", 1, 0, "top\n"), lines_block("f.py", 2, 2, "two\n"),
                      counted("f.py", 4, 1, ""))
  assert edits.apply_completion(completion, {"f.py": FIVE}, "line_edit") == {
      "f.py": "top\nl1\ntwo\nl3\nl5\n"}
  # A length past the file's end is a bad range like any other.
  assert diffs.score_details(answer(counted("f.py", 5, 2, "x\n")), {"f.py": FIVE},
                             {"f.py": FIVE}, "line_edit")[1]["error"] == "bad_range"
  files, oracle = {"f.py": FIVE}, {"f.py": "l1\nL2\nL3\nl4\nl5\nl6\n"}
  ref = edits.oracle_completion(files, oracle, "line_edit", context_lines=0, line_counts=True)
  assert "<<<<<<< LINES 2+2\nL2\nL3\n>>>>>>> REPLACE" in ref
  assert "<<<<<<< LINES 6+0\nl6\n>>>>>>> REPLACE" in ref
  assert diffs.score(ref, files, oracle, "line_edit") == 1.0


def test_line_edits_new_file_and_a_last_line_without_newline():
  assert edits.apply_completion(answer(lines_block("n.py", 1, 0, "x = 1\n")), {},
                                "line_edit") == {"n.py": "x = 1\n"}
  # The file's last line has no newline; the replacement of it keeps it so.
  assert edits.apply_completion(answer(lines_block("f.py", 2, 2, "B\n")), {"f.py": "a\nb"},
                                "line_edit") == {"f.py": "a\nB"}


def test_line_edit_reward_hand_computed():
  # The reward sees the effect only: replacing line 1 "a" by "b" where the
  # oracle has "c" is the SEARCH/REPLACE case above (16 / 17).
  files, oracle = {"f.py": "a\n"}, {"f.py": "c\n"}
  assert diffs.score(answer(lines_block("f.py", 1, 1, "c\n")), files, oracle,
                     "line_edit") == 1.0
  assert diffs.score(answer(lines_block("f.py", 1, 1, "b\n")), files, oracle,
                     "line_edit") == 16 / 17


@pytest.mark.parametrize("solution,code", [
    (lines_block("f.py", 6, 6, "x\n"), "bad_range"),       # past the 5 lines
    (lines_block("f.py", 0, 1, "x\n"), "bad_range"),       # numbers start at 1
    (lines_block("f.py", 3, 1, "x\n"), "bad_range"),       # reversed beyond empty
    (lines_block("f.py", 2, 3, "x\n") + "\n" + lines_block("f.py", 3, 3, "y\n"),
     "bad_range"),                                          # overlapping
    (lines_block("f.py", 4, 4, "x\n") + "\n" + lines_block("f.py", 2, 2, "y\n"),
     "bad_range"),                                          # out of order
    (lines_block("f.py", 2, 3, "l2\nl3\n"), "unchanged"),
    (lines_block("f.py", 3, 2, ""), "unchanged"),           # an empty insertion
    ("### f.py\n<<<<<<< LINES 2-2\nx\n", "no_edits"),      # never closed
    ("### f.py\n<<<<<<< LINES 2\nx\n>>>>>>> REPLACE", "no_edits"),
])
def test_line_edit_format_errors(solution, code):
  reward, details = diffs.score_details(answer(solution), {"f.py": FIVE},
                                        {"f.py": FIVE.replace("l2", "L2")}, "line_edit")
  assert (reward, details["error"]) == (-1.0, code)


def test_line_edits_of_the_open_file_may_leave_the_path_out():
  pathless = "<<<<<<< LINES 2-2\nL2\n>>>>>>> REPLACE"
  files, oracle = {"f.py": FIVE, "g.py": "g\n"}, {"f.py": FIVE.replace("l2", "L2")}
  # Without an open file a block must name its file: one clear error, not a silent skip.
  assert diffs.score_details(answer(pathless), files, oracle, "line_edit")[1]["error"] == (
      "no_path")
  assert diffs.score_details(answer(pathless), files, oracle, "line_edit",
                             open_file="f.py") == (1.0, {"similarities": {"f.py": 1.0},
                                                         "exact": True})
  # A named block still goes to its file, beside the open file's blocks.
  both = answer(pathless + "\n" + lines_block("g.py", 1, 1, "G\n"))
  assert edits.apply_completion(both, files, "line_edit", open_file="f.py") == {
      "f.py": oracle["f.py"], "g.py": "G\n"}
  # The reference of an open file leaves its path out and round-trips.
  ref = edits.oracle_completion(files, oracle, "line_edit", context_lines=0, open_file="f.py")
  assert "###" not in ref and pathless in ref
  with pytest.raises(ValueError, match="open_file"):
    edits.build_prompt("Fix it.", {"f.py": "1|a\n", "g.py": "1|b\n"}, "line_edit",
                       open_file=True)
  prompt = edits.build_prompt("Fix it.", {"f.py": "1|a\n"}, "line_edit", open_file=True)
  assert prompt.endswith('its edits may leave out the "### " line.')


def test_line_edit_prompt_numbers_every_shown_line():
  prompt = edits.build_prompt("Fix it.", {"f.py": edits.number_lines("a\nb\n")},
                              "line_edit", instructions=False)
  assert "### f.py\n1|a\n2|b\n--- END FILE ---" in prompt
  assert prompt.endswith("*LINES* edits inside <solution> </solution>.")
  # A shown file without numbers cannot be answered by number: refused.
  with pytest.raises(ValueError, match="not numbered: 'b'"):
    edits.build_prompt("Fix it.", {"f.py": "1|a\nb\n"}, "line_edit")
  # The full instructions' example is itself a valid answer.
  prompt = edits.build_prompt("Fix it.", {"shop/cart.py": edits.number_lines(
      "def total(prices):\n    return sum(prices)\n")}, "line_edit")
  example = prompt[prompt.index("### shop/cart.py\n<<<<<<<"):prompt.index("REPLACE\n\nNumbers")]
  assert edits.apply_completion(answer(example + "REPLACE"), {"shop/cart.py": (
      "def total(prices):\n    return sum(prices)\n")}, "line_edit") == {
          "shop/cart.py": "def total(prices):\n    return round(sum(prices), 2)\n"}


@pytest.mark.parametrize("edit_format", edits.EDIT_FORMATS)
def test_oracle_completion_round_trips(edit_format):
  files = {"a.py": FILE_A, "b.py": FILE_B, "c.py": ""}
  oracle = {**ORACLE, "c.py": "import a\n"}
  completion = edits.oracle_completion(files, oracle, edit_format)
  assert edits.apply_completion(completion, files, edit_format) == oracle
  assert diffs.score(completion, files, oracle, edit_format) == 1.0


def test_oracle_completion_refuses_an_ambiguous_block():
  # A SEARCH text with a "=======" line ends the block early.
  files = {"d.rst": "Title\n=======\n\nbody\n"}
  oracle = {"d.rst": "Title\n=======\n\nnew body\n"}
  with pytest.raises(ValueError, match="cannot be written as search_replace"):
    edits.oracle_completion(files, oracle, "search_replace")
  assert edits.oracle_completion(files, oracle, "unified_diff")


# ---------------------------------------------------------------------------
# The registered batch reward.

def _task(task_id, files, oracle, edit_format="search_replace", tests=""):
  return Task(id=task_id, prompt="p", kind="diff", tests=tests,
              extra={"files": files, "oracle": oracle, "edit_format": edit_format})


def test_registered_batch_reward():
  sr = _task("t1", FILES, ORACLE)
  ud = _task("t2", {"f.py": "a\n"}, {"f.py": "c\n"}, "unified_diff",
             tests="assert True")
  # A task with tests survives storage with its files and oracle.
  assert Task.from_example(ud.to_example()) == ud
  completions = [answer(ADD, SUB, SORT), answer(SORT), "no tags",
                 diff_answer("--- a/f.py\n+++ b/f.py\n@@ -1 +1 @@\n-a\n+b")]
  out = rewards.get("diff")([sr, sr, sr, ud], completions)
  np.testing.assert_array_equal(
      out.scores, np.array([1.0, 0.5, -1.0, 16 / 17], np.float32))
  assert out.details[1] == {"similarities": {"a.py": 0.0, "b.py": 1.0}, "exact": False}
  assert out.details[2]["error"] == "tag_count"
  assert out.metrics == {"format_valid": 0.75, "reward_mean": pytest.approx(
                             (1 + 0.5 - 1 + 16 / 17) / 4),
                         "exact": 0.25, "success_rate": 0.50,
                         "similarity": pytest.approx((1 + 0.5 + 16 / 17) / 3)}
  mixed = rewards.compute({"diff": 2.0}, [sr, sr], completions[:2])
  np.testing.assert_array_equal(mixed.scores, np.array([2.0, 1.0], np.float32))
  assert mixed.metrics["diff/mean"] == 0.75


def test_batch_reward_rejects_other_task_kinds():
  with pytest.raises(ValueError, match="kind 'code'"):
    rewards.get("diff")([Task(id="c", prompt="p")], ["x"])


def test_exact_is_the_same_change_after_normalisation():
  # Patches are compared line by line (str.splitlines), so a prediction that
  # drops the final newline or ends the line with CR/LF is the same change;
  # one that also edits another file, or writes another line, is not.
  files = {"f.py": "a\nb\n", "g.py": "x\n"}
  oracle = {"f.py": "a\nB\n"}
  same = answer(block("f.py", "a\nb", "a\nB"))
  no_final_newline = answer(block("f.py", "a\nb\n", "a\nB"))
  extra_file = answer(block("f.py", "b", "B"), block("g.py", "x", "y"))
  other_line = answer(block("f.py", "b", "C"))
  crlf = answer(block("f.py", "b", "B\r"))
  tasks = [_task("t", files, oracle)] * 6
  out = rewards.get("diff")(tasks, [same, no_final_newline, extra_file, other_line, crlf,
                                    "no tags"])
  assert [d.get("exact") for d in out.details] == [True, True, False, False, True, None]
  np.testing.assert_array_equal(out.scores[[0, 1, 4]], [1.0, 1.0, 1.0])
  assert out.scores[2] == 0.5 and out.scores[3] < 1.0
  assert out.metrics["exact"] == 3 / 6
  assert out.metrics["format_valid"] == 5 / 6
  assert out.metrics["reward_mean"] == pytest.approx(float(out.scores.mean()))


@pytest.mark.parametrize("offset", [0, 1, 7, 40])
@pytest.mark.parametrize("line_counts", [True, False])
def test_shifted_line_numbers_are_the_task_of_a_file_with_more_lines_on_top(offset, line_counts):
  """edits.shift_line_numbers(prompt, reference, k) is exactly the prompt and reference
  built, by the miner's own excerpting, for the same change in the file with k more lines
  on top (the change far enough down that its context does not reach them)."""
  from rlcode.data.git import excerpts
  old = "".join(f"v{i} = {i}\n" for i in range(1, 21))
  new = old.replace("v9 = 9\n", "v9 = 90\n").replace("v16 = 16\n", "v16 = 16\nw = 0\n")
  pad = "".join(f"top{i} = 0\n" for i in range(offset))

  def task(before, after, path="m.py"):
    shown = excerpts.excerpt(before, after, 3, numbered=True)
    prompt = edits.build_prompt("Change it.", {path: shown}, "line_edit", instructions=False,
                                open_file=False)
    reference = edits.oracle_completion({path: before}, {path: after}, "line_edit",
                                        context_lines=0, open_file=path,
                                        line_counts=line_counts)
    return prompt, reference

  prompt, reference = task(old, new)
  assert edits.shift_line_numbers(prompt, reference, offset) == task(pad + old, pad + new)
  # The shifted reference applies to the longer file as the reference does to the file.
  shifted = edits.shift_line_numbers(prompt, reference, offset)[1]
  assert edits.apply_completion(shifted, {"m.py": pad + old}, "line_edit", "m.py") == {
      "m.py": pad + new}
  # A file shown from its first line gains an omitted range on top.
  whole = edits.build_prompt("Change it.", {"m.py": edits.number_lines("a\nb\n")}, "line_edit",
                             instructions=False)
  expected = ("### m.py\n" + edits.omitted_lines(1, offset) + edits.number_lines("a\nb\n", 1 + offset)
              if offset else "### m.py\n1|a\n2|b\n")
  assert expected in edits.shift_line_numbers(whole, "", offset)[0]
  with pytest.raises(ValueError, match="offset"):
    edits.shift_line_numbers(prompt, reference, -1)


def test_locating_thought_quotes_each_blocks_first_line_then_its_number():
  """edits.locating_thought: per LINES block the first line it replaces (an insertion: the
  line it goes before, or the end), then "at line N." with the block's first number;
  another file's blocks name it; shift_line_numbers moves those numbers with the ranges."""
  files = {"a.py": "x = 1\ndef f(a):\n  return a\n\nY = 2\n", "b.py": "k = 0\n"}
  solution = ("<<<<<<< LINES 2+2\ndef f(a, b=0):\n  return a + b\n>>>>>>> REPLACE\n\n"
              "<<<<<<< LINES 5+0\nW = 1\n>>>>>>> REPLACE\n\n"
              "<<<<<<< LINES 6-5\nZ = 4\n>>>>>>> REPLACE\n\n"
              "### b.py\n<<<<<<< LINES 1-1\nk = 1\n>>>>>>> REPLACE")
  thought = edits.locating_thought(files, solution, open_file="a.py")
  assert thought == ("Replace\ndef f(a):\nat line 2.\n"
                     "Insert before\nY = 2\nat line 5.\n"
                     "Insert after the last line\nat line 6.\n"
                     "In b.py: Replace\nk = 0\nat line 1.")
  # The miner's references carry it (MiningConfig.reference_thought="locate") and still
  # apply; renumbering moves the thought's numbers with the block's.
  old, new = files["a.py"], "x = 1\ndef f(a, b=0):\n  return a + b\n\nY = 2\n"
  reference = edits.oracle_completion({"a.py": old}, {"a.py": new}, "line_edit",
                                      context_lines=0, open_file="a.py", line_counts=True,
                                      thought=edits.locating_thought(
                                          {"a.py": old}, solution.split("\n\n")[0], "a.py"))
  assert "<think>\nReplace\ndef f(a):\nat line 2.\n</think>" in reference
  assert edits.apply_completion(reference, {"a.py": old}, "line_edit", "a.py") == {"a.py": new}
  shifted = edits.shift_line_numbers("", reference, 10)[1]
  assert "at line 12.\n" in shifted and "<<<<<<< LINES 12+2\n" in shifted
  # Only the thought's: new text reading "at line 2." is left as it is.
  text_line = reference.replace("  return a + b\n", "at line 2.\n")
  assert edits.shift_line_numbers("", text_line, 10)[1] == shifted.replace(
      "  return a + b\n", "at line 2.\n")


def test_shifted_line_numbers_move_an_applied_diffs_hunk_headers():
  """The hunk headers of a prompt's applied changes move with the numbered lines, counts
  kept where the header has them and left out where it has none."""
  prompt = ("--- BEGIN APPLIED CHANGES ---\n--- a/m.py\n+++ b/m.py\n@@ -3,2 +3,1 @@ def f\n"
            "-a\n-b\n+c\n@@ -9 +8 @@\n-d\n+e\n--- END APPLIED CHANGES ---")
  assert edits.shift_line_numbers(prompt, "", 4)[0] == prompt.replace(
      "@@ -3,2 +3,1 @@ def f", "@@ -7,2 +7,1 @@ def f").replace("@@ -9 +8 @@", "@@ -13 +12 @@")


def test_ranges_that_count_the_shown_lines_map_back_to_the_files_lines():
  """line_numbers='shown': count_shown_lines renumbers an excerpt 1..K, file_ranges maps
  an answer's ranges back through the shown lines' file numbers (worked out by hand),
  and shown_ranges is its inverse on the references."""
  from rlcode.data.git import excerpts
  old = "".join(f"v{i} = {i}\n" for i in range(1, 41))
  new = old.replace("v9 = 9\n", "v9 = 90\n").replace("v30 = 30\n", "v30 = 30\nw = 0\n")
  shown, numbers = edits.count_shown_lines(excerpts.excerpt(old, new, 3, numbered=True))
  # Within 3 lines of a change: 6-12 (line 9) and 28-33 (the insertion before line 31).
  assert numbers == [*range(6, 13), *range(28, 34)]
  assert shown == ("[... 5 lines not shown ...]\n"
                   + "".join(f"{k}|v{n} = {n}\n" for k, n in enumerate(range(6, 13), 1))
                   + "[... 15 lines not shown ...]\n"
                   + "".join(f"{k}|v{n} = {n}\n" for k, n in enumerate(range(28, 34), 8))
                   + "[... 7 lines not shown ...]\n")
  shown_lines = {"m.py": numbers}
  # Shown line 4 is v9; shown 11 is v31, so an insertion before it goes after v30.
  answer_text = answer("<<<<<<< LINES 4+1\nv9 = 90\n>>>>>>> REPLACE\n\n"
                       "<<<<<<< LINES 11-10\nw = 0\n>>>>>>> REPLACE")
  assert edits.apply_completion(answer_text, {"m.py": old}, "line_edit", "m.py",
                                shown_lines) == {"m.py": new}
  assert diffs.score_details(answer_text, {"m.py": old}, {"m.py": new}, "line_edit", "m.py",
                             shown_lines)[0] == 1.0
  # The same ranges read as the file's own numbers are another edit (line 4, line 11).
  assert edits.apply_completion(answer_text, {"m.py": old}, "line_edit", "m.py") != {
      "m.py": new}
  # An insertion after the last shown line goes right after it (file line 34).
  tail = answer("<<<<<<< LINES 14+0\nz = 1\n>>>>>>> REPLACE")
  assert edits.apply_completion(tail, {"m.py": old}, "line_edit", "m.py", shown_lines) == {
      "m.py": old.replace("v33 = 33\n", "v33 = 33\nz = 1\n")}
  # Errors name what is wrong: past the shown lines, across a gap, a file not shown.
  for solution, message in [
      ("<<<<<<< LINES 14+1\nx\n>>>>>>> REPLACE", "not a range of the 13 lines shown"),
      ("<<<<<<< LINES 7+2\nx\ny\n>>>>>>> REPLACE", "runs across lines that are not shown"),
      ("### n.py\n<<<<<<< LINES 1+1\nx\n>>>>>>> REPLACE", "not a file the prompt shows")]:
    reward, details = diffs.score_details(answer(solution), {"m.py": old, "n.py": "n\n"},
                                          {"m.py": new}, "line_edit", "m.py", shown_lines)
    assert (reward, details["error"]) == (-1.0, "bad_range") and message in details["message"]
  # Blocks out of order stay an error after the mapping.
  backwards = answer("<<<<<<< LINES 11-10\nw = 0\n>>>>>>> REPLACE\n\n"
                     "<<<<<<< LINES 4+1\nv9 = 90\n>>>>>>> REPLACE")
  assert "precedes" in diffs.score_details(backwards, {"m.py": old}, {"m.py": new},
                                           "line_edit", "m.py", shown_lines)[1]["message"]
  # shown_ranges writes the references' ranges in shown numbers; both forms round-trip.
  for counted in (True, False):
    reference = edits.oracle_completion({"m.py": old}, {"m.py": new}, "line_edit",
                                        context_lines=0, open_file="m.py", line_counts=counted)
    local = edits.shown_ranges(reference, shown_lines, "m.py")
    assert ("LINES 4+1" if counted else "LINES 4-4") in local
    assert ("LINES 11+0" if counted else "LINES 11-10") in local
    assert edits.apply_completion(local, {"m.py": old}, "line_edit", "m.py", shown_lines) == {
        "m.py": new}
  with pytest.raises(ValueError, match="not within the shown lines"):
    edits.shown_ranges("<<<<<<< LINES 20+1\nx\n>>>>>>> REPLACE", shown_lines, "m.py")
  # The prompt accepts the counted omitted runs as it does the numbered ones.
  prompt = edits.build_prompt("Change it.", {"m.py": shown}, "line_edit", instructions=False,
                              open_file=True)
  assert "### m.py\n[... 5 lines not shown ...]\n1|v6 = 6\n" in prompt
  with pytest.raises(ValueError, match="not a numbered excerpt's line"):
    edits.count_shown_lines("1|a\nb\n")
