"""Harness episodes as token-exact trajectories (rlcode.harness).

The segmenting on hand-made token sequences: a continuing episode is one segment; a harness
that edits a past turn, drops a turn, strips the reasoning of an earlier completion or
retries a call starts a new segment at that call, counted by reason; in every case the
mask-1 tokens are exactly the completions, each right after the prompt it was sampled on
(a check of every call, and a seeded random walk of edits). Segments go through
`grpo_batch` unchanged. Then `rlcode serve` with the openai client: three calls of one
episode continue one segment whose sampled tokens are the responses' own, a second
episode sees only its calls (and a rewrite splits it), bad ids and n > 1 are 400s.
"""

import concurrent.futures
import random

import httpx
import numpy as np
import pytest

from rlcode.harness import Recorder, Sample, check_id
from rlcode.harness import segments as seg_lib

P0 = [1, 2, 3, 4]  # the first prompt


def _sample(tokens, version=0):
  return Sample(tuple(tokens), tuple(-0.5 - 0.01 * t for t in tokens), (version,) * len(tokens),
                "stop")


def _play(calls, recorder=None, episode="ep"):
  """Records (prompt, completion) pairs as one episode; returns it."""
  recorder = recorder or Recorder()
  for i, (prompt, completion) in enumerate(calls):
    recorder.record(episode, f"call-{i}", prompt, [_sample(completion, version=i)])
  return recorder.get(episode)


def _assert_exact(ep, calls):
  """Each call's prompt is its segment's context up to prompt_tokens, its completion
  follows at once with mask 1, its log-probs and versions; nothing else has mask 1."""
  sampled = [0] * len(ep.segments)
  for i, ((prompt, completion), call) in enumerate(zip(calls, ep.calls)):
    seg = ep.segments[call.segment]
    assert i in seg.calls and call.prompt_tokens == len(prompt)
    context = seg.prompt + seg.tokens
    assert context[:len(prompt)] == list(prompt)
    at, end = len(prompt) - len(seg.prompt), len(prompt) - len(seg.prompt) + len(completion)
    assert at >= 0 and seg.tokens[at:end] == list(completion)
    assert seg.mask[at:end] == [1] * len(completion)
    assert seg.logprobs[at:end] == list(_sample(completion).logprobs)
    assert seg.versions[at:end] == [i] * len(completion)
    sampled[call.segment] += len(completion)
  for seg, n in zip(ep.segments, sampled):
    assert sum(seg.mask) == n
    assert len(seg.tokens) == len(seg.mask) == len(seg.logprobs) == len(seg.versions)
    assert all(lp == 0.0 and v == seg_lib.OBSERVED
               for m, lp, v in zip(seg.mask, seg.logprobs, seg.versions) if m == 0)


def _counts(mismatch=0, shorter=0):
  return {seg_lib.PREFIX_MISMATCH: mismatch, seg_lib.SHORTER_PROMPT: shorter}


def test_a_continuing_episode_is_one_segment():
  c0, o1, c1, o2, c2 = [10, 11], [5, 6, 7], [12], [8], [13, 14, 15]
  p1 = P0 + c0 + o1
  p2 = p1 + c1 + o2
  calls = [(P0, c0), (p1, c1), (p2, c2)]
  ep = _play(calls)
  (seg,) = ep.segments
  assert seg.prompt == P0
  assert seg.tokens == c0 + o1 + c1 + o2 + c2
  assert seg.mask == [1, 1, 0, 0, 0, 1, 0, 1, 1, 1]
  assert seg.versions == [0, 0, -1, -1, -1, 1, -1, 2, 2, 2]
  assert seg.calls == [0, 1, 2] and ep.splits == [] and ep.split_counts() == _counts()
  _assert_exact(ep, calls)
  # A call whose prompt is exactly the context (no observation) continues too.
  ep = _play(calls + [(p2 + c2, [16])])
  assert len(ep.segments) == 1 and ep.segments[0].tokens[-2:] == [15, 16]


def test_a_harness_that_edits_a_past_turn_starts_a_segment():
  c0, o1, c1 = [10, 11], [5, 6, 7], [12]
  p1 = P0 + c0 + o1
  edited = P0 + c0 + [5, 9, 7] + c1 + [8]  # the first observation rewritten
  calls = [(P0, c0), (p1, c1), (edited, [13])]
  ep = _play(calls)
  assert [s.calls for s in ep.segments] == [[0, 1], [2]]
  assert ep.segments[1].prompt == edited and ep.segments[1].mask == [1]
  (split,) = ep.splits
  assert (split.call, split.reason, split.at) == (2, seg_lib.PREFIX_MISMATCH, len(P0) + 3)
  assert (split.context, split.prompt) == (len(p1) + 1, len(edited))
  assert ep.split_counts() == _counts(mismatch=1)
  _assert_exact(ep, calls)


