"""Harness rollouts for GRPO (rlcode.harness.rollouts): a tiny random policy served in this
process (rlcode.serve.local.LocalServer: the real app under uvicorn on 127.0.0.1), toy
harnesses written here that talk to it with the openai client, a toy environment's reward.

One rollout plays G episodes of four tasks: a two-call agent whose second call extends the
first's history (one segment), an agent that rewrites its history (two segments, a
split), a task where one episode's harness raises after its first call, and a task whose
harness never calls (no calls). The last two groups are dropped whole and counted; every
trained token is one the policy sampled, with the log-prob the server returned; one GRPO
update on the batch changes the parameters, and the new weights are served as version 1.
"""

import collections
import threading
import time

import jax
import numpy as np
import pytest

from rlcode.harness import rollouts

G = 3
CHOICES = ["ls", "pwd", "cat", "make"]
# The reply is one of a few ASCII words (a JSON string under a schema), so the chat
# template renders it back as the very tokens that were sampled.
FORMAT = {"type": "json_schema",
          "json_schema": {"name": "cmd", "schema": {"type": "string", "enum": CHOICES}}}
MODEL = "rlcode-tiny"


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
  import serving
  from chat_templates import write_tokenizer_dir
  from rlcode.serve.local import LocalServer
  from rlcode.models import chat_template
  from rlcode.models.build import build_model
  from rlcode.parallel import sharding
  workdir = str(tmp_path_factory.mktemp("harness_rollouts"))
  cfg = serving.config(workdir)
  mesh = sharding.make_mesh()
  model, tokenizer = build_model(cfg.model, mesh, cfg.seed)
  template = chat_template.load_chat_template(write_tokenizer_dir(f"{workdir}/t", "chatml"))
  with LocalServer(model, tokenizer, template=template, api_key="k-0123456789", name=MODEL,
                   serve={"slots": 8}) as server:
    yield server, model, tokenizer, mesh


def _client(base_url, api_key, episode_id):
  import openai
  return openai.OpenAI(base_url=base_url, api_key=api_key, timeout=120, max_retries=0,
                       default_headers={"X-Episode-Id": episode_id})


def _ask(client, messages):
  r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,
                                     temperature=1.0, logprobs=True, response_format=FORMAT)
  return r


def _reply(r):
  return {"role": "assistant", "content": r.choices[0].message.content}


class Harness:
  """The toy agents, by the task's kind; each returns {"answer", "replies"}."""

  def __init__(self):
    self.lock, self.seen = threading.Lock(), collections.Counter()

  def __call__(self, task, base_url, api_key, episode_id):
    kind = task["kind"]
    with self.lock:
      self.seen[kind] += 1
      first_of_kind = self.seen[kind] == 1
    if kind == "silent":
      return {"answer": None, "replies": []}  # an environment that never asked the policy
    client = _client(base_url, api_key, episode_id)
    messages = [{"role": "user", "content": task["prompt"]}]
    r1 = _ask(client, messages)
    if kind == "flaky" and first_of_kind:
      raise ConnectionError("the sandbox went away")
    if kind == "rewrite":  # the first reply left out of the history: a new segment
      messages = messages + [{"role": "user", "content": "again, briefly"}]
    else:  # the history grows: the second call extends the first
      messages = messages + [_reply(r1), {"role": "user", "content": "exit 0"}]
    r2 = _ask(client, messages)
    return {"answer": r2.choices[0].message.content, "replies": [r1, r2]}


def reward(task, result):
  """The toy environment: how far down the list the final command is (a graded reward),
  with the first reply's log-prob as a tie-break (so a group's rewards differ)."""
  answer = result["answer"].strip('"')
  first = sum(e.logprob for e in result["replies"][0].choices[0].logprobs.content)
  return CHOICES.index(answer) / 3 + 1e-3 * first


TASKS = [{"id": "grow", "kind": "grow", "prompt": "List the files."},
         {"id": "rewrite", "kind": "rewrite", "prompt": "Where am I?"},
         {"id": "flaky", "kind": "flaky", "prompt": "Build it."},
         {"id": "silent", "kind": "silent", "prompt": "Nothing."}]


