"""Chat templates render as transformers' apply_chat_template does: text and token ids, on
five checkpoint families' templates; refusals and sandbox escapes are clear errors."""

import pytest

from chat_templates import FAMILIES, write_tokenizer_dir
from rlcode.models import chat_template
from rlcode.models.tokenizer import load_tokenizer

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]

CONVERSATIONS = {
    "plain": [{"role": "user", "content": "Hello, how are you?"},
              {"role": "assistant", "content": "I am fine."},
              {"role": "user", "content": "Write add(a, b)."}],
    "system": [{"role": "system", "content": "You are terse."},
               {"role": "user", "content": "  Hi there  "}],
    "tools": [{"role": "system", "content": "Use tools."},
              {"role": "user", "content": "Weather in Paris?"},
              {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                  "name": "get_weather", "arguments": {"city": "Paris"}}}]},
              {"role": "tool", "content": "sunny, 21 C"}],
}
# What each family's template accepts (Mistral and Gemma refuse system turns).
CASES = [("chatml", "plain"), ("chatml", "system"), ("qwen25", "plain"), ("qwen25", "system"),
         ("qwen25", "tools"), ("llama3", "plain"), ("llama3", "system"), ("mistral", "plain"),
         ("gemma", "plain")]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("tokenizers")
  return {name: write_tokenizer_dir(str(root / name), name, as_file=name == "gemma")
          for name in FAMILIES}


@pytest.mark.parametrize("family,conversation", CASES)
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_equals_transformers(dirs, family, conversation, generation_prompt):
  from transformers import AutoTokenizer
  hf = AutoTokenizer.from_pretrained(dirs[family])
  messages = CONVERSATIONS[conversation]
  tools = TOOLS if conversation == "tools" else None
  want_text = hf.apply_chat_template(messages, tools=tools, tokenize=False,
                                     add_generation_prompt=generation_prompt)
  want_ids = hf.apply_chat_template(messages, tools=tools, tokenize=True,
                                    add_generation_prompt=generation_prompt)
  if isinstance(want_ids, dict) or hasattr(want_ids, "keys"):
    want_ids = want_ids["input_ids"]
  template = chat_template.load_chat_template(dirs[family])
  text = template.render(messages, tools=tools, add_generation_prompt=generation_prompt)
  assert text == want_text
  ids = chat_template.encode(load_tokenizer(dirs[family]), text)
  assert ids == list(want_ids)


def test_tools_are_listed_as_json(dirs):
  template = chat_template.load_chat_template(dirs["qwen25"])
  text = template.render(CONVERSATIONS["tools"], tools=TOOLS)
  assert '{"type": "function", "function": {"name": "get_weather"' in text
  assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text


def test_template_refusal_is_a_clear_error(dirs):
  template = chat_template.load_chat_template(dirs["gemma"])
  with pytest.raises(chat_template.TemplateError, match="System role not supported"):
    template.render(CONVERSATIONS["system"])


def test_sandbox_forbids_escapes():
  evil = chat_template.ChatTemplate(
      {"default": "{{ messages.__class__.__mro__[1].__subclasses__() }}"}, {})
  with pytest.raises(chat_template.TemplateError):
    evil.render([{"role": "user", "content": "x"}])
  mutate = chat_template.ChatTemplate({"default": "{% set _ = messages.append(1) %}x"}, {})
  with pytest.raises(chat_template.TemplateError, match="sandbox"):
    mutate.render([{"role": "user", "content": "x"}])


def test_no_template_falls_back_to_the_compact_format(tmp_path):
  assert chat_template.load_chat_template(str(tmp_path)) is None
  text = chat_template.fallback_prompt([{"role": "user", "content": "add two numbers"}])
  assert text == "task: add two numbers\n"