def test_a_harness_that_drops_a_turn_starts_a_segment():
  c0, o1, c1, o2 = [10, 11], [5, 6], [12], [8]
  p1 = P0 + c0 + o1
  dropped = P0 + o2  # the first turn (completion and observation) left out
  calls = [(P0, c0), (p1, c1), (dropped, [13, 14])]
  ep = _play(calls)
  assert [s.calls for s in ep.segments] == [[0, 1], [2]]
  assert ep.splits[0].at == len(P0) and ep.split_counts() == _counts(mismatch=1)
  # The segment's own first call (2) is its prompt, whole; then it goes on.
  ep2 = _play(calls + [(dropped + [13, 14, 9], [15])])
  assert [s.calls for s in ep2.segments] == [[0, 1], [2, 3]]
  assert ep2.segments[1].prompt == dropped and ep2.segments[1].mask == [1, 1, 0, 1]
  _assert_exact(ep2, calls + [(dropped + [13, 14, 9], [15])])


def test_a_template_that_strips_reasoning_starts_a_segment_at_every_turn():
  """The template renders an earlier turn without its reasoning (the completion's first
  tokens): the next prompt diverges inside the previous completion."""
  think, answer = [20, 21, 22], [30, 31]
  c0 = think + answer
  p1 = P0 + answer + [5]  # the reasoning 20 21 22 dropped from the history
  c1 = [23, 24, 32]
  p2 = P0 + answer + [5] + [32] + [6]
  calls = [(P0, c0), (p1, c1), (p2, [33])]
  ep = _play(calls)
  assert [s.calls for s in ep.segments] == [[0], [1], [2]]
  assert [(s.call, s.at) for s in ep.splits] == [(1, len(P0)), (2, len(p1))]
  assert ep.split_counts() == _counts(mismatch=2)
  # The reasoning stays trained where it was sampled; no re-rendered token is.
  assert ep.segments[0].tokens == c0 and ep.segments[0].mask == [1] * 5
  assert ep.segments[1].prompt == p1 and ep.segments[1].tokens == c1
  _assert_exact(ep, calls)


def test_a_retried_call_is_a_shorter_prompt():
  c0 = [10, 11]
  calls = [(P0, c0), (P0, [12, 13]), (P0 + [12], [14])]
  ep = _play(calls)
  assert [s.calls for s in ep.segments] == [[0], [1], [2]]
  assert [(s.reason, s.at) for s in ep.splits] == [(seg_lib.SHORTER_PROMPT, len(P0)),
                                                   (seg_lib.SHORTER_PROMPT, len(P0) + 1)]
  assert ep.split_counts() == _counts(shorter=2)
  _assert_exact(ep, calls)


def test_random_rewrites_never_mark_a_token_sampled_that_was_not():
  rng = random.Random(0)
  for _ in range(200):
    calls, context = [], list(P0)
    for _ in range(rng.randint(1, 6)):
      prompt = list(context)
      kind = rng.random()
      if kind < 0.2 and len(prompt) > 1:  # edit a token
        i = rng.randrange(len(prompt))
        prompt[i] = (prompt[i] + 1) % 50
      elif kind < 0.3:  # drop a stretch
        i = rng.randrange(len(prompt))
        del prompt[i:i + rng.randint(1, 3)]
      prompt = (prompt or [1]) + [rng.randrange(50) for _ in range(rng.randint(0, 3))]
      completion = [rng.randrange(50) for _ in range(rng.randint(1, 4))]
      calls.append((prompt, completion))
      context = prompt + completion
    ep = _play(calls)
    _assert_exact(ep, calls)
    assert len(ep.segments) == 1 + len(ep.splits)
    recorded = [t for s in ep.segments for t, m in zip(s.tokens, s.mask) if m]
    assert recorded == [t for _, c in calls for t in c]


