"""The stand-in environment of experiments/agent/kv.py (experiments.lib.standins) keeps up
with what the sampler reads from an environment (it once lacked `final_program` and the
benchmark crashed)."""

from experiments.lib import standins
from rlcode.agent import env as env_lib, sampler, tools
from rlcode.data.tasks import Task


def test_fixed_env_has_what_the_sampler_reads_from_an_environment():
  env = standins.FixedEnv()
  task = Task(id="kv/0", prompt="p" * standins.PROMPT_TOKENS)
  assert env.reset(task) == task.prompt
  for turn in range(standins.TURNS):
    step = env.step("x", "call")
    assert isinstance(step, env_lib.Step) and step.done == (turn == standins.TURNS - 1)
  traj = sampler.Trajectory(task, [1])
  sampler.record_end(traj, env)
  assert (traj.status, traj.reward, traj.program) == ("max_turns", 0.0, "")
  # Every attribute the real environment offers the sampler, the stand-in has too.
  real = env_lib.ToolEnv(tools.make_tools(("finish",)), env_lib.Scorer({"tests": 1.0}),
                         max_turns=2)
  real.reset(Task(id="kv/1", prompt="p", extra={"files": {}}))
  for name in ("status", "final_reward", "final_program"):
    assert hasattr(real, name) and hasattr(env, name), name
