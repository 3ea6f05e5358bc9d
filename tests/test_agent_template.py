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
  agent = types.SimpleNamespace(chat_format="auto")
  assert episodes.chat_format(agent, load_tokenizer(base)).name == "template"
  assert episodes.chat_format(agent, load_tokenizer("bytes+tools")).name == "compact"


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


GENERATION_CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ message['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _tokenizer_dir(path, template):
  import json
  tiny_hf.tokenizer_json(str(path / "tokenizer.json"))
  with open(path / "tokenizer_config.json", "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
               "pad_token": "<|endoftext|>", "bos_token": None, "chat_template": template}, f)
  return str(path)


def test_a_demonstrations_mask_is_the_templates_generation_spans(tmp_path):
  from transformers import AutoTokenizer
  directory = _tokenizer_dir(tmp_path, GENERATION_CHATML)
  tok = load_tokenizer(directory)
  chat = ChatFormat("template", tok)
  env = _env()
  calls = [("editor", {"command": "view", "path": "notes.txt"}),
           ("editor", {"command": "create", "path": "solution.py", "file_text": "x = 1\n"}),
           ("finish", {})]
  traj = expert.expert_trajectory(env, chat, TASK, calls, BUDGETS)
  replay = _env()
  messages = [{"role": "user", "content": replay.reset(TASK)}]
  for name, arguments in calls:
    messages.append({"role": "assistant", "content": expert.call_text(name, arguments)})
    step = replay.step(expert.call_text(name, arguments), "call")
    if not step.done:
      messages.append({"role": "tool", "content": step.observation})
  hf = AutoTokenizer.from_pretrained(directory)
  want = hf.apply_chat_template(messages, tools=[t.schema() for t in env.tools.values()],
                                tokenize=True, return_dict=True,
                                return_assistant_tokens_mask=True)
  n = len(traj.prompt) + len(traj.tokens)  # the last turn's end-of-turn is never written
  assert list(want["input_ids"])[:n] == traj.prompt + traj.tokens
  assert list(want["assistant_masks"])[:n] == [0] * len(traj.prompt) + traj.mask
  # The end-of-turn token after each call is the assistant's; the observations are not.
  assert sum(traj.mask) == sum(len(tok.encode(expert.call_text(*c))) for c in calls) + 2
  (tmp_path / "plain").mkdir()
  plain = load_tokenizer(_tokenizer_dir(tmp_path / "plain", tiny_hf.CHATML))
  assert ChatFormat("template", plain).observation_mask(5) == [0] * 5


@pytest.mark.parametrize("template, message", [
    ("{% for m in messages %}{% if m['role'] != 'assistant' %}<{{ m['role'] }}>{% endif %}"
     "{{ m['content'] }}{% if m['role'] == 'assistant' %}{% generation %}<end>"
     "{% endgeneration %}{% endif %}{% endfor %}",
     "no {% generation %} block holds the assistant's turn"),
    ("{% for m in messages %}{% if m['role'] != 'assistant' %}<{{ m['role'] }}>{% endif %}"
     "{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}",
     "holds a tool's result"),
])
def test_generation_spans_that_miss_the_turn_or_hold_a_result_are_refused(template, message):
  tok = types.SimpleNamespace(chat_template=ChatTemplate({"default": template}, {}),
                              special_id=lambda t: 1, eos_ids=(2,))
  with pytest.raises(BadInput, match=message):
    ChatFormat("template", tok).observation_mask(3)