def test_segments_train_through_grpo_batch_unchanged():
  from rlcode.agent import episodes
  from rlcode.data.tasks import Task
  c0, o1, c1 = [10, 11], [5, 6, 7], [12]
  ep = _play([(P0, c0), (P0 + c0 + o1, c1), (P0 + [9], [13, 14])])
  segs = ep.segments
  batch = episodes.grpo_batch(segs, 1, np.array([1.0, -1.0], np.float32), pad_id=0, max_len=256,
                              mask_cut=False)
  for i, s in enumerate(segs):
    n = len(s.tokens)
    assert list(np.asarray(batch.prompt_tokens[i, :len(s.prompt)])) == s.prompt
    assert list(np.asarray(batch.completion_tokens[i, :n])) == s.tokens
    assert list(np.asarray(batch.mask[i, :n])) == s.mask and not np.asarray(batch.mask[i, n:]).any()
    np.testing.assert_allclose(np.asarray(batch.old_logp[i, :n]),
                               np.asarray(s.logprobs) * np.asarray(s.mask), rtol=1e-6)
  # As the built-in agent's trajectories, mask_cut and all.
  trajs = [s.trajectory(Task(id="t", prompt=""), status="finished", reward=1.0) for s in segs]
  again = episodes.grpo_batch(trajs, 1, np.array([1.0, -1.0], np.float32), pad_id=0,
                              max_len=256, mask_cut=True)
  np.testing.assert_array_equal(np.asarray(again.mask), np.asarray(batch.mask))


def test_episode_ids():
  for good in ("a", "ep-1", "task_3:g.7", "x" * 128, "A-Z.az:09_"):
    assert check_id(good) == good
  for bad in ("", "x" * 129, "a b", "a/b", "é", "a\n", "ep;1", None):
    with pytest.raises(ValueError, match="episode id"):
      check_id(bad)
  with pytest.raises(ValueError, match="episode id"):
    Recorder().record("a/b", "c", [1], [_sample([2])])


def test_episodes_are_apart_counted_and_bounded():
  rec = Recorder(max_episodes=64)

  def play(k):
    name = f"ep{k}"
    calls = [(P0, [k]), (P0 + [k, 7], [k + 1]), ([9], [k + 2])]  # the last one splits
    _play(calls, rec, name)
    return name, calls

  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    played = list(pool.map(play, range(40)))
  for name, calls in played:
    ep = rec.get(name)
    assert [c.id for c in ep.calls] == ["call-0", "call-1", "call-2"]
    _assert_exact(ep, calls)
  stats = rec.stats()
  assert stats["episodes_held"] == 40 and stats["episode_calls"] == 120
  assert stats["episode_splits_prefix_mismatch"] == 40
  assert stats["episode_splits_shorter_prompt"] == 0
  out = rec.to_json("ep3")
  assert out["splits"] == _counts(mismatch=1) and len(out["segments"]) == 2
  assert out["split_events"] == [{"call": 2, "reason": "prefix_mismatch", "at": 0,
                                  "context": len(P0) + 3, "prompt": 1}]
  assert rec.drop("ep3") and not rec.drop("ep3") and rec.get("ep3") is None
  small = Recorder(max_episodes=2)
  for name in ("a", "b", "a", "c"):  # "b" is the least recently written when "c" comes
    small.record(name, "x", [1], [_sample([2])])
  assert small.get("b") is None and small.get("a") is not None
  assert small.stats()["episodes_evicted"] == 1


# --- over HTTP: rlcode serve and the openai client -------------------------------------

CHOICES = ["ls", "pwd", "cat", "make"]
# The reply is one of a few ASCII words (a JSON string under a schema), so the chat
# template renders it back as the very tokens that were sampled.
FORMAT = {"type": "json_schema",
          "json_schema": {"name": "cmd", "schema": {"type": "string", "enum": CHOICES}}}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
  import serving
  from chat_templates import write_tokenizer_dir
  workdir = str(tmp_path_factory.mktemp("harness"))
  template_dir = write_tokenizer_dir(f"{workdir}/template", "chatml")
  with serving.running(workdir, f"--config.serve.chat_template={template_dir}",
                       "--config.serve.slots=4") as server:
    yield server, template_dir


def _prompt(template_dir, messages):
  from rlcode.models import chat_template
  from rlcode.models.tokenizer import load_tokenizer
  text = chat_template.load_chat_template(template_dir).render(messages,
                                                               add_generation_prompt=True)
  return chat_template.encode(load_tokenizer("bytes+tools"), text)


def _ask(client, messages, episode, seed, **kw):
  import serving
  return client.chat.completions.create(
      model=serving.MODEL, messages=messages, max_tokens=16, temperature=1.0, seed=seed,
      logprobs=True, response_format=FORMAT, extra_headers={"X-Episode-Id": episode}, **kw)


