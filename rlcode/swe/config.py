"""What decides which executable PR tasks a history yields: SweConfig and the skip reasons.

This module must not touch git nor run tests: it validates arguments.
"""

from __future__ import annotations

import dataclasses
import re

from rlcode.data import edits

REPO_NAME = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")

# Why a first-parent commit (a PR) gives no task, in the order they are decided; a PR
# counts under the first that applies. The first three mean it has no base or does not
# change both code and tests; the next group, that its files are unusable; then what its
# runs said; the last three, what validation said.
SKIP_REASONS = (
    "root_commit", "no_test_change", "no_code_change",
    "non_utf8_message", "empty_message", "unusable_file", "too_large", "no_test_module",
    "timeout", "crash", "sandbox_error", "pytest_error", "missing_dependency",
    "python_version", "collection_error", "no_passing_test", "no_fail_to_pass",
    "patch_error", "flaky", "runners_disagree",
)
# The reasons of PRs whose tests did not run to a usable result at both commits.
NOT_RUNNABLE = ("timeout", "crash", "sandbox_error", "pytest_error", "missing_dependency",
                "python_version", "collection_error", "no_passing_test")


@dataclasses.dataclass(frozen=True)
class SweConfig:
  """Everything that decides which executable PR tasks a history yields.

  Attributes:
    source: a local repository (its root) or a git bundle (rlcode.data.git.repo).
    branch: the branch, tag or commit whose first-parent history is walked.
    max_commits: walk only the latest this many first-parent commits; 0: all.
    max_changed_lines: skip PRs whose code and test patches add and remove more lines.
    timeout: wall clock (and CPU seconds) of one pytest run.
    hypothesis_examples: examples per hypothesis test (derandomized in every case;
      rlcode.swe.pytest_plugin); 0: the tests' own setting.
    gold_runs: how many runs of the gold patch must pass every FAIL_TO_PASS test: the
      after run and gold_runs - 1 more of those tests alone, each with its own hash seed
      (rlcode.swe.validate); a test failing 4 runs in 10 passes all 8 with probability
      0.6 ** 8 = 1.7%.
    extra_test_deps: distributions made available besides the ones the repository
      declares for its code and tests (rlcode.swe.deps).
    workers: PRs evaluated at once (each runs its sandboxes one after another); 0: one
      more than the CPUs this process may use.
    test_fraction: the latest fraction of tasks (by PR time) that form the test split.
    validation_fraction: the latest fraction of tasks before the test split's that form a
      "validation" split (to tune on); 0: none.
    edit_format: the answer format a task's prompt asks for (rlcode.data.edits); agent
      episodes answer with their workspace's diff rendered in it.
    repo_name: the repository's `owner/name` (SWE-bench's repo; task ids are
      `owner__name-N`, N the PR's position on the first-parent chain); "": read from the
      source's origin URL, else `local/` and the source's file name without .bundle/.git.
  """

  source: str
  branch: str = "HEAD"
  max_commits: int = 0
  max_changed_lines: int = 2000
  timeout: float = 120.0
  hypothesis_examples: int = 20
  gold_runs: int = 8
  extra_test_deps: tuple[str, ...] = ()
  workers: int = 0
  test_fraction: float = 0.1
  validation_fraction: float = 0.0
  edit_format: str = "unified_diff"
  repo_name: str = ""

  def __post_init__(self):
    if isinstance(self.extra_test_deps, str):
      raise ValueError("SweConfig.extra_test_deps must be a sequence of names, got the "
                       f"string {self.extra_test_deps!r}")
    object.__setattr__(self, "extra_test_deps", tuple(self.extra_test_deps))
    if not self.source:
      raise ValueError("SweConfig.source is empty")
    for name in ("max_commits", "workers", "hypothesis_examples"):
      if getattr(self, name) < 0:
        raise ValueError(f"SweConfig.{name}={getattr(self, name)} < 0")
    if self.repo_name and not REPO_NAME.fullmatch(self.repo_name):
      raise ValueError(f"SweConfig.repo_name={self.repo_name!r} is not owner/name")
    if self.gold_runs < 2:
      raise ValueError(f"SweConfig.gold_runs={self.gold_runs} < 2 (the after run and at least "
                       "one more)")
    for name in ("max_changed_lines", "timeout"):
      if not getattr(self, name) > 0:
        raise ValueError(f"SweConfig.{name}={getattr(self, name)} must be > 0")
    if not 0 <= self.test_fraction < 1:
      raise ValueError(f"SweConfig.test_fraction={self.test_fraction} is not in [0, 1)")
    if not 0 <= self.validation_fraction < 1 - self.test_fraction:
      raise ValueError(f"SweConfig.validation_fraction={self.validation_fraction} is not in "
                       f"[0, 1 - test_fraction={self.test_fraction})")
    if self.edit_format not in edits.EDIT_FORMATS:
      raise ValueError(f"SweConfig.edit_format={self.edit_format!r}; expected one of "
                       f"{edits.EDIT_FORMATS}")
