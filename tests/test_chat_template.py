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


# Training templates: `{% generation %}` around the assistant's text; and with whitespace
# control inside a macro, where transformers places a span by the output streamed before
# the macro's call (the macro's own text before the block is not counted), as we do.
GENERATION = {
    "chatml": ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
               "{% if message['role'] == 'assistant' %}{% generation %}"
               "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
               "{% else %}{{ message['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"),
    "macro": ("{%- macro turn(m) -%}{{ '<|im_start|>' + m.role + '\\n' }}"
              "{%- if m.role == 'assistant' -%}{%- generation -%}{{ m.content | trim }}"
              "<|im_end|>{%- endgeneration -%}{%- else -%}{{ m.content }}<|im_end|>"
              "{%- endif -%}{{ '\\n' }}{%- endmacro -%}"
              "{%- for m in messages -%}{{ turn(m) }}{%- endfor -%}"
              "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"),
}
DIALOGUE = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hello, how are you?"},
            {"role": "assistant", "content": " I am fine. "},
            {"role": "user", "content": "Write add(a, b)."},
            {"role": "assistant", "content": "def add(a, b):\n    return a + b"}]


def _generation_dir(root, name):
  import json
  import os
  directory = write_tokenizer_dir(str(root / name), "chatml")
  path = os.path.join(directory, "tokenizer_config.json")
  with open(path) as f:
    config = json.load(f)
  config["chat_template"] = GENERATION[name]
  with open(path, "w") as f:
    json.dump(config, f)
  return directory


@pytest.fixture(scope="module")
def generation_dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("generation")
  return {name: _generation_dir(root, name) for name in GENERATION}


@pytest.mark.parametrize("name", sorted(GENERATION))
@pytest.mark.parametrize("turns", [3, 5])
def test_generation_blocks_render_and_mask_as_transformers(generation_dirs, name, turns):
  from transformers import AutoTokenizer
  hf = AutoTokenizer.from_pretrained(generation_dirs[name])
  messages = DIALOGUE[:turns]
  want = hf.apply_chat_template(messages, tokenize=True, return_dict=True,
                                return_assistant_tokens_mask=True)
  template = chat_template.load_chat_template(generation_dirs[name])
  assert template.marks_generation()
  text, spans = template.render_spans(messages, add_generation_prompt=False)
  assert text == hf.apply_chat_template(messages, tokenize=False)
  assert text == template.render(messages, add_generation_prompt=False)
  if name == "chatml":
    assert [text[a:b] for a, b in spans] == [
        m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]
  ids, mask = chat_template.assistant_mask(load_tokenizer(generation_dirs[name]), text, spans)
  assert ids == list(want["input_ids"]) and mask == list(want["assistant_masks"])
  assert sum(mask) > 0 and len(spans) == sum(m["role"] == "assistant" for m in messages)


def test_a_template_without_generation_blocks_has_no_spans(dirs):
  template = chat_template.load_chat_template(dirs["qwen25"])
  assert not template.marks_generation()
  text, spans = template.render_spans(CONVERSATIONS["plain"])
  assert spans == [] and text == template.render(CONVERSATIONS["plain"])


def test_span_mask_counts_a_token_cut_by_a_spans_edge():
  offsets = [(0, 2), (2, 5), (5, 6), (6, 9), (9, 12)]
  assert chat_template.span_mask(offsets, [(3, 6), (11, 20)]) == [0, 1, 1, 0, 1]
  assert chat_template.span_mask(offsets, []) == [0] * 5


def test_generation_blocks_stay_in_the_sandbox():
  evil = chat_template.ChatTemplate({"default": "{% generation %}"
                                                "{{ messages.__class__.__mro__[1].__subclasses__() }}"
                                                "{% endgeneration %}"}, {})
  for render in (evil.render, evil.render_spans):
    with pytest.raises(chat_template.TemplateError):
      render([{"role": "user", "content": "x"}])
  unclosed = chat_template.ChatTemplate({"default": "{% generation %}x"}, {})
  with pytest.raises(chat_template.TemplateError, match="endgeneration"):
    unclosed.render([{"role": "user", "content": "x"}])
