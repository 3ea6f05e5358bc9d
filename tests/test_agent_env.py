"""The environment over real sandbox sessions, scripted experts, and the memory rules."""

import re

import pytest

from rlcode.agent import env as env_lib, expert, memory, sampler, tools
from rlcode.agent.chat import ChatFormat
from rlcode.data import jsonl, sources
from rlcode.models.tokenizer import load_tokenizer

CHAT = ChatFormat("compact", load_tokenizer("bytes+tools"))
SPLITS = jsonl.read_jsonl_tasks(sources.resolve("data/agent_tasks.jsonl"), 0.2)
TASKS = SPLITS["train"]


def by_variant(variant):
  return next(t for t in TASKS if t.extra.hint["variant"] == variant)


@pytest.fixture(scope="module")
def scorer():
  return env_lib.Scorer({"tests": 1.0})


def make_env(scorer, names=("bash", "editor", "search", "run_tests", "think", "finish"),
             **kw):
  return env_lib.ToolEnv(tools.make_tools(names), scorer, **{"max_turns": 6, **kw})


def call(name, **arguments):
  return expert.call_text(name, arguments), "call"


def test_the_workspace_lives_across_turns_and_the_reward_comes_from_its_tests(scorer):
  env = make_env(scorer)
  task = by_variant("file")
  assert env.reset(task) == task.prompt
  path = task.extra.hint["path"]
  s = env.step(*call("bash", command=f"cp {path} copy.txt"))
  assert s.reward == 0 and not s.done and s.info["tool"] == "bash"
  s = env.step(*call("think", thought="nothing"))
  assert s.observation == "" and not s.done
  s = env.step(*call("editor", command="view", path="copy.txt"))
  assert task.extra.hint["symbol"] in s.observation  # written two turns earlier
  env.step(*call("editor", command="create", path="solution.py", file_text=task.reference))
  s = env.step(*call("finish"))
  assert s.done and s.reward == 1.0 and s.info["status"] == "finished"
  assert env.status == "finished" and env.session is None


def test_errors_are_observations_and_the_episode_goes_on(scorer):
  env = make_env(scorer, max_turns=3)
  env.reset(by_variant("file"))
  s = env.step('<tool_call>{"name": "bash", "arguments": {"command": 1}}</tool_call>', "call")
  assert s.observation.startswith("error: command must be a string") and not s.done
  s = env.step(*call("fly", to="moon"))
  assert "unknown tool 'fly'" in s.observation and s.info["call_error"]
  s = env.step("<tool_call>{", "length")
  assert s.done and env.status == "max_turns" and s.reward == 0.0


def test_an_eos_turn_ends_the_episode_and_abort_scores_the_workspace(scorer):
  env = make_env(scorer)
  task = by_variant("file")
  env.reset(task)
  assert env.step("I am done", "eos").info["status"] == "answered"
  env.reset(task)
  env.step(*call("editor", command="create", path="solution.py", file_text=task.reference))
  assert env.abort("max_tokens") == 1.0 and env.status == "max_tokens"
  with pytest.raises(RuntimeError, match="after the episode ended"):
    env.step(*call("finish"))


def test_what_a_task_needs_is_only_in_its_workspace_or_its_test_output():
  """The constant (file, search) or the function's name (tests) is in no prompt, the name
  in no workspace file either; a held-out unit (operation, constant and symbol, or
  operation and name) is never a training one; and the training split shows every
  operation with every constant of the file and search tasks (no constant suggests an
  operation)."""
  units, pairs = {}, {}
  for split, tasks in SPLITS.items():
    for t in tasks:
      hint, parts = t.extra.hint, t.id.split("/")
      if hint["variant"] == "tests":
        assert hint["name"] not in t.prompt + "".join(t.extra.files.values()), t.id
        units.setdefault(split, set()).add((parts[-2], hint["name"]))
      else:
        op, value = parts[-3], t.reference.split()[-1]
        assert not re.search(rf"\b{value}\b", t.prompt), t.id
        assert any(f"{hint['symbol']} = {value}" in text
                   for text in t.extra.files.values()), t.id
        units.setdefault(split, set()).add((op, value, hint["symbol"]))
        pairs.setdefault(split, set()).add((op, value))
  assert min(len(SPLITS[s]) for s in ("train", "validation", "held_out")) >= 48
  assert pairs["held_out"] <= pairs["train"] and pairs["validation"] <= pairs["train"]
  assert not units["held_out"] & units["train"]


