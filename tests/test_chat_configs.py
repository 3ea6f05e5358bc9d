"""The configs for chat checkpoints run end to end on tiny stand-ins, through the template.

configs/chat_grpo.py trains Hub checkpoints (Qwen2.5-Coder-Instruct, Qwen3) through their
chat templates. Here each runs two GRPO steps on CPU with a tiny random checkpoint of the
same family (tests/data) and a tokenizer with a ChatML template (tests/tiny_hf.py): the
prompts are the template's rendering, token for token as transformers renders and
tokenises them, and the answers' code blocks are scored by the tests in the sandbox.
"""

import json
import os

import pytest

import tiny_hf
from rlcode import cli
from rlcode.config import loader
from rlcode.data import chat_prompts, sources
from rlcode.models import load_tokenizer
from rlcode.rewards import tests as tests_reward

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "chat_grpo.py")
STAND_INS = {"qwen2.5-coder-0.5b": os.path.join(ROOT, "tests", "data", "qwen2_tiny"),
             "qwen3-1.7b": "qwen3"}
SMALL = ["--config.model.param_dtype=float32", "--config.model.dtype=float32",
         "--config.rl.group_size=2", "--config.rl.prompts_per_step=2",
         "--config.rl.max_new_tokens=16", "--config.train.steps=2",
         "--config.train.checkpoint_every=2", "--config.train.eval_every=0",
         "--config.train.progress_bar=false", "--config.eval.max_new_tokens=16"]


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


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3-1.7b"])  # the Qwen2 stand-in's family: test_model_families
def test_two_grpo_steps_on_a_stand_in(name, tmp_path):
  base = tiny_hf.checkpoint(STAND_INS[name], tmp_path, max_positions=2048)
  workdir = str(tmp_path / "run")
  assert cli.main(["train", "--config", f"{CONFIG}:{name}", f"--config.model.hf_path={base}",
                   f"--config.workdir={workdir}", *SMALL]) == 0
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  steps = [r for r in rows if "loss" in r]
  assert [r["step"] for r in steps] == [1, 2]
  assert all("reward_mean" in r and r["completion_len"] > 0 for r in steps)
