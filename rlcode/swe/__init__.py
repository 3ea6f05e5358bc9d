"""Executable PR tasks (SWE-bench style) from any git history, and an agent's workspace.

    rlcode mine data/repos/attrs.bundle --tasks swe --out /tmp/swe

    from rlcode.swe import SweConfig, mine
    result = mine(SweConfig(source="data/repos/more-itertools.bundle"))

The rooms:
  config.py         SweConfig and the skip reasons
  history.py        a history's PRs that change code and tests, and their trees
  deps.py           a repository's declared test dependencies and import path (read, never run)
  testenv.py        the read-only test environment: pytest and those dependencies, copied
  pytest_plugin.py  the report plugin that runs inside the sandbox (text, never imported)
  runner.py         pytest over a tree in a sandbox session, cached by tree
  validate.py       FAIL_TO_PASS / PASS_TO_PASS from two runs, skip reasons, validation
  crosscheck.py     the second runner: each FAIL_TO_PASS test in a fresh process, its verdict
                    read from outside the interpreter under test
  routing.py        which way the second runner runs a test, and where its def is
  mining.py         the miner: PRs judged and validated on workers, cached by commit
  patches.py        git-style diffs between trees, test and code paths
  tasks.py          a mined PR as a Task; its workspace files; the tree its tests run on
  workspace.py      the agent's workspace over the repository; the scripted gold agent
  export.py         SWE-bench's JSON-lines format, written and read back
  builder.py        the tfds builders (mined, and from a SWE-bench file)
  sources.py        the "swe" and "swebench" data sources, registered with rlcode.data.sources
  decompose.py      decomposition checked by tests
  command.py        `rlcode mine --tasks swe`
The reward is rlcode.rewards.swe ("swe_tests", and the diff reward's view of these tasks).
"""

from rlcode.swe import sources  # registers the "swe" and "swebench" data sources
from rlcode.swe.config import SKIP_REASONS, SweConfig
from rlcode.swe.mining import SweResult, mine

__all__ = ["SKIP_REASONS", "SweConfig", "SweResult", "mine"]
