"""Each reward's options, typed: `config.reward_options.<reward>.<key>`.

One dataclass per registered reward, whose keys are the keyword options of its function
(rlcode.rewards.tests, .swe, .semantic, .diffs, .gym, rlcode.rm.reward) with the same defaults
(tests/test_config_schema.py compares them), so `rlcode config keys` documents them and a
misspelt option is refused by name. `kwargs` turns a loaded section into the keyword
arguments each reward's function takes.

This module must stay light: the config schema imports it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rlcode.fields import key
from rlcode.sandbox.jobs import Limits

# Where a prompt+completion program is cut (HumanEval's stop sequences).
HUMANEVAL_STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")
TEST_SETS = ("hidden", "visible")
FORMAT_CHECKS = ("parses", "non_empty", "entry_point", "no_stray_text")
LEXICAL_METRICS = ("chrf", "chrf++")
GYM_EXTRACTIONS = ("auto", "tags", "marker", "whole")


@dataclasses.dataclass(frozen=True)
class TestsOptions:
  """The `tests` reward: a task's unit tests in the sandbox (rlcode.rewards.tests).

  Attributes:
    mode: "all" (1 if every test passed, else 0) or "fraction" (tests passed over tests
      total, from a complete report only; else 0).
    stop_sequences: where a prompt+completion program is cut.
    workers: sandbox runs in parallel; None: every CPU.
    test_set: "hidden" (the task's tests) or "visible" (its visible tests).
    limits: each sandboxed run's resource limits.
  """

  __test__ = False  # not a pytest class

  mode: str = key("all", choices=("all", "fraction"))
  stop_sequences: tuple[str, ...] = key(HUMANEVAL_STOP)
  workers: int | None = key(None, ge=1)
  test_set: str = key("hidden", choices=TEST_SETS)
  limits: Limits = key({})


@dataclasses.dataclass(frozen=True)
class FormatOptions:
  """The `format` reward: 1 for a completion that passes every check, else 0.

  Attributes:
    checks: the checks a completion must pass.
    stop_sequences: where a prompt+completion program is cut.
  """

  checks: tuple[str, ...] = key(FORMAT_CHECKS, choices=FORMAT_CHECKS)
  stop_sequences: tuple[str, ...] = key(HUMANEVAL_STOP)


@dataclasses.dataclass(frozen=True)
class DiffOptions:
  """The `diff` reward (SWE-RL's similarity of the answer's change to the gold change):
  it has no options."""


@dataclasses.dataclass(frozen=True)
class SweTestsOptions:
  """The `swe_tests` reward: an executable PR task's own tests (rlcode.rewards.swe).

  Attributes:
    mode: "resolved" (1 when every FAIL_TO_PASS and PASS_TO_PASS test passes, else 0) or
      "fail_to_pass" (the fraction of FAIL_TO_PASS tests that pass).
    workers: sandbox runs in parallel; 0: every CPU.
    cache: reuse the outcome of an identical (task, answer) from earlier batches.
  """

  mode: str = key("resolved", choices=("resolved", "fail_to_pass"))
  workers: int = key(0, ge=0)
  cache: bool = key(False)


@dataclasses.dataclass(frozen=True)
class SemanticOptions:
  """The `semantic` reward: a predicted section against its reference (MiniLM cosine,
  optionally mixed with chrF; rlcode.rewards.semantic).

  Attributes:
    lexical_weight: weight in [0, 1] of the lexical score in the mix.
    lexical_metric: "chrf" or "chrf++".
    length_penalty: exponent of the length-ratio factor; 0 turns it off.
    group_size: completions per group for the spread metrics; None: runs of one task id.
    model_dir: the encoder's directory; None: the PyPI package's.
  """

  lexical_weight: float = key(0.0, ge=0, le=1)
  lexical_metric: str = key("chrf", choices=LEXICAL_METRICS)
  length_penalty: float = key(0.0, ge=0)
  group_size: int | None = key(None, ge=1)
  model_dir: str | None = key(None)


@dataclasses.dataclass(frozen=True)
class RMOptions:
  """The `rm` reward: a reward model trained on choices (rlcode.rm.reward).

  Attributes:
    checkpoint: the reward model's workdir (`rlcode train` with trainer "rm"); required
      when the reward is weighed.
    stop_sequences: where a prompt+completion program is cut before scoring.
    workers: sandbox runs in parallel for a model that reads test features; None: every CPU.
    limits: each sandboxed run's resource limits (test features).
  """

  checkpoint: str = key("")
  stop_sequences: tuple[str, ...] = key(HUMANEVAL_STOP)
  workers: int | None = key(None, ge=1)
  limits: Limits = key({})


@dataclasses.dataclass(frozen=True)
class GymOptions:
  """The `gym` reward: a reasoning-gym task's own verifier (rlcode.rewards.gym).

  Attributes:
    extract: how a completion's answer is read: "auto" (inside the last
      <answer>...</answer>, else after the last `marker`, else the whole completion),
      "tags" or "marker" (only that way; else no answer, 0) or "whole"; then stripped.
    marker: the text an answer follows.
    max_answer_chars: a longer answer is not scored (0).
  """

  extract: str = key("auto", choices=GYM_EXTRACTIONS)
  marker: str = key("Answer:", check=bool, allowed="a non-empty string")
  max_answer_chars: int = key(4096, ge=1)


@dataclasses.dataclass(frozen=True)
class RewardOptions:
  """Each reward's options, under its name (read only for rewards with a weight).

  Attributes:
    tests: the `tests` reward's.
    format: the `format` reward's.
    diff: the `diff` reward's (none).
    swe_tests: the `swe_tests` reward's.
    semantic: the `semantic` reward's.
    rm: the `rm` reward's.
    gym: the `gym` reward's.
  """

  tests: TestsOptions = key({})
  format: FormatOptions = key({})
  diff: DiffOptions = key({})
  swe_tests: SweTestsOptions = key({})
  semantic: SemanticOptions = key({})
  rm: RMOptions = key({})
  gym: GymOptions = key({})


def kwargs(options: Mapping[str, Any]) -> dict[str, Any]:
  """One reward's loaded options as its function's keyword arguments: a `limits` group
  becomes the sandbox limits' own keywords."""
  out = {k: v for k, v in options.items() if k != "limits"}
  out.update(dict(options.get("limits") or {}))
  return out
