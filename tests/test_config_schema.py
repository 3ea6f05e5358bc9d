"""The config schema: every shipped config resolves through it, every key is documented,
and an unknown key, a wrong type or a value out of range is one line naming the key."""

import dataclasses
import json
import os

import ml_collections
import pytest

from rlcode import cli
from rlcode import fields
from rlcode.config import describe, loader, record, schema
from rlcode.errors import BadInput, UnknownKey

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(n for n in os.listdir(os.path.join(ROOT, "configs"))
                 if n.endswith(".py") and n != "common.py")
GRPO = os.path.join(ROOT, "configs", "grpo_tiny.py")
AGENT = os.path.join(ROOT, "configs", "agent_tiny.py")


@pytest.mark.parametrize("name", CONFIGS)
def test_every_shipped_config_resolves_and_declares_its_trainer(name):
  raw = loader.read_config_file(os.path.join(ROOT, "configs", name))
  assert raw.trainer in schema.TRAINERS
  config = loader.load_config(os.path.join(ROOT, "configs", name))
  assert set(config.keys()) == set(schema.TRAINER_SECTIONS[config.trainer])
  # Resolving is idempotent: a resolved (or recorded) config resolves to itself.
  assert loader.resolve(config).to_dict() == config.to_dict()
  assert loader.resolve(record.plain(config)).to_dict() == config.to_dict()


def _sections(cls, seen=None):
  seen = set() if seen is None else seen
  if cls in seen:
    return seen
  seen.add(cls)
  for f in dataclasses.fields(cls):
    inner, _ = fields.optional_of(fields.hints(cls)[f.name])
    if fields.is_section(inner):
      _sections(inner, seen)
  return seen


def test_every_key_has_a_doc_and_every_doc_a_key():
  for cls in _sections(schema.Config):
    names = set(loader.keys_of(cls))
    docs = fields.docs(cls)
    assert names <= set(docs), (cls.__name__, sorted(names - set(docs)))
    assert set(docs) <= {f.name for f in dataclasses.fields(cls)}, (
        cls.__name__, sorted(set(docs) - names))
    assert all(docs[n].strip() for n in names), cls.__name__


