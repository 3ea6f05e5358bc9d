"""Scripted expert episodes for the warm start: the calls a competent agent makes.

For a task of data/agent_tasks.jsonl (its `extra.hint`), `expert_calls` gives
the calls that solve it with a tool set ("rich": editor, search, run_tests;
"terminal": bash only) and a think habit ("none", "start": one plan first, "each":
a note after every tool call). `expert_trajectory` plays them through a real
environment, so the observations are what the tools return, and records the
tokens exactly as a sampled episode would hold them (calls mask 1, observations 0).
"""

from __future__ import annotations

import hashlib
import json
import random
import re

import numpy as np

from rlcode.agent import sampler
from rlcode.agent.chat import CALL_CLOSE, CALL_OPEN, ChatFormat
from rlcode.agent.env import ToolEnv
from rlcode.data.tasks import Task

TOOLSETS = ("rich", "terminal")
VARIANTS = ("file", "search", "tests")  # the task families (a task's hint["variant"])
THINK = ("none", "start", "each")


def call_text(name: str, arguments: dict) -> str:
  """A call as the expert writes it (compact JSON between the tags)."""
  body = json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"))
  return f"{CALL_OPEN}{body}{CALL_CLOSE}"


def expert_calls(task: Task, toolset: str = "rich", think: str = "none",
                 copy_decoy: bool = False) -> list[tuple]:
  """[(name, arguments), ...] ending with finish. copy_decoy: the same looks, then the
  value of the task's decoy line (its symbol's old value, commented out: hint["decoy"],
  data/make_agent_tasks.py --decoys) written instead of the live one, as a demonstrator
  that does not tell the two lines apart does on some of its tasks (`copies_decoy`)."""
  if toolset not in TOOLSETS or think not in THINK:
    raise ValueError(f"toolset={toolset!r} (one of {TOOLSETS}), think={think!r} "
                     f"(one of {THINK})")
  hint = task.extra.hint
  variant, solution = hint["variant"], task.reference
  if copy_decoy:
    if "decoy" not in hint:
      raise ValueError(f"task {task.id!r} has no decoy line to copy")
    solution = with_constant(solution, hint["decoy"])
  write = write_call(solution, toolset)
  if variant == "tests":
    if toolset == "terminal":
      raise ValueError(f"task {task.id!r}: its function name is only in the test output, "
                       "and the terminal tool set has no run_tests")
    look, fact, plan = (("run_tests", {}), f"the function is {hint['name']}",
                        "run the tests, read the name, write solution.py")
  elif variant == "file":
    look = (("editor", {"command": "view", "path": hint["path"]}) if toolset == "rich"
            else ("bash", {"command": f"cat {hint['path']}"}))
    fact = f"{hint['symbol']} is {solution.split()[-1]}"
    plan = f"read {hint['path']}, write solution.py"
  elif variant == "search":
    look = (("search", {"query": hint["symbol"]}) if toolset == "rich"
            else ("bash", {"command": f"grep -rn {hint['symbol']} ."}))
    fact = f"{hint['symbol']} is {solution.split()[-1]}"
    plan = f"find {hint['symbol']}, write solution.py"
  else:
    raise ValueError(f"task {task.id!r}: unknown variant {variant!r}")
  calls = [look, write]
  if think == "each":
    calls = [look, ("think", {"thought": fact}), write, ("think", {"thought": "written"})]
  elif think == "start":
    calls = [("think", {"thought": plan})] + calls
  return calls + [("finish", {})]


def write_call(solution: str, toolset: str) -> tuple:
  """The call that writes `solution` to solution.py: the editor's create, or a heredoc
  through bash in the terminal tool set."""
  if toolset == "rich":
    return ("editor", {"command": "create", "path": "solution.py", "file_text": solution})
  return ("bash", {"command": f"cat > solution.py <<'EOF'\n{solution}EOF"})


def with_constant(solution: str, k: int) -> str:
  """A task's solution ("def f(x):\\n    return x + 7\\n") with another constant."""
  return solution.rsplit(" ", 1)[0] + f" {k}\n"


def copies_decoy(task: Task, fraction: float, seed: int) -> bool:
  """Whether the demonstrator that does not tell a commented-out value from the live one
  copies the commented-out one on `task`: for about `fraction` of the tasks that have a
  decoy line (hint["decoy"]), chosen by a hash of the task id and `seed`; never on the
  others. With 0.5 it copies either line with equal chance, whatever the lines say:
  its episodes look and copy exactly as the expert's do, and half of those on tasks with
  a decoy fail."""
  if "decoy" not in task.extra.hint:
    return False
  return _hashed_fraction(f"decoy/{seed}/{task.id}") < fraction


def _hashed_fraction(key: str) -> float:
  """A number in [0, 1) from a hash of `key`: the same on every run and machine."""
  return int(hashlib.sha256(key.encode()).hexdigest()[:15], 16) / 16**15


# What a demonstrator that does not look writes for a function whose name it cannot know.
GUESSED_NAMES = ("solve", "f", "func", "answer", "compute", "solution")


def is_guess(task: Task, fraction: float, seed: int,
             families: tuple[str, ...] | None = None) -> bool:
  """Whether the imperfect demonstrator (`guess_calls`) answers `task` without looking:
  true for about `fraction` of the tasks, chosen by a hash of the task id and `seed`;
  with `families`, only for tasks of those families (the hint's variant)."""
  if families is not None and task.extra.hint["variant"] not in families:
    return False
  return _hashed_fraction(f"guess/{seed}/{task.id}") < fraction


