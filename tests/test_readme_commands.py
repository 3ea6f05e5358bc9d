"""Every command README.md shows runs, at a smoke size, as a newcomer would type it.

The commands are read from README.md itself: each line of a ```bash block that starts with
`rlcode` or `make`. SMOKE maps each one to its smoke form: the README's words unchanged,
then arguments appended (argparse keeps an option's last value, so an appended `--port 0`
or `--out DIR` re-sets the README's), and at most a `:variant` added to a `--config` file
that names none. A README command without an entry fails here, and so does an entry whose
smoke form drops or changes a word of its command.

Each command runs as `.venv/bin/rlcode` in a subprocess, in one scratch directory that
stands for a checkout (its configs/ and data/ are links to the repository's; everything
written lands under it, HOME included). The commands that read a trained run (eval, plot,
serve, export) share one: `make run`'s own command, at toy sizes, made once per module.
`make` targets are resolved with `make -n` and not run (the suite inside the suite, or a
one-minute job, would not fit CI): make run's rlcode command is the one the shared run
runs, make smoke's is that command on a `:smoke` config that resolves, and the pytest
recipes are the ones the README describes.
"""

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import time

import pytest

import serving
import tiny_hf
import tiny_runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
RLCODE = os.path.join(os.path.dirname(sys.executable), "rlcode")
KEY = "sk-readme"
# The toy sizes of tests/tiny_runs.py, but for the one key a README command sets itself.
TOY = tuple(a for a in tiny_runs.TINY if not a.startswith("--config.rl.group_size="))
CHAT_SMALL = ("--config.model.param_dtype=float32", "--config.model.dtype=float32",
              "--config.rl.group_size=2", "--config.rl.prompts_per_step=2",
              "--config.rl.max_new_tokens=8", "--config.train.steps=2",
              "--config.train.checkpoint_every=2", "--config.train.eval_every=0",
              "--config.train.progress_bar=false")
# The stand-in for the Hub checkpoint, made in the scratch checkout (tests/tiny_hf.py).
STAND_IN = "hub/qwen3"


def readme_commands(text: str) -> list[str]:
  """The `rlcode` and `make` lines of the ```bash blocks, comments dropped, in order."""
  commands, block, pending = [], False, ""
  for line in text.splitlines():
    if line.strip().startswith("```"):
      block = line.strip() == "```bash"
      continue
    if not block:
      continue
    line = pending + line
    if line.rstrip().endswith("\\"):
      pending = line.rstrip()[:-1] + " "
      continue
    pending = ""
    words = shlex.split(line, comments=True)
    if words and words[0] in ("rlcode", "make"):
      commands.append(" ".join(words))
  return commands


@dataclasses.dataclass(frozen=True)
class Smoke:
  """How one README command runs here.

  Attributes:
    check: the function below that runs it and checks what it did.
    append: arguments added after the README's.
    variant: a `:variant` added to the `--config` file.
    resets: README options that `append` gives again (argparse keeps the last value).
    beside: the README command whose check runs this one beside it (a learner beside its
      server), or "" for one that runs alone.
    why: what the smoke form changes, and why.
  """
  check: str
  append: tuple = ()
  variant: str = ""
  resets: tuple = ()
  beside: str = ""
  why: str = ""


