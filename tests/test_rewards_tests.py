"""The "tests" and "format" rewards: program assembly, modes, metrics, options."""

from __future__ import annotations

import numpy as np
import pytest

from rlcode import rewards
from rlcode.data.tasks import Task
from rlcode.rewards import tests as rt

ADD = Task(id="add", prompt='def add(a, b):\n    """Sum."""\n', kind="code",
           tests=("def check(candidate):\n    assert candidate(1, 2) == 3\n"
                  "    assert candidate(-1, 1) == 0\n    assert candidate(5, 5) == 10\n"),
           entry_point="add")
WHOLE = Task(id="whole", prompt="Write add(a, b).", kind="code",
             tests="assert add(1, 2) == 3\nassert add(2, 2) == 4\n", entry_point="add",
             extra={"assemble": "completion"})


def test_truncate_at_earliest_stop():
  text = "    return a + b\n\nprint(add(1, 2))\ndef other():\n    pass\n"
  kept, cut = rt.truncate_at_stops(text, rt.HUMANEVAL_STOP)
  assert kept == "    return a + b\n"
  assert cut == "\nprint(add(1, 2))\ndef other():\n    pass\n"
  assert rt.truncate_at_stops("    return 1\n    # fine\n", rt.HUMANEVAL_STOP) == (
      "    return 1\n    # fine\n", "")
  assert rt.truncate_at_stops("x\n#c", ("\n#",)) == ("x", "\n#c")


@pytest.mark.parametrize("text,code,stray", [
    ("no fence here", "no fence here", ""),
    ("Sure:\n```python\nx = 1\n```\nDone.", "x = 1\n", "Sure:\n\nDone."),
    ("```bash\nls\n```\n```py\ny = 2\n```\n", "y = 2\n", "```bash\nls\n```\n\n"),
    ("```\nz = 3\n```", "z = 3\n", ""),
    ("```python\nunclosed = 1\n", "unclosed = 1\n", ""),
])
def test_extract_code(text, code, stray):
  assert rt.extract_code(text) == (code, stray)


def test_assemble_both_styles():
  assert rt.assemble_program(ADD, "    return a + b\n\n\nif __name__ == '__main__':\n    x()") == (
      ADD.prompt + "    return a + b\n\n")
  assert rt.assemble_program(ADD, "    return a+b\n", stop_sequences=()) == (
      ADD.prompt + "    return a+b\n")
  assert rt.assemble_program(WHOLE, "Here:\n```python\ndef add(a, b):\n    return a + b\n```") == (
      "def add(a, b):\n    return a + b\n")
  with pytest.raises(ValueError, match="assemble"):
    rt.assemble_program(Task(id="x", prompt="", extra={"assemble": "diff"}), "")


def test_given_code_is_what_the_tests_use_from_the_prompt():
  helper = Task(id="h", prompt=("import math\nimport os\n\ndef area(r):\n"
                                "    return math.pi * r * r\n\n\ndef unused():\n"
                                '    return os.sep\n\n\ndef disc(r):\n    """Area of a disc."""\n'),
                tests="def check(candidate):\n    assert candidate(2) == area(2)\n",
                entry_point="disc")
  assert rt.given_code(helper) == "import math\n\ndef area(r):\n    return math.pi * r * r"
  assert rt.job_for(helper, "    return 0\n").context == rt.given_code(helper)
  assert rt.given_code(ADD) == "" and rt.given_code(WHOLE) == ""


def test_tests_reward_modes_metrics_and_details():
  completions = ["    return a + b\n", "    return a + b if a > 0 else 7\n",
                 "    return (\n", "    import os\n    os._exit(0)\n"]
  tasks = [ADD] * 4
  out_all = rewards.get("tests")(tasks, completions, wall_seconds=5.0)
  np.testing.assert_array_equal(out_all.scores, np.array([1, 0, 0, 0], np.float32))
  out_frac = rewards.get("tests")(tasks, completions, mode="fraction", workers=1)
  np.testing.assert_allclose(out_frac.scores, np.array([1, 2 / 3, 0, 0], np.float32))
  assert [d["status"] for d in out_frac.details] == ["passed", "failed", "syntax_error", "crash"]
  assert out_frac.details[1]["tests_passed"] == 2 and out_frac.details[1]["tests_total"] == 3
  assert out_all.metrics["pass_rate"] == 0.25
  assert out_frac.metrics["fraction"] == pytest.approx((1 + 2 / 3) / 4)
  assert {k for k in out_all.metrics if k.startswith("status/")} == {
      f"status/{s}" for s in rt.sandbox.STATUSES}
  assert out_all.metrics["status/syntax_error"] == 0.25