def guess_calls(task: Task, toolset: str = "rich", seed: int = 0) -> list[tuple]:
  """[(name, arguments), ...]: the calls of a demonstrator that skips the tools and writes
  solution.py at once, with the operation the prompt states and a guess for what only
  the workspace tells (a constant 2-9, as the task constants are, so right about one time
  in eight on file and search tasks; a made-up generic name on tests tasks, never right).

  Such episodes in a warm start give a policy that uses its tools on only part of the
  tasks, as a policy distilled from a weaker agent does; the reward is what can tell it
  that looking pays (configs/agent_tiny.py, docs/journal.md, agent_tiny)."""
  rng = random.Random(f"guess/{seed}/{task.id}")
  guess = (rng.choice(GUESSED_NAMES) if task.extra.hint["variant"] == "tests"
           else rng.randint(2, 9))
  return _written_at_once(task, toolset, guess)


def trusts_note(task: Task, fraction: float, seed: int) -> bool:
  """Whether the demonstrator that trusts a task's stale note (hint["note"],
  data/make_agent_tasks.py --notes) answers from it without looking: for about
  `fraction` of the tasks with a note, chosen by a hash of the task id and `seed`;
  never on the others. What it picks does not depend on anything the policy sees."""
  if "note" not in task.extra.hint:
    return False
  return _hashed_fraction(f"note/{seed}/{task.id}") < fraction


def note_calls(task: Task, toolset: str = "rich") -> list[tuple]:
  """[(name, arguments), ...]: the calls of a demonstrator that believes the task's stale
  note and writes solution.py at once, the note's constant (file and search tasks) or
  name (tests tasks) copied from the prompt, then finishes. The note is never right, so
  these episodes fail; they copy exactly, so a warm start on them still learns to copy
  (unlike guess_calls' random constants, which kept copying from forming)."""
  if "note" not in task.extra.hint:
    raise ValueError(f"task {task.id!r} has no note to trust")
  return _written_at_once(task, toolset, task.extra.hint["note"])


def _written_at_once(task: Task, toolset: str, value) -> list[tuple]:
  """[write, finish]: solution.py written without a look, the task's reference with
  `value` in place of what only the workspace tells: the function's name (tests tasks)
  or the constant (file and search tasks)."""
  if toolset not in TOOLSETS:
    raise ValueError(f"toolset={toolset!r} (one of {TOOLSETS})")
  variant = task.extra.hint["variant"]
  head, body = task.reference.split("\n", 1)
  if variant == "tests":
    head = f"def {value}(x):"
  elif variant in ("file", "search"):
    body = with_constant(body, value)
  else:
    raise ValueError(f"task {task.id!r}: unknown variant {variant!r}")
  return [write_call(f"{head}\n{body}", toolset), ("finish", {})]


def expert_trajectory(env: ToolEnv, chat: ChatFormat, task: Task, calls: list[tuple],
                      budgets: sampler.Budgets) -> sampler.Trajectory:
  """Plays `calls` in `env` and returns the episode as tokens (log-probs 0)."""
  first = env.reset(task)
  traj = sampler.Trajectory(task, chat.prompt_tokens(list(env.tools.values()), first))
  bos = len(chat.tokenizer.encode(""))
  for name, arguments in calls:
    ids = chat.tokenizer.encode(call_text(name, arguments))[bos:]
    traj.tokens += ids
    traj.mask += [1] * len(ids)
    traj.logprobs += [0.0] * len(ids)
    step = env.step(chat.decode(ids), "call")
    traj.turns.append(dict(step.info, turn_tokens=len(ids)))
    if step.done:
      break
    obs, cut = chat.observation_tokens(step.observation, budgets.max_observation_tokens,
                                       budgets.max_observation_bytes)
    traj.turns[-1].update(observation_tokens=len(obs), observation_cut=cut)
    traj.tokens += obs
    traj.mask += chat.observation_mask(len(obs))
    traj.logprobs += [0.0] * len(obs)
  sampler.record_end(traj, env)
  return traj


def hint_metrics(trajs) -> dict:
  """The tool tasks' own means: over the episodes of tasks with a decoy line
  (data/agent_tasks_decoy.jsonl), the share whose scored solution ends in the live
  constant ("decoy/live") and in the decoy's ("decoy/decoy"; `written_constant`); over
  the episodes of tasks with a stale note (data/agent_tasks_notes.jsonl), the share whose
  scored solution uses the note's constant or name ("note/believed"; `uses_note`).
  Episodes of tasks of other kinds (no hint) are left out."""
  out = {}
  trajs = [t for t in trajs if t.task.kind == "code"]
  decoys = [t for t in trajs if "decoy" in t.task.extra.hint]
  if decoys:
    written = [written_constant(t.program) for t in decoys]
    out["decoy/live"] = float(np.mean([w == t.task.reference.split()[-1]
                                       for w, t in zip(written, decoys)]))
    out["decoy/decoy"] = float(np.mean([w == str(t.task.extra.hint["decoy"])
                                        for w, t in zip(written, decoys)]))
  noted = [t for t in trajs if "note" in t.task.extra.hint]
  if noted:
    out["note/believed"] = float(np.mean([uses_note(t.program, t.task.extra.hint)
                                          for t in noted]))
  return out


def uses_note(program: str, hint: dict) -> bool:
  """Whether a solution's text uses a task's stale note: defines the note's name (tests
  tasks) or ends in the note's constant (file and search tasks)."""
  if hint["variant"] == "tests":
    return re.search(rf"\bdef\s+{re.escape(str(hint['note']))}\s*\(", program) is not None
  return written_constant(program) == str(hint["note"])


def written_constant(program: str) -> str | None:
  """The last integer literal of a solution's text ("7" of "return x + 7"), None if it
  has none."""
  found = re.findall(r"\b\d+\b", program)
  return found[-1] if found else None