def test_a_step_of_harness_rollouts_trains_what_the_policy_sampled(policy):
  from flax import nnx

  from rlcode import optim
  from rlcode.rl import objective, shared_prefix
  server, model, tokenizer, mesh = policy
  ro = rollouts.rollout(Harness(), TASKS, G, server, reward=reward, pad_id=tokenizer.pad_id,
                        max_len=model.cfg.max_seq_len, workers=4)
  # Groups of G, task-major; the flaky and silent groups dropped whole, counted.
  assert [(p.group, p.index) for p in ro.episodes] == [(g, i) for g in range(4) for i in range(G)]
  assert ro.kept == [0, 1]
  m = ro.metrics
  assert m["episodes"] == 4 * G and m["groups"] == 4 and m["dropped_groups"] == 2
  assert m["failed_episodes"] == G + 1
  assert m["failed/error"] == 1 and m["failed/no_calls"] == G and m["failed/timeout"] == 0
  failed = [p for p in ro.episodes if p.failure]
  assert all(not p.segments for p in failed)
  assert "ConnectionError: the sandbox went away" in [p.error for p in failed]
  # The growing agent is one segment, the rewriting one two (a split each).
  by_task = {t["id"]: [p for p in ro.episodes if p.task is t] for t in TASKS}
  assert [len(p.segments) for p in by_task["grow"]] == [1] * G
  assert [len(p.segments) for p in by_task["rewrite"]] == [2] * G
  assert m["splits/prefix_mismatch"] == G and m["splits/shorter_prompt"] == 0
  ok = 3 * G - 1  # the flaky group's other episodes (one segment each) did not fail
  assert m["segments_per_episode"] == pytest.approx((G + 2 * G + (G - 1)) / ok)
  assert m["calls_per_episode"] == 2 and m["cached_prefix_tokens"] >= 0
  assert len(ro.rewards) == len(ro.adv) == 2 * G

  # Every trained token is one the policy sampled, with the log-prob the server returned,
  # in the order the calls were made; each row's context is its segment's.
  batch = ro.batch
  mask, tokens = np.asarray(batch.mask), np.asarray(batch.completion_tokens)
  old, adv = np.asarray(batch.old_logp), np.asarray(batch.adv)
  rows_per_group = len(adv) // len(batch.prompt_lengths)
  trained = collections.defaultdict(list)
  for r, where in enumerate(ro.rows):
    if where is None:
      assert not mask[r].any() and adv[r] == 0
      continue
    e, s = where
    p = ro.episodes[e]
    assert p.group in ro.kept and p.failure is None
    seg = p.segments[s]
    g = r // rows_per_group
    prompt = list(np.asarray(batch.prompt_tokens)[g, :int(batch.prompt_lengths[g])])
    n = len(seg.prompt) + len(seg.tokens) - len(prompt)
    assert prompt + list(tokens[r, :n]) == seg.prompt + seg.tokens
    assert mask[r, n:].sum() == 0 and adv[r] == ro.adv[ro.kept.index(p.group) * G + p.index]
    trained[e] += [(int(t), float(lp)) for t, lp, k in zip(tokens[r], old[r], mask[r]) if k]
  assert trained and sum(len(v) for v in trained.values()) == m["trained_tokens"]
  for e, got in trained.items():
    served = [x for reply in ro.episodes[e].result["replies"]
              for x in reply.choices[0].logprobs.content]
    assert len(got) == len(served)
    for (token, lp), entry in zip(got, served):
      assert tokenizer.token_bytes(token) == bytes(entry.bytes)
      assert lp == np.float32(entry.logprob)

  # One GRPO update on the batch moves the parameters; the server samples with them next.
  graphdef, _ = nnx.split(model, nnx.Param)
  optimizer = optim.make_optimizer(optim.OptimizerConfig(learning_rate=1e-2, warmup_steps=0,
                                                            decay_steps=10))
  state = optim.init_state(model, optimizer, mesh)
  before = jax.device_get(state.params)
  update = shared_prefix.update_step(graphdef, optimizer, objective.LossConfig(), mesh, state,
                                     batch)
  state, out = update(state, batch)
  out = jax.device_get(out)
  assert not out["skipped"] and np.isfinite(out["loss"]) and out["grad_norm"] > 0
  moved = jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != b)),
                                       jax.device_get(state.params), before))
  assert any(moved)
  server.publish(nnx.merge(graphdef, state.params), 1)
  reply = _ask(_client(server.base_url, server.api_key, "after-update"),
               [{"role": "user", "content": "hi"}])
  assert reply.model_extra["policy_version"] == 1


def test_every_episode_failing_is_an_error_naming_why(policy):
  server, model, tokenizer, _ = policy

  def broken(task, base_url, api_key, episode_id):
    raise KeyError("OPENAI_BASE_URL")

  with pytest.raises(rollouts.AllFailed, match=r"every one of the 4 harness episodes failed "
                     r"\(error: 4\); the first: KeyError: 'OPENAI_BASE_URL'"):
    rollouts.rollout(broken, TASKS[:2], 2, server, pad_id=0, max_len=model.cfg.max_seq_len)
  # A harness whose result carries no reward, and no reward function: the reward's failure.
  def no_reward(task, base_url, api_key, episode_id):
    _ask(_client(base_url, api_key, episode_id), [{"role": "user", "content": "x"}])
    return ["not", "a", "reward"]

  with pytest.raises(rollouts.AllFailed, match="reward: 1.*the harness returned a list"):
    rollouts.rollout(no_reward, TASKS[:1], 1, server, pad_id=0, max_len=model.cfg.max_seq_len)
  with pytest.raises(TypeError, match="the harness is a str, not a callable"):
    rollouts.rollout("mod:fn", TASKS[:1], 1, server, pad_id=0, max_len=1)
  with pytest.raises(ValueError, match="group_size=0"):
    rollouts.rollout(no_reward, TASKS[:1], 0, server, pad_id=0, max_len=1)


def test_rewards_from_the_environment_result():
  assert rollouts.reward_of(None, 0.5) == 0.5
  assert rollouts.reward_of(None, {"reward": 1}) == 1.0
  assert rollouts.reward_of(None, type("R", (), {"reward": -2.0})()) == -2.0
  assert rollouts.reward_of("t", "x", lambda task, result: 3) == 3.0
  for bad, said in ((None, "carries no reward"), ({"reward": "1"}, "not a number"),
                    (float("nan"), "not a finite number"), (True, "carries no reward")):
    with pytest.raises(ValueError, match=said):
      rollouts.reward_of(None, bad)


def test_a_job_past_the_timeout_is_given_up_and_frees_its_place():
  gate = threading.Event()
  jobs = [gate.wait, lambda: 1, lambda: 2, lambda: 1 / 0]
  start = time.monotonic()
  out = rollouts.run_bounded(jobs, workers=1, timeout=0.3)
  gate.set()
  assert time.monotonic() - start < 10
  assert isinstance(out[0][1], TimeoutError) and out[0][2] >= 0.3
  assert [o[0] for o in out[1:3]] == [1, 2]
  assert isinstance(out[3][1], ZeroDivisionError)
  with pytest.raises(ValueError, match="workers=0"):
    rollouts.run_bounded(jobs, workers=0, timeout=None)