@pytest.mark.slow
def test_an_episode_through_rlcode_serve_is_its_sampled_tokens(served):
  from rlcode.models.tokenizer import load_tokenizer
  server, template_dir = served
  client, tokenizer = server.openai(), load_tokenizer("bytes+tools")
  a, b = "ep-a:0", "ep-b:0"
  with server.client() as http:
    before = http.get("/metrics").json()
  messages, replies = [{"role": "user", "content": "Fix the bug."}], []
  for turn in range(3):
    reply = _ask(client, messages, a, seed=turn)
    replies.append(reply)
    messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                 {"role": "user", "content": f"exit {turn}"}]
  with server.client() as http:
    got = http.get(f"/v1/episodes/{a}").json()
  assert [c["id"] for c in got["calls"]] == [r.id for r in replies]
  assert got["splits"] == _counts() and got["split_events"] == []
  (seg,) = got["segments"]
  assert seg["calls"] == [0, 1, 2]
  first = _prompt(template_dir, messages[:1])
  last = _prompt(template_dir, messages[:-2])
  assert seg["prompt"] == first
  assert (seg["prompt"] + seg["tokens"])[:len(last)] == last  # the third call's prompt
  sampled = [(t, lp, v) for t, m, lp, v in zip(seg["tokens"], seg["mask"], seg["logprobs"],
                                                seg["versions"]) if m]
  served_tokens = [e for r in replies for e in r.choices[0].logprobs.content]
  assert len(sampled) == len(served_tokens) == sum(r.usage.completion_tokens for r in replies)
  for (token, lp, version), entry in zip(sampled, served_tokens):
    assert tokenizer.token_bytes(token) == bytes(entry.bytes)
    assert lp == entry.logprob
  assert {v for _, _, v in sampled} == {r.model_extra["policy_version"] for r in replies}
  for call, reply in zip(got["calls"], replies):
    assert call["prompt_tokens"] == reply.usage.prompt_tokens
    assert [c["finish_reason"] for c in call["candidates"]] == ["stop"]

  # A second episode: its calls are its own, and leave the first as it was.
  one = [{"role": "user", "content": "hi"}]
  r0 = _ask(client, one, b, seed=7)
  rewritten = [{"role": "user", "content": "hi"}, {"role": "user", "content": "again"}]
  stream = _ask(client, rewritten, b, seed=8, stream=True)  # the reply dropped: a split
  streamed = [e for chunk in stream for c in chunk.choices if c.logprobs
              for e in c.logprobs.content]
  with server.client() as http:
    assert http.get(f"/v1/episodes/{a}").json() == got
    other = http.get(f"/v1/episodes/{b}").json()
    assert other["calls"][0]["id"] == r0.id
    assert not {c["id"] for c in other["calls"]} & {r.id for r in replies}
    assert other["splits"] == _counts(mismatch=1) and len(other["segments"]) == 2
    assert other["segments"][1]["prompt"] == _prompt(template_dir, rewritten)
    assert [bytes(e.bytes) for e in streamed] == [
        tokenizer.token_bytes(t) for t in other["segments"][1]["tokens"]]
    assert http.delete(f"/v1/episodes/{b}").json()["deleted"] is True
    assert http.get(f"/v1/episodes/{b}").status_code == 404
    assert http.delete(f"/v1/episodes/{b}").status_code == 404
    assert http.get(f"/v1/episodes/{a}").json() == got
    metrics = http.get("/metrics").json()
    assert metrics["episode_calls"] - before["episode_calls"] == 5
    assert (metrics["episode_splits_prefix_mismatch"]
            - before["episode_splits_prefix_mismatch"]) == 1


@pytest.mark.slow
def test_bad_episode_calls_are_400s(served):
  import serving
  server, _ = served
  body = {"model": serving.MODEL, "messages": [{"role": "user", "content": "hi"}],
          "max_tokens": 2}
  with server.client() as http:
    for bad in ("", "a b", "x" * 129, "é"):
      r = http.post("/v1/chat/completions", json=body,
                    headers={"X-Episode-Id": bad.encode("utf-8")})
      assert r.status_code == 400, r.text
      assert r.json()["error"]["param"] == "X-Episode-Id"
    r = http.post("/v1/chat/completions", json=dict(body, n=2), headers={"X-Episode-Id": "e"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    r = http.post("/v1/completions", json={"model": serving.MODEL, "prompt": ["a", "b"],
                                           "max_tokens": 2}, headers={"X-Episode-Id": "e"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert http.get("/v1/episodes/e").status_code == 404  # nothing was recorded
    assert http.get("/v1/episodes/a%20b").json()["error"]["code"] == "invalid_episode_id"
    r = http.post("/v1/completions", json={"model": serving.MODEL, "prompt": [1, 2, 3],
                                           "max_tokens": 3}, headers={"X-Episode-Id": "e"})
    assert r.status_code == 200, r.text
    (seg,) = http.get("/v1/episodes/e").json()["segments"]
    assert seg["prompt"] == [1, 2, 3] and seg["mask"] == [1] * len(seg["tokens"])
  # Without the API key the episode routes are refused like every /v1 route.
  with httpx.Client(base_url=server.url, headers={"Authorization": "Bearer wrong"}) as http:
    assert http.get("/v1/episodes/e").status_code == 401