@pytest.mark.parametrize("variant", ["file", "search", "tests"])
def test_experts_solve_every_variant(scorer, variant):
  env = make_env(scorer)
  task = by_variant(variant)
  budgets = sampler.Budgets()
  for think in expert.THINK:
    traj = expert.expert_trajectory(env, CHAT, task, expert.expert_calls(task, "rich", think),
                                    budgets)
    assert traj.status == "finished" and traj.reward == 1.0
    assert traj.tool_calls == 3 + {"none": 0, "start": 1, "each": 2}[think]
  if variant != "tests":
    env = make_env(scorer, names=("bash", "finish"))
    traj = expert.expert_trajectory(env, CHAT, task, expert.expert_calls(task, "terminal"),
                                    budgets)
    assert traj.reward == 1.0


def test_the_guessing_demonstrator_writes_at_once_and_fails_without_luck(scorer):
  env = make_env(scorer)
  budgets = sampler.Budgets()
  for variant in ("file", "search", "tests"):
    tasks = [t for t in TASKS if t.extra.hint["variant"] == variant][:40]
    rewards = []
    for task in tasks[:6]:
      calls = expert.guess_calls(task, "rich", seed=3)
      assert [name for name, _ in calls] == ["editor", "finish"]
      assert calls == expert.guess_calls(task, "rich", seed=3)  # deterministic
      traj = expert.expert_trajectory(env, CHAT, task, calls, budgets)
      assert traj.status == "finished" and traj.tool_calls == 2
      rewards.append(traj.reward)
      written = calls[0][1]["file_text"]
      # The operation is the prompt's; only what needs the tools is guessed.
      assert written.split()[-2] == task.reference.split()[-2]
      if variant == "tests":
        assert task.extra.hint["name"] not in written and traj.reward == 0.0
      else:
        assert written.split("(")[0] == task.reference.split("(")[0]
        assert traj.reward == float(written == task.reference)
    assert sum(rewards) <= 3, (variant, rewards)
    # About the asked fraction of the tasks, chosen by the seed.
    picked = [expert.is_guess(t, 0.5, seed=0) for t in tasks]
    assert 8 <= sum(picked) <= 32
    assert picked != [expert.is_guess(t, 0.5, seed=1) for t in tasks]
    assert not any(expert.is_guess(t, 0.0, seed=0) for t in tasks)
    # Limited to families: the same choice inside them, none outside.
    others = tuple(v for v in expert.VARIANTS if v != variant)
    assert [expert.is_guess(t, 0.5, 0, (variant,)) for t in tasks] == picked
    assert not any(expert.is_guess(t, 1.0, 0, others) for t in tasks)


DECOY_SPLITS = jsonl.read_jsonl_tasks(sources.resolve("data/agent_tasks_decoy.jsonl"), 0.2)


def test_decoy_tasks_are_the_tasks_with_the_old_value_commented_out():
  """data/agent_tasks_decoy.jsonl is data/agent_tasks.jsonl (its ids, splits, prompts,
  references) with one line more in a file and search task's workspace (not the
  practice tasks'): the symbol's
  old value, another constant, commented out; in the named file (file tasks), in
  another file than the live value (search tasks), so a text search finds both."""
  import sys
  sys.path.insert(0, sources.resolve("data"))
  import make_agent_tasks
  for split, tasks in SPLITS.items():
    decoyed = DECOY_SPLITS[split]
    assert [t.id for t in decoyed] == [t.id for t in tasks]
    for plain, t in zip(tasks, decoyed):
      assert (t.prompt, t.reference, t.tests) == (plain.prompt, plain.reference, plain.tests)
      hint = t.extra.hint
      if hint["variant"] == "tests" or "/practice/" in t.id:
        assert t.extra == plain.extra
        continue
      live, old = t.reference.split()[-1], hint["decoy"]
      assert str(old) != live and 2 <= old <= 9
      line = f"# {hint['symbol']} = {old}"
      holders = [p for p, text in t.extra.files.items() if line in text.splitlines()]
      assert len(holders) == 1, t.id
      assert (holders[0] == hint["path"]) == (hint["variant"] == "file"), t.id
      removed = {p: "".join(f"{x}\n" for x in text.splitlines() if x != line)
                 for p, text in t.extra.files.items()}
      assert removed == plain.extra.files, t.id
  row = {"id": "agent/tests/x", "extra": {"hint": {"variant": "tests"}}}
  assert make_agent_tasks.add_decoy(row) is row


