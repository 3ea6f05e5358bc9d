"""Simulated users of a served policy: OpenAI clients that ask, judge, choose and report.

Each interaction: a task's prompt goes to /v1/completions with n = k candidates; the user
scores them with a hidden utility of their ground truth (rlcode.rm.simulate.Utility over
rlcode.rm.features: tests passed in the sandbox, similarity to the reference, length)
and picks by the first stage of a Plackett-Luce ranking (softmax(u / temperature), Gumbel
noise) among the k candidates and an outside option of utility `reject_utility` (writing
the code themselves). The pick goes back through /v1/feedback: for k = 1 accepted or
rejected; for k > 1 the chosen index, or rejected. An interaction is "accepted" when a
served candidate was picked: the acceptance rate the online experiment measures.

The utility and the noise are the reward model's choice simulator's; what differs is that
the candidates come from a live server whose policy may change while users use it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from rlcode.data.tasks import Task
from rlcode.rm import features as features_lib
from rlcode.rm.simulate import Utility, plackett_luce_choice


@dataclasses.dataclass(frozen=True)
class Users:
  """A population: its utility, the outside option, what it asks for.

  reject_utility: the outside option's utility. 3.5 lies between what the default utility
  gives the warm-started tiny policy's failing candidates (about 1.7: similarity to the
  reference less length) and its passing ones (about 5.5), so acceptance follows the
  pass rate, with noise.
  """

  tasks: Sequence[Task]
  model: str
  k: int = 3
  max_tokens: int = 40
  temperature: float = 1.0
  utility: Utility = dataclasses.field(default_factory=Utility)
  reject_utility: float = 3.5


@dataclasses.dataclass(frozen=True)
class Interaction:
  time: float
  task_id: str
  completion_id: str
  policy_version: int
  chosen: int | None
  passed: bool
  latency: float

  @property
  def accepted(self) -> bool:
    return self.chosen is not None


async def interact(users: Users, client, http, rng: np.random.Generator) -> Interaction:
  """One user's request, judgement and feedback; `client` an openai.AsyncOpenAI, `http` an
  httpx.AsyncClient on the same server (for /v1/feedback, which openai does not know)."""
  task = users.tasks[int(rng.integers(len(users.tasks)))]
  start = time.perf_counter()
  reply = await client.completions.create(
      model=users.model, prompt=task.prompt, n=users.k, max_tokens=users.max_tokens,
      temperature=users.temperature, seed=int(rng.integers(2**31)))
  latency = time.perf_counter() - start
  texts = [c.text for c in sorted(reply.choices, key=lambda c: c.index)]
  names = list(features_lib.FEATURES)
  values = await asyncio.to_thread(features_lib.compute, [task] * len(texts), texts, names,
                                   workers=1)
  table = {n: values[:, j] for j, n in enumerate(names)}
  u = users.utility.of(table)
  pick = plackett_luce_choice(np.append(u, users.reject_utility), users.utility.temperature, rng)
  chosen = pick if pick < len(texts) else None
  if users.k == 1:
    body = {"id": reply.id, "accepted": chosen is not None}
  else:
    body = {"id": reply.id, "chosen": chosen} if chosen is not None else {"id": reply.id,
                                                                         "rejected": True}
  r = await http.post("/v1/feedback", json=body)
  r.raise_for_status()
  return Interaction(time=time.time(), task_id=task.id, completion_id=reply.id,
                     policy_version=int(reply.model_extra["policy_version"]), chosen=chosen,
                     passed=bool(table["passed"][chosen]) if chosen is not None else False,
                     latency=latency)


async def run(users: Users, base_url: str, *, api_key: str = "none", concurrency: int = 4,
              seconds: float | None = None, count: int | None = None,
              seed: int = 0) -> list[Interaction]:
  """`concurrency` users interacting until `seconds` have passed or `count` interactions
  are done (whichever is given first); returns them in completion order."""
  import httpx
  import openai
  if seconds is None and count is None:
    raise ValueError("users.run needs seconds or count")
  deadline = None if seconds is None else time.monotonic() + seconds
  done: list[Interaction] = []
  started = 0
  headers = {"Authorization": f"Bearer {api_key}"}
  async with openai.AsyncOpenAI(base_url=base_url + "/v1", api_key=api_key, timeout=300,
                                max_retries=0) as client, httpx.AsyncClient(
                                    base_url=base_url, headers=headers, timeout=300) as http:

    async def user(i):
      nonlocal started
      rng = np.random.default_rng([seed, i])
      while (deadline is None or time.monotonic() < deadline) and (
          count is None or started < count):
        started += 1
        done.append(await interact(users, client, http, rng))

    await asyncio.gather(*(user(i) for i in range(concurrency)))
  return done
