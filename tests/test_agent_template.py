"""A tool episode through a checkpoint's own chat template (agent.chat_format "template").

The tokens of an episode are the template's rendering of the conversation it was: the task
as the user turn, each call as an assistant turn, each observation as a tool turn, then the
next generation prompt; nothing is re-tokenised from text, and the sampler plays episodes
through it with a tiny checkpoint of the family (tests/tiny_hf.py).
"""

import types

import pytest

import tiny_hf
from rlcode.agent import env as env_lib, episodes, expert, sampler, tools
from rlcode.agent.chat import ChatFormat
from rlcode.data.tasks import Task
from rlcode.errors import BadInput
from rlcode.models import load_hf, load_tokenizer
from rlcode.models.chat_template import ChatTemplate
from test_agent_sampler import CountingScorer, MemorySession

TASK = Task(id="t0", prompt="write solution.py", extra={"files": {"notes.txt": "K = 3\n"}})
BUDGETS = sampler.Budgets(max_total_tokens=600, max_turn_tokens=60, max_observation_tokens=64)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  return tiny_hf.checkpoint("qwen3", tmp_path_factory.mktemp("ckpt"), max_positions=2048)


def _env():
  return env_lib.ToolEnv(tools.make_tools(("editor", "finish")), CountingScorer(),
                         max_turns=4, open_session=MemorySession)


def test_auto_picks_the_template_when_the_tokenizer_has_one(base):
  config = types.SimpleNamespace(agent=types.SimpleNamespace(chat_format="auto"))
  assert episodes.chat_format(config, load_tokenizer(base)).name == "template"
  assert episodes.chat_format(config, load_tokenizer("bytes+tools")).name == "compact"


def test_an_episode_is_the_templates_rendering_of_its_conversation(base):
  tok = load_tokenizer(base)
  chat = ChatFormat("template", tok)
  env = _env()
  calls = [("editor", {"command": "create", "path": "solution.py", "file_text": "x = 1\n"}),
           ("finish", {})]
  traj = expert.expert_trajectory(env, chat, TASK, calls, BUDGETS)
  first = chat.decode(traj.tokens[:len(tok.encode(expert.call_text(*calls[0])))])
  observation = env_lib.ToolEnv(tools.make_tools(("editor", "finish")), CountingScorer(),
                                max_turns=4, open_session=MemorySession)
  observation.reset(TASK)
  obs = observation.step(first, "call").observation
  messages = [{"role": "user", "content": env.reset(TASK)},
              {"role": "assistant", "content": expert.call_text(*calls[0])},
              {"role": "tool", "content": obs}]
  want = tok.chat_template.render(messages, tools=[t.schema() for t in env.tools.values()],
                                  add_generation_prompt=True) + expert.call_text(*calls[1])
  # (The character-level tokenizer encodes the whole text as the pieces were encoded.)
  assert traj.prompt + traj.tokens == tok.encode(want, add_special_tokens=False)
  assert traj.prompt == tok.encode(chat.prompt_text(list(env.tools.values()),
                                                    env.reset(TASK)), add_special_tokens=False)


@pytest.mark.slow
def test_the_sampler_plays_episodes_through_the_template(base):
  model, _ = load_hf(base)
  tok = load_tokenizer(base)
  chat = ChatFormat("template", tok)
  trajs = sampler.run_episodes(model, chat, [_env() for _ in range(2)], [TASK], group_size=2,
                               budgets=BUDGETS, temperature=1.0, seed=0)
  assert len(trajs) == 2 and all(t.tokens for t in trajs)
  head, tail = chat.observation_parts()
  assert head.startswith("<|im_end|>") and tail.endswith("<|im_start|>assistant\n")


def test_a_template_that_rewrites_earlier_turns_is_refused():
  rewriting = ChatTemplate({"default": "{% for m in messages|reverse %}{{ m['content'] }}"
                                       "{% endfor %}"}, {})
  tok = types.SimpleNamespace(chat_template=rewriting, special_id=lambda t: 1, eos_ids=(2,))
  with pytest.raises(BadInput, match="does not extend a conversation"):
    ChatFormat("template", tok).observation_parts()