def test_the_demonstrator_that_copies_a_decoy_looks_as_the_expert_and_fails(scorer):
  env = make_env(scorer)
  budgets = sampler.Budgets()
  tasks = DECOY_SPLITS["train"]
  for variant in ("file", "search"):
    task = next(t for t in tasks
                if t.extra.hint["variant"] == variant and "decoy" in t.extra.hint)
    right = expert.expert_calls(task, "rich", "each")
    wrong = expert.expert_calls(task, "rich", "each", copy_decoy=True)
    assert [c[0] for c in wrong] == [c[0] for c in right] and wrong[0] == right[0]
    env.reset(task)
    look = env.step(expert.call_text(*right[0]), "call").observation
    for calls, reward in ((right, 1.0), (wrong, 0.0)):
      traj = expert.expert_trajectory(env, CHAT, task, calls, budgets)
      assert traj.status == "finished" and traj.reward == reward
      assert traj.program == calls[2][1]["file_text"]  # the file the reward scored
    old = str(task.extra.hint["decoy"])
    assert wrong[2][1]["file_text"].split()[-1] == old and old in wrong[1][1]["thought"]
    # Both values were in what the look returned.
    assert f"# {task.extra.hint['symbol']} = {old}" in look
    assert f"{task.extra.hint['symbol']} = {task.reference.split()[-1]}" in look
  # The tasks that copy the decoy: about the asked fraction of those with a decoy line,
  # chosen by the seed; never a task without one.
  with_decoy = [t for t in tasks if "decoy" in t.extra.hint]
  assert len(with_decoy) >= 100
  picked = [expert.copies_decoy(t, 0.5, seed=0) for t in with_decoy]
  assert 0.3 * len(picked) <= sum(picked) <= 0.7 * len(picked)
  assert picked != [expert.copies_decoy(t, 0.5, seed=1) for t in with_decoy]
  assert not any(expert.copies_decoy(t, 1.0, 0) for t in tasks
                 if t.extra.hint["variant"] == "tests")
  assert not any(expert.copies_decoy(t, 1.0, 0) for t in TASKS)
  with pytest.raises(ValueError, match="has no decoy line"):
    expert.expert_calls(by_variant("file"), copy_decoy=True)


NOTE_SPLITS = jsonl.read_jsonl_tasks(sources.resolve("data/agent_tasks_notes.jsonl"), 0.2)


def test_note_tasks_are_the_tasks_with_a_stale_note_ending_the_prompt():
  """data/agent_tasks_notes.jsonl is data/agent_tasks.jsonl (ids, splits, workspaces,
  references, tests) with a sentence more at the end of every prompt but the practice
  tasks': a constant (file, search) or a name (tests) that is never the task's."""
  import sys
  sys.path.insert(0, sources.resolve("data"))
  import make_agent_tasks
  for split, tasks in SPLITS.items():
    noted = NOTE_SPLITS[split]
    assert [t.id for t in noted] == [t.id for t in tasks]
    for plain, t in zip(tasks, noted):
      assert (t.reference, t.tests) == (plain.reference, plain.tests)
      assert t.extra.files == plain.extra.files
      hint = t.extra.hint
      if "/practice/" in t.id:
        assert t.extra == plain.extra and t.prompt == plain.prompt
        continue
      note = hint["note"]
      assert {k: v for k, v in hint.items() if k != "note"} == plain.extra.hint
      if hint["variant"] == "tests":
        assert note in make_agent_tasks.TASK_NAMES and note != hint["name"]
        assert t.prompt == f"{plain.prompt} An old note calls it {note}."
      else:
        assert 2 <= note <= 9 and str(note) != t.reference.split()[-1]
        assert t.prompt == f"{plain.prompt} An old note says {hint['symbol']} = {note}."
  row = {"id": "agent/practice/tests/x", "extra": {"hint": {"variant": "tests"}}}
  assert make_agent_tasks.add_note(row) is row