def test_tests_reward_whole_program_style_and_limits():
  completions = ["```python\ndef add(a, b):\n    return a + b\n```",
                 "def add(a, b):\n    while True:\n        pass\n"]
  out = rewards.get("tests")([WHOLE, WHOLE], completions, cpu_seconds=1, wall_seconds=3.0)
  assert list(out.scores) == [1.0, 0.0]
  assert out.details[1]["status"] == "timeout"


def test_mix_through_the_registry():
  out = rewards.compute({"tests": 1.0, "format": 0.5}, [ADD, ADD],
                        ["    return a + b\n",
                         "    return a + b if a != 5 else 0\n\nprint('hi')\n"],
                        options={"tests": {"mode": "fraction"}})
  np.testing.assert_allclose(out.scores, [1.5, 2 / 3], rtol=1e-6)
  assert out.details[1]["format"]["no_stray_text"] is False
  assert "tests/pass_rate" in out.metrics and "format/fail/no_stray_text" in out.metrics


def test_tests_reward_rejects_bad_options_and_tasks():
  with pytest.raises(ValueError, match="mode"):
    rewards.get("tests")([ADD], ["x"], mode="some")
  with pytest.raises(TypeError, match="wall_secs"):
    rewards.get("tests")([ADD], ["x"], wall_secs=1)
  with pytest.raises(ValueError, match="kind"):
    rewards.get("tests")([Task(id="d", prompt="", kind="diff")], ["x"])
  with pytest.raises(ValueError, match="no tests"):
    rewards.get("tests")([Task(id="e", prompt="")], ["x"])


@pytest.mark.parametrize("task,completion,expected", [
    (ADD, "    return a + b\n", dict(parses=True, non_empty=True, entry_point=True,
                                      no_stray_text=True)),
    (ADD, "", dict(parses=True, non_empty=False, entry_point=True, no_stray_text=True)),
    (ADD, "    return (a +\n", dict(parses=False, non_empty=True, entry_point=False,
                                       no_stray_text=True)),
    (ADD, "    return a\n\n# test\nassert add(1, 1)", dict(parses=True, non_empty=True,
                                                         entry_point=True,
                                                         no_stray_text=False)),
    (WHOLE, "```python\ndef add(a, b):\n    return a + b\n```",
     dict(parses=True, non_empty=True, entry_point=True, no_stray_text=True)),
    (WHOLE, "Sure!\n```python\nadd = lambda a, b: a + b\n```",
     dict(parses=True, non_empty=True, entry_point=True, no_stray_text=False)),
    (WHOLE, "```python\ndef plus(a, b):\n    return a + b\n```",
     dict(parses=True, non_empty=True, entry_point=False, no_stray_text=True)),
    (WHOLE, "I would write add(a, b) like so.", dict(parses=False, non_empty=True,
                                                     entry_point=False, no_stray_text=True)),
])
def test_format_checks(task, completion, expected):
  assert rt.format_checks(task, completion) == expected


def test_format_reward_scores_and_check_subsets():
  completions = ["    return a + b\n", "", "    return a\n\nprint(1)\n"]
  out = rewards.get("format")([ADD] * 3, completions)
  np.testing.assert_array_equal(out.scores, [1, 0, 0])
  assert out.metrics["fail/non_empty"] == pytest.approx(1 / 3)
  out = rewards.get("format")([ADD] * 3, completions, checks=["parses"])
  np.testing.assert_array_equal(out.scores, [1, 1, 1])
  with pytest.raises(ValueError, match="checks"):
    rewards.get("format")([ADD], ["x"], checks=["pep8"])