SMOKE = {
    "make smoke": Smoke("make_smoke", why="make -n; its config resolves; its training "
                        "path is make run's, run below"),
    "make run": Smoke("make_run", why="make -n; its rlcode command trains the shared "
                      "workdir at toy sizes"),
    "make test": Smoke("make_pytest", why="make -n: the recipe is the README's pytest line"),
    "make test-fast": Smoke("make_pytest", why="make -n: the recipe is the unit tier's"),
    "rlcode train --config configs/grpo_tiny.py --config.rl.group_size=4 "
    "--config.workdir=workdirs/g4": Smoke("train_g4", TOY, why="toy sizes, 2 steps"),
    "rlcode config show configs/grpo_tiny.py": Smoke("config_show"),
    "rlcode config keys --trainer grpo": Smoke("config_keys"),
    "rlcode eval --config configs/grpo_tiny.py --checkpoint workdirs/grpo_tiny":
        Smoke("eval_checkpoint", TOY, why="the shared workdir's toy sizes"),
    "rlcode eval --tasks humaneval --completions samples.jsonl --k 1,10,100":
        Smoke("eval_completions", why="samples.jsonl: one completion a problem, the "
              "reference on even problems, a failing body on odd ones"),
    "rlcode plot workdirs/grpo_tiny": Smoke("plot"),
    "rlcode serve --checkpoint workdirs/grpo_tiny --port 8000 --api-key-file KEY":
        Smoke("serve_checkpoint", ("--port", "0"), resets=("--port",),
              why="port 0 (the OS picks)"),
    "rlcode mine data/repos/more-itertools.bundle --out /tmp/tfds --granularity pr "
    "--granularity hunk": Smoke("mine_diffs", ("--out", "tfds", "--max-commits", "5"),
                                resets=("--out",), why="the latest 5 commits; --out here"),
    "rlcode mine data/repos/attrs.bundle --tasks swe --out /tmp/swe":
        Smoke("mine_swe", ("--out", "swe", "--max-commits", "14", "--cache-dir", "swe-cache"),
              resets=("--out",), why="the latest 14 commits: one PR with a test change, "
              "its tests run at both commits (no FAIL_TO_PASS test, so no task); --out "
              "and the cache here"),
    "rlcode plan --config configs/qwen2_7b_plan.py --devices h200x8 --mesh fsdp=8":
        Smoke("plan", why="as written: the published 22.6 GB a device"),
    "rlcode train --config configs/chat_grpo.py:qwen3-1.7b":
        Smoke("train_chat", (f"--config.model.hf_path={STAND_IN}", *CHAT_SMALL),
              why="a tiny random Qwen3 with a ChatML template for the Hub checkpoint "
              "(no network), 2 steps"),
    "rlcode export workdirs/grpo_tiny --out /tmp/policy":
        Smoke("export", ("--out", "policy"), resets=("--out",), why="--out here"),
    "rlcode serve --checkpoint workdirs/grpo_tiny --port 8000":
        Smoke("serve_checkpoint", ("--port", "0"), resets=("--port",),
              why="port 0 (the OS picks)"),
    "rlcode serve --config configs/online_tiny.py --port 8000":
        Smoke("serve_online", ("--port", "0"), variant="test",
              resets=("--port",), why=":test (a 1-layer random policy, no warm start), "
              "port 0; the learner beside it"),
    "rlcode learn-online --config configs/online_tiny.py":
        Smoke("serve_online", ("--config.train.steps=1", "--config.online.batch_rows=8",
                               "--config.mesh.data=1"), variant="test",
              beside="rlcode serve --config configs/online_tiny.py --port 8000",
              why=":test, one update of 8 rows on one device, beside the server"),
}

COMMANDS = readme_commands(open(README, encoding="utf-8").read())


def smoke_argv(command: str) -> list[str]:
  """The smoke form of a README command, as arguments."""
  smoke = SMOKE[command]
  words = command.split()
  if smoke.variant:
    at = words.index("--config") + 1
    words[at] += ":" + smoke.variant
  return words + list(smoke.append)


def _option_keys(words):
  return {w.split("=")[0] for w in words if w.startswith("--")}


def smoke_problems(command: str, smoke: Smoke) -> list[str]:
  """What makes `smoke` more than the README command plus overrides (empty: nothing)."""
  words, problems = command.split(), []
  if smoke.variant:
    at = words.index("--config") + 1 if "--config" in words else None
    if at is None or at >= len(words) or ":" in words[at]:
      problems.append(f"variant {smoke.variant!r}: the command names no --config file "
                      "without one")
  again = _option_keys(smoke.append) & _option_keys(words)
  if again != set(smoke.resets):
    problems.append(f"appended arguments re-set {sorted(again)}, declared {list(smoke.resets)}")
  problems += [f"{r}: a config key the README sets is never re-set"
               for r in smoke.resets if r.startswith("--config.")]
  return problems


# ---------------------------------------------------------------- the table itself