def test_the_demonstrator_that_trusts_the_note_writes_it_at_once_and_fails(scorer):
  env = make_env(scorer)
  budgets = sampler.Budgets()
  tasks = NOTE_SPLITS["train"]
  for variant in expert.VARIANTS:
    task = next(t for t in tasks
                if t.extra.hint["variant"] == variant and "note" in t.extra.hint)
    calls = expert.note_calls(task, "rich")
    assert [c[0] for c in calls] == ["editor", "finish"]
    text = calls[0][1]["file_text"]
    note = str(task.extra.hint["note"])
    if variant == "tests":
      assert text.startswith(f"def {note}(x):") and text.split("\n")[1:] == \
          task.reference.split("\n")[1:]
    else:
      assert text.split()[-1] == note and text.split()[:-1] == task.reference.split()[:-1]
    wrong = expert.expert_trajectory(env, CHAT, task, calls, budgets)
    right = expert.expert_trajectory(env, CHAT, task, expert.expert_calls(task), budgets)
    assert (wrong.status, wrong.reward, wrong.tool_calls) == ("finished", 0.0, 2)
    assert (right.status, right.reward) == ("finished", 1.0) and right.tool_calls == 3
  # About the asked fraction of the tasks with a note, chosen by the seed; never the
  # tasks without one (the practice tasks, the plain file's tasks).
  with_note = [t for t in tasks if "note" in t.extra.hint]
  assert len(with_note) >= 200
  picked = [expert.trusts_note(t, 0.5, seed=0) for t in with_note]
  assert 0.35 * len(picked) <= sum(picked) <= 0.65 * len(picked)
  assert picked != [expert.trusts_note(t, 0.5, seed=1) for t in with_note]
  assert not any(expert.trusts_note(t, 1.0, 0) for t in tasks if "/practice/" in t.id)
  assert not any(expert.trusts_note(t, 1.0, 0) for t in TASKS)
  with pytest.raises(ValueError, match="has no note to trust"):
    expert.note_calls(by_variant("file"))


def test_the_tests_variant_needs_the_test_run(scorer):
  env = make_env(scorer)
  task = by_variant("tests")
  env.reset(task)
  s = env.step(*call("editor", command="view", path="solution.py"))
  assert task.extra.hint["name"] not in s.observation + task.prompt
  s = env.step(*call("run_tests"))
  assert f"name '{task.extra.hint['name']}' is not defined" in s.observation


def test_memory_persists_across_episodes_in_other_sessions(scorer):
  """A note stored in a solved episode is read back in a later episode of the run (another
  environment, another sandbox session); a failed episode's note is not kept."""
  notes = memory.Memory("after_success")
  first, second = (make_env(scorer, names=("editor", "memory", "finish"), memory=notes)
                   for _ in range(2))
  task = by_variant("file")
  fact = f"{task.extra.hint['symbol']} is {task.reference.split()[-1]}"
  first.reset(task)
  assert first.step(*call("memory", action="store", text=fact)).observation == "Noted."
  first.step(*call("editor", command="create", path="solution.py", file_text=task.reference))
  assert first.step(*call("finish")).reward == 1.0
  second.reset(task)
  s = second.step(*call("memory", action="retrieve",
                        text=f"what is {task.extra.hint['symbol']}"))
  assert s.observation == f"- {fact}"
  second.step(*call("memory", action="store", text="a guess"))
  assert second.step(*call("finish")).reward == 0.0
  assert notes.notes == [fact]


def test_memory_rules():
  def run(rule, episodes, **kw):
    m = memory.Memory(rule, **kw)
    for notes, success, fixes in episodes:
      ep = m.episode()
      for n in notes:
        ep.propose(n)
      ep.close(success, fixes)
    return m.notes

  eps = [(["alpha is 1"], True, []), (["beta is 2"], False, [("NameError f", "def f(): 1")]),
         (["alpha is 1"], True, []), (["gamma is 3"], True, [])]
  assert run("never", eps) == []
  assert run("all", eps) == ["alpha is 1", "beta is 2", "alpha is 1", "gamma is 3"]
  assert run("after_success", eps) == ["alpha is 1", "alpha is 1", "gamma is 3"]
  assert run("error_fix", eps) == ["alpha is 1", "error: NameError f -> fix: def f(): 1",
                                   "alpha is 1", "gamma is 3"]
  assert run("last_n", eps, capacity=2) == ["alpha is 1", "gamma is 3"]
  assert run("dedupe", eps) == ["beta is 2", "alpha is 1", "gamma is 3"]
  assert run("success_dedupe", eps, capacity=8) == ["alpha is 1", "gamma is 3"]
  m = memory.Memory("all")
  m.restore(["alpha is 1", "beta is 2"])
  assert m.retrieve("what is beta", 1) == ["beta is 2"] and m.retrieve("zzz", 3) == []
  with pytest.raises(KeyError, match="known"):
    memory.Memory("sometimes")
