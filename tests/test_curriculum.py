"""The signal curriculum: family weights from recent groups with a signal, seeded and
resumable draws, each family's tasks once per epoch."""

import collections

import numpy as np
import pytest

from rlcode.rl.curriculum import SignalCurriculum, family_of
from rlcode.data.tasks import Task


def _task(tid, family=None):
  extra = {"family": family} if family else {}
  return Task(id=tid, prompt="p", kind="code", extra=extra)


TASKS = ([_task(f"agent/file/{i}", "file") for i in range(6)]
         + [_task(f"agent/practice/tests/{i}", "tests") for i in range(3)]
         + [_task(f"agent/tests/{i}") for i in range(3)])


def test_family_of():
  assert family_of(_task("agent/practice/search/x", "search")) == "search"
  assert family_of(_task("agent/tests/mul/zap2")) == "tests"
  assert family_of(_task("solo")) == "solo"


def test_no_history_draws_the_plain_mix():
  stream = SignalCurriculum(TASKS, 4, seed=0)
  assert stream.families == ["file", "tests"]
  np.testing.assert_allclose(stream.weights(), [0.5, 0.5])  # 6 file, 6 tests tasks


def test_weights_follow_the_groups_with_signal():
  stream = SignalCurriculum(TASKS, 4, seed=0, decay=0.5, floor=0.05)
  file_task, tests_task = TASKS[0], TASKS[-1]
  for _ in range(20):  # file groups always flat, tests groups always with a signal
    stream.record([file_task, tests_task, tests_task], [False, True, True])
  rates = stream.rates()
  # Decayed sums: groups 1/(1-0.5) = 2 per family-group per step in the limit.
  np.testing.assert_allclose(rates["file"], 1.0 / (2.0 + 2.0), atol=1e-4)
  np.testing.assert_allclose(rates["tests"], (4.0 + 1.0) / (4.0 + 2.0), atol=1e-4)
  w = stream.weights()
  np.testing.assert_allclose(w[0] / w[1], 0.25 / (5 / 6), rtol=1e-3)
  counts = collections.Counter(family_of(t) for _ in range(500) for t in stream.next())
  share = counts["tests"] / sum(counts.values())
  assert abs(share - w[1]) < 0.03
  # A family gone flat keeps at least the floor.
  stream.floor = 0.5
  assert stream.weights()[0] == pytest.approx(0.5 / (0.5 + 5 / 6), rel=1e-3)


def test_each_family_visits_its_tasks_once_an_epoch():
  stream = SignalCurriculum(TASKS, 6, seed=3)
  seen = collections.defaultdict(list)
  for _ in range(10):
    for t in stream.next():
      seen[family_of(t)].append(t.id)
  for family, ids in seen.items():
    n = 6
    for start in range(0, len(ids) - n + 1, n):
      assert len(set(ids[start:start + n])) == n, family


def test_resume_draws_what_the_uninterrupted_stream_draws():
  def run(split_at):
    stream = SignalCurriculum(TASKS, 4, seed=1)
    out = []
    for step in range(8):
      if step == split_at:
        stream = SignalCurriculum(TASKS, 4, seed=1, state=stream.state())
      batch = stream.next()
      out.append([t.id for t in batch])
      stream.record(batch, [i % 2 == step % 2 for i in range(len(batch))])
    return out
  assert run(split_at=-1) == run(split_at=5)
  assert run(split_at=-1) != [[t.id for t in SignalCurriculum(TASKS, 4, seed=2).next()]] * 8


def test_bad_input():
  with pytest.raises(ValueError, match="no tasks"):
    SignalCurriculum([], 4, seed=0)
  with pytest.raises(ValueError, match="decay=1.0"):
    SignalCurriculum(TASKS, 4, seed=0, decay=1.0)
  stream = SignalCurriculum(TASKS, 4, seed=0)
  with pytest.raises(ValueError, match="2 tasks and 1 signal flags"):
    stream.record(TASKS[:2], [True])
  state = stream.state()
  with pytest.raises(ValueError, match="families"):
    SignalCurriculum(TASKS[:6], 4, seed=0, state=state)
