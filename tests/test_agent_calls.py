"""The tool-call parser, the argument check, the chat format and the tool-calling tokenizer."""

import json

import pytest

from rlcode.agent import calls, chat, tools
from rlcode.errors import BadInput, UnknownKey
from rlcode.models.tokenizer import TOOL_SPECIALS, ByteTokenizer, load_tokenizer

TOOLS = {t.name: t for t in tools.make_tools(tuple(tools.TOOLS))}


def call(obj) -> str:
  return f"<tool_call>{json.dumps(obj)}</tool_call>"


def test_a_valid_call_is_parsed_with_its_arguments():
  text = "I will look first. " + call({"name": "editor", "arguments": {
      "command": "view", "path": "notes.txt", "view_range": [1, 2]}})
  got = calls.parse_turn(text, "call", TOOLS)
  assert got == calls.Call("editor", {"command": "view", "path": "notes.txt",
                                      "view_range": [1, 2]})


def test_arguments_may_be_left_out_for_tools_without_parameters():
  assert calls.parse_turn('<tool_call>{"name": "finish"}</tool_call>', "call", TOOLS) == \
      calls.Call("finish", {})


def test_an_eos_turn_without_a_call_is_a_final_answer():
  assert calls.parse_turn("the answer is 4", "eos", TOOLS) is None


@pytest.mark.parametrize("text, ended, message", [
    ('<tool_call>{"name": "bash", "arguments": {"command": "ls"}', "length", "token limit"),
    ('{"name": "bash"}</tool_call>', "call", "without <tool_call>"),
    ('<tool_call>{"name": "bash", "arguments": {"command": "ls"</tool_call>', "call",
     "not valid JSON"),
    ("<tool_call>" + "[" * 100000 + "</tool_call>", "call", "not valid JSON"),
    ('<tool_call>["bash"]</tool_call>', "call", "JSON object"),
    ('<tool_call>{"arguments": {}}</tool_call>', "call", "JSON object"),
    ('<tool_call>{"name": "bash", "arguments": {}, "id": 3}</tool_call>', "call",
     "unknown keys ['id']"),
    ('<tool_call>{"name": "bash", "arguments": "ls"}</tool_call>', "call", "JSON object"),
])
def test_malformed_calls_are_errors_not_crashes(text, ended, message):
  with pytest.raises(calls.CallError, match=message.replace("[", r"\[").replace("]", r"\]")):
    calls.parse_turn(text, ended, TOOLS)


def test_an_unknown_tool_names_the_known_ones():
  with pytest.raises(calls.CallError) as e:
    calls.parse_turn(call({"name": "rm_rf", "arguments": {}}), "call", TOOLS)
  assert "unknown tool 'rm_rf'" in str(e.value)
  assert all(name in str(e.value) for name in tools.TOOLS)


@pytest.mark.parametrize("arguments, message", [
    ({}, r"missing required \['command'\]"),
    ({"command": 3}, "command must be a string"),
    ({"command": "ls", "cwd": "/"}, r"unknown \['cwd'\]"),
])
def test_wrong_bash_arguments(arguments, message):
  with pytest.raises(calls.CallError, match=message):
    calls.parse_turn(call({"name": "bash", "arguments": arguments}), "call", TOOLS)


@pytest.mark.parametrize("arguments, message", [
    ({"command": "delete", "path": "a"}, r"command must be one of \['view', 'create'"),
    ({"command": "insert", "path": "a", "insert_line": "3", "new_str": "x"},
     "insert_line must be an integer"),
    ({"command": "insert", "path": "a", "insert_line": True, "new_str": "x"},
     "insert_line must be an integer"),
    ({"command": "view", "path": "a", "view_range": [1, "2"]},
     r"view_range\[1\] must be an integer"),
])
def test_wrong_editor_arguments(arguments, message):
  with pytest.raises(calls.CallError, match=message):
    calls.parse_turn(call({"name": "editor", "arguments": arguments}), "call", TOOLS)


def test_every_tool_has_a_function_schema():
  for tool in TOOLS.values():
    schema = tool.schema()
    assert schema["type"] == "function"
    assert schema["function"]["name"] == tool.name
    assert schema["function"]["parameters"]["type"] == "object"
    assert schema["function"]["description"]


def test_make_tools_checks_names():
  with pytest.raises(UnknownKey, match="unknown \\['grep'\\]"):
    tools.make_tools(("bash", "grep", "finish"))
  with pytest.raises(UnknownKey, match="must include 'finish'"):
    tools.make_tools(("bash",))


def test_tool_tokenizer_keeps_tags_as_single_tokens_and_round_trips():
  tok = load_tokenizer("bytes+tools")
  assert tok.specials == TOOL_SPECIALS and tok.vocab_size == 259 + len(TOOL_SPECIALS)
  text = 'say <tool_call>{"name": "finish"}</tool_call><tool_response>ok</tool_response>'
  ids = tok.encode(text)
  assert ids[0] == tok.bos_id
  assert ids.count(tok.special_id("<tool_call>")) == 1
  assert tok.special_id("</tool_call>") == 260
  assert len(ids) == 1 + len(text.encode()) - sum(len(s) - 1 for s in TOOL_SPECIALS)
  assert tok.decode(ids) == text
  plain = ByteTokenizer()
  assert plain.special_id("</tool_call>") is None
  assert plain.decode(plain.encode("<tool_call>")) == "<tool_call>"


def test_chat_format_needs_the_closing_tag_as_one_token():
  with pytest.raises(BadInput, match="no single token for '</tool_call>'"):
    chat.ChatFormat("compact", ByteTokenizer())
  with pytest.raises(BadInput, match="known: \\['compact', 'hermes', 'template'\\]"):
    chat.ChatFormat("chatml", load_tokenizer("bytes+tools"))


def test_prompts_list_the_tools():
  tok = load_tokenizer("bytes+tools")
  listed = tools.make_tools(("bash", "finish"))
  compact = chat.ChatFormat("compact", tok).prompt_text(listed, "do it")
  assert compact == "tools: bash, finish\ntask: do it\n"
  hermes = chat.ChatFormat("hermes", tok).prompt_text(listed, "do it")
  assert hermes.startswith("<|im_start|>system\n") and "<tools>\n" in hermes
  schemas = hermes.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()
  assert [json.loads(s)["function"]["name"] for s in schemas] == ["bash", "finish"]
  assert hermes.endswith("<|im_start|>user\ndo it<|im_end|>\n<|im_start|>assistant\n")


def test_observations_are_cut_in_the_middle_to_their_budget():
  tok = load_tokenizer("bytes+tools")
  fmt = chat.ChatFormat("compact", tok)
  short, cut = fmt.observation_tokens("hello", 64)
  assert not cut and tok.decode(short) == "<tool_response>hello</tool_response>"
  text = "HEAD" + "x" * 5000 + "TAIL"
  ids, cut = fmt.observation_tokens(text, 64)
  assert cut
  body = ids[1:-1]  # without the two tags
  assert len(body) <= 64
  decoded = tok.decode(body)
  assert decoded.startswith("HEAD") and decoded.endswith("TAIL")
  head, _, rest = decoded.partition("\n[... ")
  count, _, tail = rest.partition(" tokens cut ...]\n")
  assert len(head) + int(count) + len(tail) == len(text)