def test_every_readme_command_has_a_smoke_form_and_no_other():
  assert len(COMMANDS) >= 19, COMMANDS  # the parser found the blocks
  missing = [c for c in COMMANDS if c not in SMOKE]
  assert not missing, f"README commands without a smoke form in SMOKE: {missing}"
  stale = [c for c in SMOKE if c not in COMMANDS]
  assert not stale, f"SMOKE entries the README no longer shows: {stale}"
  for command, smoke in SMOKE.items():
    assert smoke.check in globals(), (command, smoke.check)
    if smoke.beside:
      assert SMOKE[smoke.beside].check == smoke.check and not SMOKE[smoke.beside].beside


def test_the_parser_reads_comments_continuations_and_other_blocks_as_a_reader_does():
  text = ("```bash\nrlcode plot w  # a comment\nmake smoke\nrlcode train \\\n"
          "  --config c.py\necho rlcode\n```\n```python\nrlcode = 1\n```\n"
          "rlcode outside a block\n```\nmake run\n```\n")
  assert readme_commands(text) == ["rlcode plot w", "make smoke",
                                   "rlcode train --config c.py"]


@pytest.mark.parametrize("command", sorted(SMOKE))
def test_a_smoke_form_only_adds_to_its_command(command):
  assert smoke_problems(command, SMOKE[command]) == []
  words, argv = command.split(), smoke_argv(command)
  assert argv[len(words):] == list(SMOKE[command].append)
  assert [w.split(":")[0] for w in argv[:len(words)]] == [w.split(":")[0] for w in words]


G4 = ("rlcode train --config configs/grpo_tiny.py --config.rl.group_size=4 "
      "--config.workdir=workdirs/g4")
SERVE = "rlcode serve --checkpoint workdirs/grpo_tiny --port 8000"


@pytest.mark.parametrize("command,smoke,says", [
    (G4, Smoke("train_g4", ("--config.rl.group_size=8",)), "re-set ['--config.rl.group_size']"),
    (G4, Smoke("train_g4", ("--config.rl.group_size=8",), resets=("--config.rl.group_size",)),
     "a config key the README sets"),
    (SERVE, Smoke("serve_checkpoint", ("--port", "0")), "re-set ['--port']"),
    (SERVE, Smoke("serve_checkpoint", resets=("--port",)), "declared ['--port']"),
    (SERVE, Smoke("serve_checkpoint", variant="test"), "no --config file"),
    ("rlcode train --config configs/chat_grpo.py:qwen3-1.7b", Smoke("train_chat", variant="x"),
     "no --config file"),
])
def test_a_smoke_form_that_changes_its_command_is_refused(command, smoke, says):
  (problem,) = smoke_problems(command, smoke)
  assert says in problem


# ---------------------------------------------------------------- running them

def _env(home):
  # Tests never touch the user's home: a run that reaches for ~ finds the scratch one.
  return {**os.environ, "HOME": home, "PYTHONPATH": ""}


def run_rlcode(checkout, argv, timeout=300):
  """Runs `rlcode argv[1:]` in the scratch checkout; returns its stdout (exit 0 asserted)."""
  assert argv[0] == "rlcode"
  proc = subprocess.run([RLCODE, *argv[1:]], cwd=checkout, env=_env(str(checkout / "home")),
                        capture_output=True, text=True, timeout=timeout)
  assert proc.returncode == 0, (argv, proc.stdout[-3000:], proc.stderr[-3000:])
  return proc.stdout