@pytest.mark.parametrize("flag, needles", [
    ("--config.rl.grup_size=4", ("--config.rl.grup_size", "rl has no key 'grup_size'",
                                 "valid keys", "group_size")),
    ("--config.rl.group_size=many", ("--config.rl.group_size='many'", "cannot parse as int")),
    ("--config.rl.group_size=0", ("config.rl.group_size=0", "must be >= 1")),
    ("--config.rl.clip_eps_low=-1", ("config.rl.clip_eps_low=-1.0", ">= 0")),
    ("--config.rl.negative_weight=2", ("config.rl.negative_weight=2.0", "in [0, 1]")),
    ("--config.rl.advantage=ppo", ("config.rl.advantage='ppo'", "'grpo', 'dr_grpo'")),
    ("--config.rl.log_kl=maybe", ("--config.rl.log_kl='maybe'", "boolean")),
    ("--config.eval.ks=1", ("config.eval.ks=1", "tuple")),
    ("--config.optimizer.learning_rate=0", ("config.optimizer.learning_rate=0.0", "> 0")),
    ("--config.warmstart.optimizer.schedule=linear",
     ("config.warmstart.optimizer.schedule='linear'", "'cosine', 'wsd'")),
    ("--config.model.attn_impl=flash", ("config.model.attn_impl='flash'", "'xla'")),
    ("--config.rewards.test=1.0", ("config.rewards.test", "no such reward", "'tests'")),
    ("--config.rl.expert_slots=2", ("config.rl.expert_slots", "agent trainer only")),
    ("--config.agent.max_turns=3", ("config.agent", "reads no 'agent'")),
    ("--config.mesh.data=0", ("config.mesh.data=0", "-1 or >= 1")),
    ("--config.reward_options.tests.mode=most", ("config.reward_options.tests.mode='most'",
                                                 "'all', 'fraction'")),
    ("--config.reward_options.tests.timeout=3", ("reward_options.tests", "'timeout'")),
    ("--config.reward_options.tests.limits.wall_seconds=x",
     ("config.reward_options.tests.limits.wall_seconds", "float")),
    ("--config.reward_options.semantic.lexical_weight=2",
     ("config.reward_options.semantic.lexical_weight=2.0", "in [0, 1]")),
])
def test_a_bad_key_type_or_value_is_one_line_naming_the_key(capsys, flag, needles):
  assert cli.main(["config", "show", GRPO, flag]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "Traceback" not in err, err
  for needle in needles:
    assert needle in err, (needle, err)


@pytest.mark.parametrize("flag, needle", [
    ("--config.rl.sample_rounds=0", "config.rl.sample_rounds=0: must be >= 1"),
    ("--config.rl.curriculum=hard", "config.rl.curriculum='hard'"),
    ("--config.rl.curriculum_decay=1.0", "config.rl.curriculum_decay=1.0: must be in [0, 1)"),
    ("--config.rl.exclude_task_ids=(practice", "not a regular expression"),
    ("--config.rl.expert_slots=8", "rl.expert_slots=8 must be < rl.group_size=8"),
    ("--config.agent.guess_families=('file','serach')", "'file', 'search', 'tests'"),
    ("--config.agent.decoy_copy=1.5", "config.agent.decoy_copy=1.5: must be in [0, 1]"),
    ("--config.agent.note_trust=-0.1", "config.agent.note_trust=-0.1"),
    ("--config.agent.tools=('editor',)", "with 'finish'"),
    ("--config.agent.memory_rule=forever", "'dedupe'"),
    ("--config.warmstart.bucket=4", "grpo trainer only"),
])
def test_the_agent_settings_are_checked_at_load(capsys, flag, needle):
  assert cli.main(["config", "show", AGENT, flag]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and needle in err, err


def test_a_file_setting_an_unknown_or_unread_key_is_named():
  raw = loader.read_config_file(GRPO)
  with raw.unlocked():
    raw.rl.grup_size = 4
  with pytest.raises(UnknownKey, match=r"config.rl.grup_size: rl has no key 'grup_size'"):
    loader.resolve(raw)
  raw = loader.read_config_file(GRPO)
  with raw.unlocked():
    raw.rm = ml_collections.ConfigDict({"pooling": "mean"})
  with pytest.raises(BadInput, match="the 'grpo' trainer reads no 'rm'"):
    loader.resolve(raw)
  raw = loader.read_config_file(GRPO)
  with raw.unlocked():
    del raw["trainer"]
  with pytest.raises(BadInput, match="config.trainer is not set"):
    loader.resolve(raw)


def test_a_run_recorded_before_keys_moved_resumes_and_reads_as_today(tmp_path):
  """An agent run recorded with the demonstrator's knobs in the warm start section (the
  older schema) reads with them in the agent section, and resumes under today's config."""
  config = loader.load_config(AGENT, ["--config.agent.demo_tasks=8",
                                      f"--config.workdir={tmp_path}"])
  path = record.write_run_config(config, str(tmp_path))
  old = record._read_json(path)
  for key in ("guess_fraction", "guess_families", "decoy_copy", "note_trust"):
    old["warmstart"][key] = old["agent"].pop(key)
  old["warmstart"]["max_episodes"] = old["agent"].pop("demo_tasks")
  with open(path, "w") as f:
    json.dump(old, f)
  assert "note_trust" in json.load(open(path))["warmstart"]
  recorded = record.recorded_config(str(tmp_path))
  assert recorded.agent.note_trust == 0.7 and recorded.agent.demo_tasks == 8
  assert "note_trust" not in recorded.warmstart
  record.check_resume(config, str(tmp_path))  # the same run: nothing differs
  with pytest.raises(BadInput, match="agent.note_trust: 0.7 -> 0.5"):
    record.check_resume(loader.load_config(AGENT, ["--config.agent.demo_tasks=8",
                                                   "--config.agent.note_trust=0.5",
                                                   f"--config.workdir={tmp_path}"]),
                        str(tmp_path))
  # A GRPO run recorded then held the same keys at their defaults, unread: they go.
  grpo = loader.load_config(GRPO, [f"--config.workdir={tmp_path / 'grpo'}"])
  path = record.write_run_config(grpo, str(tmp_path / "grpo"))
  old = record._read_json(path)
  old["warmstart"].update(max_episodes=None, guess_fraction=0.0, guess_families=[],
                          decoy_copy=0.0, note_trust=0.0)
  with open(path, "w") as f:
    json.dump(old, f)
  assert "agent" not in record.recorded_config(str(tmp_path / "grpo"))
  record.check_resume(grpo, str(tmp_path / "grpo"))


def test_derived_keys_follow_what_they_derive_from_unless_set():
  config = loader.load_config(GRPO, ["--config.train.steps=7", "--config.warmstart.steps=9"])
  assert config.optimizer.decay_steps == 7 and config.warmstart.optimizer.decay_steps == 9
  assert config.eval.max_new_tokens == config.rl.max_new_tokens == 40
  config = loader.load_config(GRPO, ["--config.train.steps=7",
                                     "--config.optimizer.decay_steps=100"])
  assert config.optimizer.decay_steps == 100
  agent = loader.load_config(AGENT)
  assert agent.optimizer.decay_steps == 100 and agent.eval.max_new_tokens is None


def test_optional_sections_switch_off_and_on():
  diffs = os.path.join(ROOT, "configs", "grpo_diffs.py")
  assert loader.load_config(diffs, ["--config.warmstart.data=None"]).warmstart.data is None
  on = loader.load_config(GRPO, ["--config.warmstart.data.source=humaneval"])
  assert on.warmstart.data.source == "humaneval" and on.warmstart.data.train_split == "train"
  with pytest.raises(UnknownKey, match="is a group of keys"):
    loader.load_config(GRPO, ["--config.warmstart.data=3"])
  with pytest.raises(BadInput, match="data.mining is for source 'git'"):
    loader.load_config(GRPO, ["--config.data.mining.granularity=file"])


def test_a_sections_own_checks_name_the_section():
  with pytest.raises(BadInput, match=r"config.model.arch: num_heads=4 is not a multiple of "
                                     r"num_kv_heads=3"):
    loader.load_config(GRPO, ["--config.model.arch.num_kv_heads=3"])
  with pytest.raises(BadInput, match=r"config.optimizer: optimizer.cooldown_steps=0 must be in"):
    loader.load_config(GRPO, ["--config.optimizer.schedule=wsd"])


def test_overrides_reach_references_of_the_file():
  # grpo_diffs' practice data follows config.data.mining through get_ref.
  diffs = os.path.join(ROOT, "configs", "grpo_diffs.py")
  config = loader.load_config(diffs, ["--config.data.mining.line_numbers=file"])
  assert config.warmstart.data.mining.line_numbers == "file"


def test_keys_lists_every_key_with_its_doc_and_show_every_value(capsys):
  keys = describe.keys()
  paths = [k.path for k in keys]
  assert len(paths) == len(set(paths)) and "rl.group_size" in paths
  assert all(k.doc for k in keys)
  agent_only = {k.path for k in describe.keys("agent")} - {k.path for k in describe.keys("grpo")}
  assert "agent.max_turns" in agent_only and "rl.expert_slots" in agent_only
  assert cli.main(["config", "keys", "--trainer", "rm"]) == 0
  out = capsys.readouterr().out
  assert "rm.pooling" in out and "agent.tools" not in out
  assert cli.main(["config", "show", GRPO, "--config.rl.group_size=4"]) == 0
  out = capsys.readouterr().out
  # decay_steps, unset in the file, derived from train.steps (the default job's 90)
  assert "rl.group_size = 4\n" in out and "optimizer.decay_steps = 90\n" in out


@pytest.mark.parametrize("config, flag", [
    ("grpo_tiny.py", "--config.data.eval_split=held_out"),
    ("grpo_diffs.py", "--config.data.eval_split=test"),
    ("agent_tiny.py", "--config.data.eval_split=held_out"),
    ("agent_swe.py", "--config.data.eval_split=test"),
])
def test_a_training_loop_may_not_evaluate_on_a_held_out_split(capsys, config, flag):
  assert cli.main(["config", "show", os.path.join(ROOT, "configs", config), flag]) == 2
  err = capsys.readouterr().err
  split = flag.rsplit("=", 1)[1]
  assert err.count("\n") == 1 and "Traceback" not in err, err
  assert f"config.data: eval_split={split!r} is a held-out split" in err, err


def test_held_out_splits_stay_readable_where_they_belong():
  # Positive controls: the held-out split as data.test_split, and a reward model's choices.
  config = loader.load_config(GRPO, ["--config.data.test_split=held_out"])
  assert (config.data.eval_split, config.data.test_split) == ("validation", "held_out")
  rm = loader.load_config(os.path.join(ROOT, "configs", "rm_choices.py"),
                          ["--config.data.eval_split=held_out"])
  assert rm.data.eval_split == "held_out"
  swe = loader.load_config(os.path.join(ROOT, "configs", "agent_swe.py"))
  assert swe.data.eval_split == "validation" and swe.data.swe.validation_fraction > 0


def test_each_rewards_typed_options_are_its_functions_keywords_with_their_defaults():
  """config.reward_options.<reward> (rlcode.rewards.config) declares the keyword options
  of the reward's function, with the same defaults: a loaded section is what the function
  would use unset, the sandbox limits' defaults included."""
  import dataclasses
  import inspect

  from rlcode import rewards, sandbox
  from rlcode.rewards import config as reward_config
  loaded = loader.load_config(GRPO, [])
  kwargs = rewards.options(loaded.reward_options)
  assert sorted(kwargs) == sorted(f.name for f in dataclasses.fields(
      reward_config.RewardOptions))
  limits = {f.name: f.default for f in dataclasses.fields(sandbox.Limits)}
  for name, got in kwargs.items():
    params = inspect.signature(rewards.get(name)).parameters
    # (the semantic reward's `mesh` is a caller's device mesh, not a setting)
    declared = {k: p.default for k, p in params.items()
                if p.default is not p.empty and p.kind is not p.VAR_KEYWORD and k != "mesh"}
    takes_limits = any(p.kind is p.VAR_KEYWORD for p in params.values())
    assert set(got) == set(declared) | (set(limits) if takes_limits else set()), name
    for key, value in got.items():
      default = declared[key] if key in declared else limits[key]
      assert value == (tuple(default) if isinstance(default, (list, tuple)) else default), (
          name, key)
