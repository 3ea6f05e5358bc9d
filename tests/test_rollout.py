"""Rollouts to training batches: which sampled tokens the update trains on."""

import numpy as np

from rlcode.rl import shared_prefix
from rlcode.rl import rollout
from rlcode.rl import sequences
from rlcode.data.tasks import Task
from rlcode.models.tokenizer import ByteTokenizer
from rlcode.sampling import Generation

TOK = ByteTokenizer()
TASK = Task(id="t/add_one", prompt="def add_one(x):\n", kind="code",
            tests="def check(candidate):\n    assert candidate(1) == 2\n",
            entry_point="add_one", reference="    return x + 1\n")
BODY = "    return x + 1  # é\n"  # a two-byte character just before the cut
TAIL = "\ndef helper():\n    return 0\n"  # after HumanEval's stop sequence "\ndef "


def _rollout(texts, finished=True):
  rows = [list(t.encode()) + ([TOK.eos_id] if finished else []) for t in texts]
  width = max(map(len, rows)) + 3
  tokens = np.full((len(rows), width), TOK.pad_id, np.int32)
  logprobs = np.zeros((len(rows), width), np.float32)
  for i, r in enumerate(rows):
    tokens[i, :len(r)] = r
    logprobs[i, :len(r)] = -1.0 - np.arange(len(r)) / 100
  gen = Generation(tokens=tokens, logprobs=logprobs, lengths=np.array([len(r) for r in rows]),
                   finished=np.array([finished] * len(rows)), prompt_index=np.zeros(len(rows), int))
  return rollout.Rollout([TASK], [TOK.encode(TASK.prompt)], gen, list(texts), 0.0, TOK)


def test_tokens_for_chars_covers_exactly_the_kept_text():
  text = BODY + TAIL
  tokens = list(text.encode()) + [TOK.eos_id]
  cut = len(BODY)
  n = rollout.tokens_for_chars(TOK, tokens, text, cut)
  assert n == len(BODY.encode())  # both bytes of "é", not one more or less
  assert TOK.decode(tokens[:n]) == BODY
  assert rollout.tokens_for_chars(TOK, tokens, text, len(text)) == len(tokens)  # EOS kept
  assert rollout.tokens_for_chars(TOK, tokens, text, 0) == 0


def test_tokens_after_a_stop_sequence_are_out_of_the_loss():
  texts = [BODY + TAIL, BODY]
  ro = _rollout(texts)
  reward = rollout.score(ro, {"tests": 1.0})
  np.testing.assert_array_equal(reward.scores, [1.0, 1.0])  # the tail does not change it
  body = len(BODY.encode())
  np.testing.assert_array_equal(ro.loss_lengths, [body, body + 1])  # the second keeps EOS
  for batch in (sequences.rl_batch(ro, np.array([1.0, -1.0]), TOK.pad_id, 64),
                shared_prefix.rl_batch(ro, np.array([1.0, -1.0]), TOK.pad_id, 64)):
    np.testing.assert_array_equal(batch.mask.sum(1), [body, body + 1])
    np.testing.assert_allclose(batch.old_logp[0, :body], ro.generation.logprobs[0, :body])
    assert np.all(batch.old_logp[0, body:] == 0)


def test_a_reward_that_reads_everything_keeps_every_token():
  ro = _rollout([BODY + TAIL])
  rollout.score(ro, {"tests": 1.0, "format": 0.1})  # format reads the stray tail
  assert ro.loss_lengths[0] == len((BODY + TAIL).encode()) + 1