def make_dry_run(target):
  """The commands `make -n target` would run (nothing is run), without the bootstrap's."""
  # A make of its own, not a sub-make of the `make test` that may be running this suite
  # (whose MAKEFLAGS and MAKELEVEL would print directories and pass its flags on).
  env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
  out = subprocess.run(["make", "--no-print-directory", "-n", "-o", ".venv/.installed",
                        target], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=60)
  assert out.returncode == 0, out.stderr
  return [line for line in out.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
  """A scratch checkout with `make run`'s run in workdirs/grpo_tiny, at toy sizes."""
  root = tmp_path_factory.mktemp("checkout")
  for name in ("configs", "data"):
    os.symlink(os.path.join(ROOT, name), root / name)
  (root / "home").mkdir()
  (root / "KEY").write_text(KEY + "\n")
  (line,) = [x for x in make_dry_run("run") if "rlcode " in x]
  argv = shlex.split(line)
  assert argv[0] == ".venv/bin/rlcode", line
  # The README's group of 4: the g4 command's programs are then this run's, compiled once
  # (the suite's persistent compilation cache).
  run_rlcode(root, ["rlcode", *argv[1:], *TOY, "--config.rl.group_size=4"])
  return root


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def make_run(checkout, argv):
  rows = _rows(checkout / "workdirs" / "grpo_tiny")
  assert [r["step"] for r in rows if "loss" in r] == [1, 2]
  assert os.path.isdir(checkout / "workdirs" / "grpo_tiny" / "checkpoints")


def make_smoke(checkout, argv):
  lines = make_dry_run("smoke")
  assert lines[-2:] == ["rm -rf workdirs/smoke",
                        ".venv/bin/rlcode train --config configs/grpo_tiny.py:smoke"]
  shown = run_rlcode(checkout, ["rlcode", "config", "show", "configs/grpo_tiny.py:smoke"])
  assert re.search(r"^warmstart\.steps\s*[:=]?\s*100\b", shown, re.M), shown
  assert re.search(r"^train\.steps\s*[:=]?\s*3\b", shown, re.M), shown


def make_pytest(checkout, argv):
  target = argv[1]
  (line,) = [x for x in make_dry_run(target) if "pytest" in x]
  assert line.startswith(".venv/bin/python -m pytest -n 2 --dist loadscope -q "), line
  assert line.split()[-1] == "tests"
  if target == "test":
    readme = open(README, encoding="utf-8").read()
    assert "make test    # the test suite: python -m pytest -n 2 --dist loadscope -q tests" \
        in readme
  else:
    assert '-m "not slow and not multiprocess"' in line, line


def train_g4(checkout, argv):
  run_rlcode(checkout, argv)
  workdir = checkout / "workdirs" / "g4"
  assert json.load(open(workdir / "config.json"))["rl"]["group_size"] == 4
  steps = [r for r in _rows(workdir) if "loss" in r]
  assert [r["step"] for r in steps] == [1, 2]


def config_show(checkout, argv):
  shown = run_rlcode(checkout, argv)
  assert re.search(r"^rl\.group_size\s*[:=]?\s*8\b", shown, re.M), shown
  assert re.search(r"^workdir\s*[:=]?\s*'?workdirs/grpo_tiny", shown, re.M), shown


def config_keys(checkout, argv):
  keys = run_rlcode(checkout, argv)
  assert "rl.group_size" in keys and "warmstart.steps" in keys
  assert "online.batch_rows" not in keys  # the online trainer's, not grpo's


def eval_checkpoint(checkout, argv):
  result = json.loads(run_rlcode(checkout, argv))
  assert result["step"] == 2, result
  assert 0.0 <= result["pass@1"] <= 1.0 and result["n_tasks"] == 4, result


def eval_completions(checkout, argv):
  from rlcode.data.humaneval import humaneval_tasks
  tasks = humaneval_tasks()
  with open(checkout / "samples.jsonl", "w", encoding="utf-8") as f:
    for i, task in enumerate(tasks):
      body = task.reference if i % 2 == 0 else "    raise NotImplementedError\n"
      f.write(json.dumps({"task_id": task.id, "completion": body}) + "\n")
  out = run_rlcode(checkout, argv)
  report = json.load(open(checkout / "eval_report.json"))
  # Every reference passes, every stub fails: exactly half, and n=1 leaves k=10, 100 out.
  assert report["n_tasks"] == 164 and report["pass_at_k"] == {"pass@1": 0.5}, report
  assert report["k_skipped"] == [10, 100]
  assert "164 tasks, 164 samples" in out


def plot(checkout, argv):
  path = run_rlcode(checkout, argv).strip().splitlines()[-1]
  path = os.path.join(checkout, path)
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def start_server(checkout, argv, timeout=240):
  """The README's `rlcode serve` command running in the scratch checkout."""
  return serving.ServeProcess([RLCODE, *argv[1:]], checkout,
                              env=_env(str(checkout / "home")), timeout=timeout)


def serve_checkpoint(checkout, argv):
  import httpx
  import openai
  keyed = "--api-key-file" in argv
  server = start_server(checkout, argv)
  try:
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
    if keyed:
      refused = httpx.post(server.url + "/v1/completions", timeout=30,
                           json={"model": "rlcode", "prompt": "def f(", "max_tokens": 2})
      assert refused.status_code == 401, refused.text
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY if keyed else "none",
                           timeout=120, max_retries=0)
    out = client.completions.create(model="rlcode", prompt="def add(a, b):", max_tokens=4)
    assert out.choices[0].finish_reason in ("length", "stop")
    assert len(out.choices[0].text) > 0
  finally:
    stopped = server.stop()
  assert stopped, "".join(server.output)
  assert os.path.isfile(checkout / "workdirs" / "grpo_tiny" / "interactions.sqlite")


