"""The data section's `gym` sub-section: question/answer tasks from reasoning-gym's
procedural generators (config.data.source "reasoning_gym", rlcode.data.reasoning_gym),
scored by each generator's own verifier (the "gym" reward, rlcode.rewards.gym).

The generators' names and their configs' keys are reasoning-gym's (its
reasoning_gym.factory.DATASETS); they are checked when the config loads, which imports
reasoning_gym then (a second or two) and only then: this module itself stays light, as
the config schema imports it.

Refused generators (`REFUSED`): those whose score_answer runs the answer's text through
eval or sympy's parse_expr (which evals), as the text is a policy's completion, and
"composite", whose entries are its parts' (name the parts in `datasets` instead).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any

from rlcode.errors import BadInput
from rlcode.fields import key

# reasoning-gym 0.1.25: the generators whose score_answer evaluates the answer's text as
# Python or through sympy.parse_expr (tests/test_reasoning_gym.py scans their sources).
EVALUATES_ANSWERS = ("binary_matrix", "countdown", "intermediate_integration", "n_queens",
                     "polynomial_multiplication", "puzzle24", "simple_integration",
                     "spiral_matrix", "string_insertion")
REFUSED = {**{name: "its score_answer evaluates the answer's text (eval or sympy's "
                    "parse_expr), and an answer is a policy's completion"
              for name in EVALUATES_ANSWERS},
           "composite": "its entries are other generators': name those in datasets"}
# A generator's config keys this section sets itself.
OWN_KEYS = ("seed", "size")
# Tasks of one generator in one split; with SEED_STRIDE, what keeps splits apart
# (rlcode.data.reasoning_gym).
MAX_SIZE = 250_000
MAX_SEED = 1000


def generators() -> Mapping[str, tuple[type, type]]:
  """reasoning-gym's registry: name -> (dataset class, config class)."""
  try:
    from reasoning_gym.factory import DATASETS  # deferred: imports every generator
  except ImportError as e:
    raise BadInput(f"reasoning-gym is not installed ({e}); pip install "
                   "'reasoning-gym>=0.1.25'") from None
  return DATASETS


def check_name(name: str, where: str = "datasets") -> None:
  """A BadInput line unless `name` is a generator rlcode may use."""
  known = generators()
  if name in REFUSED:
    raise BadInput(f"{where}: reasoning-gym's {name!r} is refused: {REFUSED[name]}")
  if name not in known:
    usable = sorted(n for n in known if n not in REFUSED)
    close = difflib.get_close_matches(name, usable, n=4, cutoff=0.6) or usable[:6]
    raise BadInput(f"{where}: reasoning-gym has no dataset {name!r}; e.g. "
                   f"{', '.join(repr(n) for n in close)} ({len(usable)} usable in all)")


def check_kwargs(name: str, kwargs: Mapping[str, Any]) -> None:
  """A BadInput line unless reasoning-gym's config of `name` takes `kwargs` (its
  validate() included)."""
  where = f"kwargs.{name}"
  own = sorted(set(kwargs) & set(OWN_KEYS))
  if own:
    raise BadInput(f"{where}: {own[0]!r} is this section's own (seed, *_size)")
  config_cls = generators()[name][1]
  names = sorted(f.name for f in dataclasses.fields(config_cls) if f.name not in OWN_KEYS)
  unknown = sorted(set(kwargs) - set(names))
  if unknown:
    raise BadInput(f"{where}: {config_cls.__name__} has no key {unknown[0]!r}; keys: "
                   f"{', '.join(names)}")
  try:
    config = config_cls(**kwargs)
    if callable(getattr(config, "validate", None)):
      config.validate()
  except (AssertionError, ValueError, TypeError, KeyError) as e:
    text = " ".join(str(e).split()) or type(e).__name__
    raise BadInput(f"{where}={dict(kwargs)!r}: reasoning-gym refuses it: {text}") from None


@dataclasses.dataclass(frozen=True)
class GymConfig:
  """Which reasoning-gym generators make the tasks, and how many of each.

  Attributes:
    datasets: the generators, by reasoning-gym name (e.g. "basic_arithmetic",
      "leg_counting"); each split holds the tasks of every one.
    train_size: tasks of each generator in the "train" split.
    validation_size: tasks of each generator in the "validation" split (to tune on); 0:
      none. (data.max_eval_tasks keeps the first tasks by id, the first generators' by
      name: cut here instead.)
    held_out_size: tasks of each generator in the "held_out" split; 0: none.
    seed: the splits' seeds derive from it (rlcode.data.reasoning_gym).
    kwargs: per generator, keyword arguments of its reasoning-gym config (e.g.
      {"basic_arithmetic": {"max_terms": 2}}); seed and size are this section's.
  """

  datasets: tuple[str, ...] = key(check=lambda d: bool(d), allowed="at least one name")
  train_size: int = key(256, ge=1, le=MAX_SIZE)
  validation_size: int = key(32, ge=0, le=MAX_SIZE)
  held_out_size: int = key(64, ge=0, le=MAX_SIZE)
  seed: int = key(0, ge=0, le=MAX_SEED)
  kwargs: dict[str, dict[str, Any]] = key({})

  def __post_init__(self):
    if isinstance(self.datasets, str):
      raise ValueError(f"datasets must be a tuple of names, got the string "
                       f"{self.datasets!r}")
    object.__setattr__(self, "datasets", tuple(self.datasets))
    if not self.datasets:
      raise ValueError("datasets is empty: name at least one generator")
    if len(set(self.datasets)) != len(self.datasets):
      raise ValueError(f"datasets names a generator twice: {self.datasets}")
    for name in self.datasets:
      check_name(name)
    for name, kwargs in self.kwargs.items():
      if name not in self.datasets:
        raise ValueError(f"kwargs.{name}: not one of the datasets "
                         f"{self.datasets}")
      check_kwargs(name, kwargs)
    for name, size in (("train_size", self.train_size),
                       ("validation_size", self.validation_size),
                       ("held_out_size", self.held_out_size)):
      if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_SIZE:
        raise ValueError(f"{name}={size!r}: expected an int in [0, {MAX_SIZE}]")
    if self.train_size < 1:
      raise ValueError("train_size must be at least 1")
    if isinstance(self.seed, bool) or not isinstance(self.seed, int) \
        or not 0 <= self.seed <= MAX_SEED:
      raise ValueError(f"seed={self.seed!r}: expected an int in [0, {MAX_SEED}]")
