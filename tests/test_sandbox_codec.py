"""The harness's plain-data codec: exact builtin types cross, anything else is refused."""

from __future__ import annotations

import math

import pytest

from rlcode.sandbox import harness_codec

PLAIN = [None, True, False, 0, -7, 2 ** 63 - 1, 2 ** 63, -(2 ** 63) - 1, 10 ** 5000, 1.5, -0.0,
         math.inf, "", "é\udc80\n", b"", b"\x00\xff", 1 - 2j, [], (), {}, set(), frozenset(),
         [1, [2, (3, {4: {5}})]], {(1, 2): frozenset({b"x"}), None: [1.0], 3: "a"},
         (True, 1, 1.0), {frozenset({1}), (2, 3)}]


def _round_trip(value):
  return harness_codec._decode(harness_codec._encode(value))


def _shape(v):
  """`v` with every type and float bit pattern spelled out (== would take 1 for True)."""
  kind = type(v)
  if kind is float:
    return ("float", v.hex())
  if kind is complex:
    return ("complex", v.real.hex(), v.imag.hex())
  if kind in (list, tuple):
    return (kind.__name__, [_shape(i) for i in v])
  if kind is dict:
    return ("dict", [(_shape(k), _shape(i)) for k, i in v.items()])
  if kind in (set, frozenset):
    return (kind.__name__, sorted(repr(_shape(i)) for i in v))
  return (kind.__name__, v)


@pytest.mark.parametrize("value", PLAIN, ids=range(len(PLAIN)))
def test_plain_data_round_trips_with_exact_types(value):
  assert _shape(_round_trip(value)) == _shape(value)


def test_nan_crosses_as_nan():
  assert _shape(_round_trip([math.nan, complex(math.nan, 1)])) == _shape(
      [math.nan, complex(math.nan, 1)])


class _Int(int):
  def __eq__(self, other):
    return True

  __hash__ = int.__hash__


class _Str(str):
  pass


class _List(list):
  pass


@pytest.mark.parametrize("value", [
    _Int(3), _Str("x"), _List([1]), [1, _Int(2)], {"k": _Str("v")}, {_Int(1): 1}, bytearray(b"x"),
    object(), len, range(3), (i for i in range(2)), type, Exception("e"), Ellipsis])
def test_anything_else_is_refused(value):
  with pytest.raises(TypeError, match="not plain data"):
    harness_codec._encode(value)


def test_cycles_are_refused():
  loop = []
  loop.append(loop)
  with pytest.raises(RecursionError):
    harness_codec._encode(loop)


def test_encoding_is_the_documented_one():
  assert harness_codec._encode([None, True, -255, 0.5, "é", b"\x00", (1 + 2j,), {3: {4}}]) == (
      b"l8:NTi-ff;f0x1.0000000000000p-1;s2:\xc3\xa9b1:\x00t1:c0x1.0000000000000p+0,"
      b"0x1.0000000000000p+1;d1:i3;e1:i4;")


@pytest.mark.parametrize("data", [
    b"", b"X", b"N;", b"NN", b"i;", b"ix;", b"i1", b"fzz;", b"c0x1p+0;", b"s3:ab", b"s-1:",
    b"s 1:a", b"s1:\xff", b"l2:N", b"d1:N", b"d1:l0:N", b"e1:l0:", b"l99999999999999:",
    b"b1:ab"])
def test_malformed_data_is_refused(data):
  with pytest.raises((ValueError, TypeError, IndexError)):
    harness_codec._decode(data)
