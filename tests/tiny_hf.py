"""Tiny Hugging Face checkpoints with a tokenizer and a chat template, made at test time.

tests/data/hf holds weights and transformers' outputs (make_refs.py); a run also needs a
tokenizer. `checkpoint(case, tmp)` copies a case and adds a character-level tokenizer.json
whose vocabulary fits the tiny models (128 entries: printable ASCII, newline, tab, the
ChatML and tool-call markers) and a tokenizer_config.json with a ChatML template, as
Qwen's checkpoints carry them.
"""

import json
import os
import shutil

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
            "<tool_response>", "</tool_response>"]
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def tokenizer_json(path: str) -> None:
  """A character-level tokenizer.json: ids 0-6 the specials, then <unk>, tab, newline and
  printable ASCII (121 characters in all)."""
  from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
  chars = ["\t", "\n"] + [chr(c) for c in range(32, 127)]
  vocab = {s: i for i, s in enumerate(SPECIALS)}
  vocab["<unk>"] = len(vocab)
  vocab.update({c: len(vocab) + i for i, c in enumerate(chars)})
  tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
  tok.decoder = decoders.Fuse()
  tok.add_special_tokens([AddedToken(s, normalized=False) for s in SPECIALS[:3]])
  tok.add_tokens([AddedToken(s, normalized=False) for s in SPECIALS[3:]])
  tok.save(path)


def checkpoint(case: str, tmp, max_positions: int | None = None) -> str:
  """A copy of tests/data/hf/`case` (or of the directory `case` names) with a tokenizer
  and a chat template; max_positions: the context it declares, if not its own."""
  src = case if os.path.isdir(case) else os.path.join(HERE, case)
  out = os.path.join(str(tmp), os.path.basename(src.rstrip("/")))
  shutil.copytree(src, out)
  if max_positions is not None:
    path = os.path.join(out, "config.json")
    config = json.load(open(path))
    config["max_position_embeddings"] = max_positions
    json.dump(config, open(path, "w"))
  tokenizer_json(os.path.join(out, "tokenizer.json"))
  with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
               "pad_token": "<|endoftext|>", "bos_token": None, "chat_template": CHATML}, f)
  return out
