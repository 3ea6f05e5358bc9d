"""The config schema's `harness` section: GRPO whose rollouts are an outside harness's
episodes (rlcode.train.harness_loop, trainer "harness"); rlcode.config.schema composes it
into the Config.

An import path names a Python object as "package.module:attribute" (the attribute may be
dotted: "module:Agent.run"). Its form is checked when the config loads; whether it
resolves, and to a callable, when the run starts (one line naming the key, exit 2).
"""

from __future__ import annotations

import dataclasses
import re

from rlcode.fields import key

_IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
IMPORT_PATH = 'an import path "package.module:function"'


def is_import_path(text: str | None) -> bool:
  return text is None or bool(_IMPORT_PATH.fullmatch(text))


@dataclasses.dataclass(frozen=True)
class Harness:
  """An outside harness's episodes as GRPO's rollouts (rlcode.harness.rollouts).

  Attributes:
    harness: the harness: an import path "package.module:function" of a callable
      harness(task, base_url, api_key, episode_id) that works on one task through the
      OpenAI API at base_url (the policy, served in the trainer's process on 127.0.0.1
      under a random key), names each call's episode with the header X-Episode-Id, and
      returns its result (a reward, a mapping with "reward", or what `reward` reads). It
      must sample at rl.temperature, which the update's log-probs assume.
    reward: an import path of reward(task, result) -> float, the environment's score of
      an episode; None: the harness's result carries its reward.
    workers: episodes played at once (threads; an episode given up by the timeout no
      longer holds its place).
    timeout_seconds: an episode running longer is given up and its group dropped; None:
      no limit.
  """

  harness: str = key(check=is_import_path, allowed=IMPORT_PATH)
  reward: str | None = key(None, check=is_import_path, allowed=IMPORT_PATH)
  workers: int = key(8, ge=1)
  timeout_seconds: float | None = key(300.0, gt=0)
