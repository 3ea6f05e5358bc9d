"""Stand-ins for the benchmarks: an environment that answers every turn alike.

agent/kv.py times the sampler alone with FixedEnv; tests/test_agent_kv_experiment.py
keeps it in step with what rlcode.agent.sampler reads from an environment.
"""

from __future__ import annotations

from rlcode.agent import env as env_lib, tools

# Episodes of TURNS turns: a PROMPT_TOKENS-token prompt, then per turn TURN_TOKENS sampled
# tokens and an OBS_TOKENS-token observation; GROUP episodes run together.
TURNS, TURN_TOKENS, OBS_TOKENS, PROMPT_TOKENS, GROUP = 10, 24, 360, 200, 4


class FixedEnv:
  """Every turn gets an observation of OBS_TOKENS bytes; the episode lasts TURNS turns."""

  tools = {t.name: t for t in tools.make_tools(("bash", "finish"))}

  def reset(self, task):
    """Starts an episode of `task`; its first observation is the prompt."""
    self.turns, self.status, self.final_reward, self.final_program = 0, "", 0.0, ""
    return task.prompt

  def step(self, text, ended):
    """The next observation (fixed length), and the end after TURNS turns."""
    self.turns += 1
    if self.turns >= TURNS:
      self.status = "max_turns"
      return env_lib.Step("", 0.0, True, {"status": "max_turns"})
    return env_lib.Step("o" * (OBS_TOKENS - 2), 0.0, False, {})

  def abort(self, status):
    """Ends the episode early with `status`; its reward is 0."""
    self.status = status
    return 0.0