def serve_online(checkout, argv):
  """The online job's server, and its learner beside it (the next README line): feedback
  on served completions trains one version, which the server then answers with."""
  import httpx
  (learner,) = [c for c, smoke in SMOKE.items() if smoke.beside and smoke.check == "serve_online"]
  server = start_server(checkout, argv)
  try:
    headers = {"Authorization": "Bearer none"}
    for seed in range(4):  # 4 requests of 2 candidates: 8 feedback rows
      r = httpx.post(server.url + "/v1/completions", headers=headers, timeout=120,
                     json={"model": "rlcode-tiny", "prompt": "def add(a, b):", "n": 2,
                           "max_tokens": 6, "seed": seed})
      assert r.status_code == 200, r.text
      body = r.json()
      assert body["policy_version"] == 0
      f = httpx.post(server.url + "/v1/feedback", headers=headers, timeout=30,
                     json={"id": body["id"], "chosen": 0})
      assert f.status_code == 200, f.text
    run_rlcode(checkout, smoke_argv(learner))
    deadline = time.monotonic() + 60
    version = 0
    while version != 1 and time.monotonic() < deadline:
      r = httpx.post(server.url + "/v1/completions", headers=headers, timeout=120,
                     json={"model": "rlcode-tiny", "prompt": "def", "max_tokens": 2})
      assert r.status_code == 200, r.text
      version = r.json()["policy_version"]
      time.sleep(0.2)
    assert version == 1, "the server never swapped in the learner's version"
  finally:
    stopped = server.stop()
  assert stopped, "".join(server.output)


def mine_diffs(checkout, argv):
  out = run_rlcode(checkout, argv)
  assert "units: pr=5 " in out, out
  datasets = [line.split()[-1] for line in out.splitlines() if " dataset " in f" {line}"]
  assert len(datasets) == 2 and all(os.path.isdir(os.path.join(checkout, d))
                                    for d in datasets), out


def mine_swe(checkout, argv):
  out = run_rlcode(checkout, argv, timeout=400)
  assert re.search(r"walked \(first-parent commits\)\s+14\n", out), out
  assert re.search(r"with tests changed \(code and tests\)\s+1\n", out), out
  assert re.search(r"pytest runs \(made / cached\)\s+2 / 0\n", out), out
  assert os.path.isfile(checkout / "swe" / "swe_tasks.jsonl")
  assert os.listdir(checkout / "swe-cache")


def plan(checkout, argv):
  table = run_rlcode(checkout, argv)
  assert "trainer mesh fsdp=8 (8 devices)" in table
  (peak,) = re.findall(r"peak \(XLA\)\s+([\d.]+) GB", table)
  assert peak.startswith("22.6"), table  # README and docs/results.md: 22.6 GB a device


def train_chat(checkout, argv):
  if not os.path.isdir(checkout / STAND_IN):
    tiny_hf.checkpoint("qwen3", checkout / "hub", max_positions=2048)
  run_rlcode(checkout, argv)
  rows = _rows(checkout / "workdirs" / "chat_grpo_qwen3-1.7b")
  steps = [r for r in rows if "loss" in r]
  assert [r["step"] for r in steps] == [1, 2]
  assert all(r["completion_len"] > 0 and "reward_mean" in r for r in steps)


def export(checkout, argv):
  run_rlcode(checkout, argv)
  files = os.listdir(checkout / "policy")
  assert "config.json" in files and any(f.endswith(".safetensors") for f in files), files


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c in COMMANDS if not SMOKE.get(c, Smoke("")).beside])
def test_readme_command(command, checkout):
  check = globals()[SMOKE[command].check]
  check(checkout, smoke_argv(command))
