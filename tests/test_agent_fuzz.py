"""Fuzzing the tool environment with what a policy may write: no exception escapes.

Every byte a policy produces is untrusted. A seeded generator drives `ToolEnv.step` with
random text, broken JSON, calls with adversarial arguments (huge integers, lone
surrogates, NUL bytes, paths out of the workspace, megabytes of output, wrong types,
unknown tools) and turns that end in every way; each step must return an observation,
bounded by the tools before any budget, that the chat layer can tokenise, and the episode must go on (or end) normally.
"""

from __future__ import annotations

import json
import os
import random
import time

import pytest

from rlcode.agent import calls, chat as chat_lib, env as env_lib, tools
from rlcode.agent.memory import Memory
from rlcode.data.tasks import Task
from rlcode.models.tokenizer import load_tokenizer
from rlcode.sandbox.session import SessionLimits

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = ("bash", "editor", "search", "run_tests", "think", "memory", "finish")
CASES = 2500

TASK = Task(id="agent/file/fuzz", prompt="Write solution.py defining f(x) = x + 1.",
            tests="assert f(1) == 2\n",
            extra={"files": {"a.txt": "LIMIT = 3\n", "dir/b.py": "x = 1\n"},
                   "assemble": "completion", "tests_format": "script",
                   "tests_visible": "assert f(1) == 2\n"})

WEIRD_STRINGS = ["", " ", "\x00", "a\x00b", "\ud800", "\udcff", "é" * 3, "../../etc/passwd",
                 "/etc/passwd", "a/../../b", "dir/../../../x", ".", "..", "dir/", "~",
                 "$(reboot)", "`id`", "x" * 100_000, "\n" * 1000, "\u202e", "🦀" * 50,
                 "solution.py", "a.txt", "dir/b.py", "\x80", "\\", "'\"", "{}", "null"]
BASH = ["ls -la", "cat a.txt", "yes | head -c 3000000", "head -c 200000 /dev/urandom",
        "printf '\\xff\\xfe\\x80'", "touch $'\\x80'; ls", "sleep 30", "echo $((2**62))",
        "python3 -c 'print(\"x\" * 2000000)'", "cat /proc/self/status | head -3",
        "exit 3", "kill -9 $$", "ulimit -a", "mkdir -p d/e/f && ls -R", ":(){ :|:& };:"]


def _value(rng: random.Random, depth: int = 0):
  kind = rng.randrange(9 if depth < 3 else 6)
  if kind == 0:
    return rng.choice(WEIRD_STRINGS)
  if kind == 1:
    return rng.choice([0, -1, 1, 2 ** 63, -(2 ** 70), 10 ** 30, 7])
  if kind == 2:
    return rng.choice([0.5, -1e308, 1e308, float("nan"), float("inf")])
  if kind == 3:
    return rng.choice([True, False, None])
  if kind == 4:
    return "".join(chr(rng.randrange(1, 0x2FFF)) for _ in range(rng.randrange(40)))
  if kind == 5:
    return rng.choice(BASH)
  if kind == 6:
    return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
  return {rng.choice(["path", "command", "x", "file_text", "view_range", "query", "mode",
                      "action", "text", "old_str", "new_str"]): _value(rng, depth + 1)
          for _ in range(rng.randrange(4))}


def _arguments(rng: random.Random, tool) -> dict:
  """Arguments for `tool`: mostly of the schema's keys, with adversarial values."""
  props = tool.parameters.get("properties", {})
  args = {}
  for key, schema in props.items():
    if rng.random() < 0.8:
      if "enum" in schema and rng.random() < 0.8:
        args[key] = rng.choice(schema["enum"])
      elif key == "command" and tool.name == "bash":
        args[key] = rng.choice(BASH)
      elif key == "path" and rng.random() < 0.5:
        args[key] = rng.choice(["a.txt", "dir/b.py", "solution.py", "new.py", "."])
      else:
        args[key] = _value(rng)
  if rng.random() < 0.1:
    args[rng.choice(["extra", "x"])] = _value(rng)
  return args


