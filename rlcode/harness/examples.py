"""An example harness, written as an outside one is: it knows the OpenAI API and its task,
nothing of rlcode's trainer (configs/harness_tiny.py trains the tiny policy on it).

`two_call_agent` works on a code task (rlcode.data.tasks.Task: a function's head, its
tests) in two calls of /v1/completions through the openai client: it writes the body,
runs the task's tests on it (its environment), then tells the policy whether they passed
and asks for the body again, after the whole exchange so far (the second call's prompt
extends the first's, so the episode is one segment unless the text does not round-trip
its tokens). `tests_reward` scores the final body by the task's tests through rlcode's
rewards registry (the sandbox), the job's `harness.reward`.

The policy's name is read from /v1/models, and every call names its episode with the
X-Episode-Id header, as rlcode.harness.rollouts asks. The harness samples at temperature
1.0, the default rl.temperature.
"""

from __future__ import annotations

import openai

from rlcode import rewards

MAX_TOKENS = 40
TEMPERATURE = 1.0
FEEDBACK = {True: "\n# The tests passed. Once more:\n", False: "\n# The tests failed. Again:\n"}


def tests_pass(task, body: str) -> float:
  """1.0 when `body` completes `task`'s prompt into a function that passes its tests."""
  out = rewards.compute({"tests": 1.0}, [task], [body], {"tests": {"mode": "all"}})
  return float(out.scores[0])


def two_call_agent(task, base_url: str, api_key: str, episode_id: str) -> dict:
  """One episode on `task`: {"completion": the final body, "first": the first body,
  "first_passed": whether the tests passed it}."""
  client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120,
                         default_headers={"X-Episode-Id": episode_id})
  model = client.models.list().data[0].id

  def complete(prompt: str) -> str:
    reply = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS,
                                      temperature=TEMPERATURE)
    return reply.choices[0].text

  first = complete(task.prompt)
  passed = tests_pass(task, first) == 1.0
  second = complete(task.prompt + first + FEEDBACK[passed] + task.prompt)
  return {"completion": second, "first": first, "first_passed": passed}


def tests_reward(task, result) -> float:
  """The environment's score of an episode: the task's tests on its final body."""
  return tests_pass(task, result["completion"])
