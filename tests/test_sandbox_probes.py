"""Probes: the entry point's answers on given inputs come back as plain data, rebuilt by the
harness and decoded on the host; nothing the program defines crosses, and a program that
forges or breaks the answers gets none."""

import hashlib
import math

import pytest

from rlcode import sandbox as sb
from rlcode.sandbox import codec, harness_codec

LIMITS = sb.Limits(wall_seconds=20, cpu_seconds=5)
TESTS = "def check(candidate):\n    assert candidate(1) == 2\n"


@pytest.fixture(scope="module")
def box():
  return sb.Sandbox(LIMITS, workers=2)


def _run(box, program, probes, tests=TESTS):
  return box.run(sb.Job(program=program, tests=tests, entry_point="f", probes=probes))


def test_answers_are_plain_data(box):
  program = ("def f(x):\n    if x == 1:\n        return 2\n"
             "    return [x, (x,), {x: {x}}, frozenset([b'x']), 2 ** 80, float('nan'), 1j]\n")
  r = _run(box, program, [(1,), (3,), ([1, 2],)])
  assert r.passed
  assert r.outputs[0] == ("return", 2)
  kind, value = r.outputs[1]
  assert kind == "return" and value[:5] == [3, (3,), {3: {3}}, frozenset([b"x"]), 2 ** 80]
  assert math.isnan(value[5]) and value[6] == 1j
  assert r.outputs[2] == ("raise", "TypeError")  # unhashable list as a dict key


def test_errors_and_what_is_not_data(box):
  program = ("class Lie(int):\n    def __eq__(self, other):\n        return True\n"
             "class Mine(ValueError):\n    pass\n"
             "def f(x):\n    if x == 1:\n        return 2\n"
             "    if x == 2:\n        raise Mine('no')\n"
             "    if x == 3:\n        return Lie(7)\n"
             "    if x == 4:\n        return object()\n"
             "    if x == 5:\n        raise SystemExit(0)\n"
             "    return 1 // 0\n")
  r = _run(box, program, [(2,), (3,), (4,), (5,), (6,)])
  assert r.passed
  assert r.outputs == (("raise", "ValueError"), ("raise", "ProgramError"),
                       ("raise", "ProgramError"), ("raise", "ProgramError"),
                       ("raise", "ZeroDivisionError"))


def test_failing_tests_still_answer_and_large_answers_are_digests(box):
  r = _run(box, "def f(x):\n    return 'a' * x\n", [(3,), (20000,)])
  assert r.status == "failed" and r.complete
  assert r.outputs[0] == ("return", "aaa")
  digest = hashlib.sha256(harness_codec._encode("a" * 20000)).hexdigest()
  assert r.outputs[1] == ("large", digest)


def test_no_answers_from_a_run_that_did_not_complete(box):
  dies = "import os\ndef f(x):\n    if x == 1:\n        return 2\n    os._exit(0)\n"
  r = _run(box, dies, [(1,), (9,)])
  assert r.status == "crash" and r.outputs == ()
  # Output lines printed by the program are stdout, never the report.
  forged = ("import sys\ndef f(x):\n    print('output 0 return 4e;')\n    return 2\n"
            "print('output 0 return 4e;')\n")
  r = _run(box, forged, [(1,)])
  assert r.passed and r.outputs == (("return", 2),)
  assert _run(box, "f = 5\n", [(1,)]).outputs == (("raise", "TypeError"),)
  assert _run(box, "def f(x):\n    return (\n", [(1,)]).outputs == ()


def test_jobs_with_probes():
  with pytest.raises(ValueError, match="give entry_point"):
    sb.Job(program="", tests=TESTS, probes=[(1,)])
  with pytest.raises(ValueError, match="argument tuples"):
    sb.Job(program="", tests=TESTS, entry_point="f", probes=[1])
  a = sb.Job(program="p", tests=TESTS, entry_point="f", probes=[([1], 2)])
  b = sb.Job(program="p", tests=TESTS, entry_point="f", probes=[([1], 3)])
  assert a.probes == (([1], 2),) and hash(a) == hash(b) and a != b
  assert len(dict.fromkeys([a, b, a])) == 2  # run_many runs both, once each


PLAIN = [None, True, 0, -7, 2 ** 63, -(2 ** 70) - 1, 1.5, -0.0, math.inf, "", "é\udc80\n", b"",
         b"\x00\xff", 1 - 2j, [], (), {}, set(), frozenset(), [1, [2, (3, {4: {5}})]],
         {(1, 2): frozenset({b"x"}), None: [1.0], 3: "a"}, (True, 1, 1.0)]


@pytest.mark.parametrize("value", PLAIN, ids=range(len(PLAIN)))
def test_host_decoder_reads_the_harness_encoding(value):
  got = codec.decode(harness_codec._encode(value))
  assert got == value and type(got) is type(value)
  assert repr(got) == repr(value)


@pytest.mark.parametrize("data", [
    b"", b"X", b"N;", b"NN", b"i;", b"ix;", b"i1", b"fzz;", b"c0x1p+0;", b"s3:ab", b"s-1:",
    b"s 1:a", b"s1:\xff", b"l2:N", b"d1:N", b"d1:l0:N", b"e1:l0:", b"l99999999999999:",
    b"b1:ab", b"l1:" * 500 + b"N"])
def test_host_decoder_refuses_malformed_data(data):
  with pytest.raises(ValueError):
    codec.decode(data)