def _turn(rng: random.Random, env) -> tuple[str, str]:
  ended = rng.choices(calls.ENDINGS, weights=(8, 1, 1))[0]
  kind = rng.randrange(10)
  if kind == 0:  # text without a call, or random characters around the tags
    body = "".join(chr(rng.randrange(0, 0x10FFFF) if rng.random() < 0.1 else
                       rng.randrange(32, 127)) for _ in range(rng.randrange(200)))
    body = body.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return rng.choice(["", calls.CALL_OPEN, calls.CALL_CLOSE]) + body, ended
  if kind == 1:  # broken JSON between the tags
    text = rng.choice(['{"name": "editor", "arguments": {', "[" * 5000 + "]" * 5000,
                       '{"name": 1}', '{"name": "bash", "arguments": []}', "nul\x00l",
                       '{"name": "x", "arguments": {}, "extra": 1}', "{" * 100000,
                       '{"name": "editor", "arguments": {"command": "view", "path": '
                       '"a.txt", "view_range": [' + "9" * 5000 + ", 2]}}",
                       '{"name": "editor", "arguments": {"command": "create", "path": '
                       '"s.py", "file_text": "\\ud800"}}', '"\\udcff"', "1e99999", "NaN"])
    return f"{calls.CALL_OPEN}{text}{calls.CALL_CLOSE}", ended
  names = list(env.tools)
  name = rng.choice(names + ["nope", ""]) if rng.random() < 0.05 else rng.choice(names)
  if name == "run_tests" and rng.random() < 0.7:  # each run is a sandbox job: rarer
    name = "think"
  tool = env.tools.get(name)
  args = _arguments(rng, tool) if tool is not None else {"x": _value(rng)}
  body = json.dumps({"name": name, "arguments": args}, ensure_ascii=rng.random() < 0.5)
  return f"{calls.CALL_OPEN}{body}{calls.CALL_CLOSE}", ended


@pytest.mark.slow
def test_no_policy_output_escapes_the_environment():
  rng = random.Random(0)
  tokenizer = load_tokenizer(os.path.join(ROOT, "data", "code_bpe.json+tools"))
  chat = chat_lib.ChatFormat("compact", tokenizer)
  env = env_lib.ToolEnv(tools.make_tools(TOOLS), env_lib.Scorer({"tests": 1.0}),
                        max_turns=12, memory=Memory("all"), bash_seconds=0.5,
                        episode_seconds=20.0,
                        session_limits=SessionLimits(command_seconds=0.5))
  start, episodes, failures = time.monotonic(), 0, 0
  try:
    env.reset(TASK)
    for _ in range(CASES):
      if env.done:
        env.reset(TASK)
        episodes += 1
      text, ended = _turn(rng, env)
      step = env.step(text, ended)
      assert isinstance(step, env_lib.Step) and isinstance(step.observation, str)
      # Bounded at the source, before the byte and token budgets below: a view's
      # MAX_LINES lines of MAX_LINE_CHARS characters is the largest a tool returns.
      assert len(step.observation) < tools.MAX_LINES * (tools.MAX_LINE_CHARS + 60)
      ids, _ = chat.observation_tokens(step.observation, 96, 16384)
      assert all(isinstance(i, int) for i in ids)
      failures += "tool_failure" in step.info
  finally:
    env.close()
  # Tools that fail on hostile arguments are observations; none is expected here.
  assert failures == 0, failures
  assert episodes > 50  # the cases spread over many episodes (eos turns, finishes, budgets)
  assert time.monotonic() - start < 600


def test_a_call_that_is_not_text_is_a_call_error():
  editor = {"editor": tools.Editor()}
  for body in ('{"name": "editor", "arguments": {"command": "create", "path": "s.py", '
               '"file_text": "\\ud800"}}',
               '{"name": "editor", "arguments": {"command": "view", "path": "a", '
               '"view_range": [' + "9" * 5000 + ", 1]}}"):
    with pytest.raises(calls.CallError, match="not valid"):
      calls.parse_turn(f"{calls.CALL_OPEN}{body}{calls.CALL_CLOSE}", "call", editor)


def test_observations_are_cut_to_bytes_before_tokenising_and_made_text():
  tokenizer = load_tokenizer(os.path.join(ROOT, "data", "code_bpe.json+tools"))
  chat = chat_lib.ChatFormat("compact", tokenizer)
  text, cut = chat_lib.untrusted_text("ab\udc80" + "x" * 5_000_000 + "end", 1000)
  assert cut and len(text.encode("utf-8")) <= 1000 and text.startswith("ab\ufffd")
  assert text.endswith("end") and "cut ..." in text
  assert chat_lib.untrusted_text("plain", 1000) == ("plain", False)
  start = time.monotonic()
  ids, cut = chat.observation_tokens("y" * 8_000_000, 96, 16384)
  assert cut and len(ids) < 200 and time.monotonic() - start < 2.0
