"""tools/config_walk.py: how far the config travels from `rlcode train` to the update.

The walk over this repository reaches the jitted update within the house's bound and finds
no function below the commands and loops that takes the whole config; on a small package
written here, its stops, climbs and whole-config findings are the ones counted by hand.
"""

import importlib.util
import os
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_spec = importlib.util.spec_from_file_location("config_walk",
                                               os.path.join(ROOT, "tools", "config_walk.py"))
config_walk = importlib.util.module_from_spec(_spec)
sys.modules["config_walk"] = config_walk  # its dataclasses look their module up
_spec.loader.exec_module(config_walk)


def test_the_walk_reaches_the_update_and_no_library_function_takes_the_whole_config():
  modules = config_walk.load_modules()
  found = config_walk.walk_to_update(modules)
  assert found is not None, "the walk from rlcode train no longer reaches the update"
  assert found["stops"] <= 40, "\n".join(found["trace"])
  assert found["climbs"] <= 12, "\n".join(found["trace"])
  assert found["trace"][0] == "rlcode.cli._train(config=whole)"
  assert found["trace"][-1].strip() == "rlcode.rl.grpo.make_update_step()"
  assert config_walk.whole_config_functions(modules) == []


def _package(root, files):
  for name, text in files.items():
    path = os.path.join(root, "rlcode", *name.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      f.write(textwrap.dedent(text))


def test_stops_climbs_and_whole_config_functions_of_a_small_package(tmp_path):
  _package(str(tmp_path), {
      "__init__.py": "",
      "cli.py": """
          from rlcode.config import loader

          def main():
            config = loader.load_config("x")
            _train(config, None)

          def _train(config, args):
            from rlcode.train import loop
            loop.train(config)
          """,
      "config/__init__.py": "",
      "config/loader.py": "def load_config(path):\n  return path\n",
      "train/__init__.py": "",
      "train/loop.py": """
          from rlcode.lib import helpers, sections
          from rlcode.rl import grpo

          def train(config):
            rl = config.rl
            sections.of_rl(rl, rl.group_size)   # a section: a stop
            helpers.leaky(config)               # the whole config: a stop, and a finding
            helpers.field_only(rl.group_size)   # a field: no stop
            grpo.make_update_step(1)            # the target
            helpers.after(config)               # never read: the walk has ended
          """,
      "lib/__init__.py": "",
      "lib/sections.py": """
          def of_rl(rl, size):
            return _inner(rl)

          def _inner(rl):
            return rl
          """,
      "lib/helpers.py": """
          from rlcode.lib import sections

          def leaky(config):
            return sections.of_rl(config.rl, 1)

          def field_only(n):
            return n

          def after(config):
            return config
          """,
      "rl/__init__.py": "",
      "rl/grpo.py": "def make_update_step(x):\n  return x\n",
  })
  modules = config_walk.load_modules(str(tmp_path))
  found = config_walk.walk_to_update(modules)
  assert [line.strip() for line in found["trace"]] == [
      "rlcode.cli._train(config=whole)",
      "rlcode.train.loop.train(config=whole)",
      "rlcode.lib.sections.of_rl(rl=section)",
      "rlcode.lib.sections._inner(rl=section)",
      "rlcode.lib.helpers.leaky(config=whole)",  # of_rl again: read once
      "rlcode.rl.grpo.make_update_step()",
  ]
  # Back to the loop from sections.py (for leaky), and from helpers.py (for the update):
  # _inner follows of_rl inside one file, which is no climb.
  assert (found["stops"], found["files"], found["climbs"]) == (6, 5, 2)
  # Past the update, `after` takes the whole config too.
  assert config_walk.whole_config_functions(modules) == ["rlcode.lib.helpers.after",
                                                         "rlcode.lib.helpers.leaky"]
