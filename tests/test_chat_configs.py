"""The configs for chat checkpoints run end to end on tiny stand-ins, through the template.

configs/chat_grpo.py trains Hub checkpoints (Qwen2.5-Coder-Instruct, Qwen3) through their
chat templates. Here a tiny random checkpoint of the family (tests/tiny_hf.py) with a ChatML
template stands in: the prompts are the template's rendering, token for token as
transformers renders and tokenises them, and the answers' code blocks are what the tests
score. Two GRPO steps of the README's command on that stand-in run in
tests/test_readme_commands.py.
"""

import os

import tiny_hf
from rlcode.config import loader
from rlcode.data import chat_prompts, sources
from rlcode.models import load_tokenizer
from rlcode.rewards import tests as tests_reward

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "chat_grpo.py")



def test_chat_tasks_render_as_transformers_does(tmp_path):
  import transformers  # the dev extra (a missing package fails, never skips)
  base = tiny_hf.checkpoint("qwen3", tmp_path, max_positions=2048)
  tokenizer = load_tokenizer(base)
  task = sources.load(loader.load_config(CONFIG).data, "train")[0]
  chat = chat_prompts.as_chat(task, tokenizer.chat_template)
  theirs = transformers.AutoTokenizer.from_pretrained(base)
  user = chat_prompts.INSTRUCTION.format(head=task.prompt)
  want = theirs.apply_chat_template([{"role": "user", "content": user}], tokenize=True,
                                    add_generation_prompt=True)
  want = list(want["input_ids"] if hasattr(want, "keys") else want)
  assert chat_prompts.prompt_ids(tokenizer, chat) == want
  # The answer's block, after the head's imports, is what the tests run.
  answer = f"Here it is:\n```python\n{task.prompt}{task.reference}\n```\nDone."
  program = tests_reward.assemble_program(chat, answer)
  assert task.reference in program and "Here it is" not in program
