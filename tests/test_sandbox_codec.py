"""The harness's plain-data codec: exact builtin types cross, anything else is refused."""

from __future__ import annotations

import json
import math

import pytest

from rlcode.sandbox import harness

PLAIN = [None, True, False, 0, -7, 2 ** 63 - 1, 2 ** 63, -(2 ** 63) - 1, 10 ** 5000, 1.5, -0.0,
         math.inf, "", "é\udc80\n", b"", b"\x00\xff", 1 - 2j, [], (), {}, set(), frozenset(),
         [1, [2, (3, {4: {5}})]], {(1, 2): frozenset({b"x"}), None: [1.0], 3: "a"},
         (True, 1, 1.0), {frozenset({1}), (2, 3)}]


def _round_trip(value):
  return harness._decode(json.loads(json.dumps(harness._encode(value))))


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
    harness._encode(value)


def test_cycles_are_refused():
  loop = []
  loop.append(loop)
  with pytest.raises(RecursionError):
    harness._encode(loop)


@pytest.mark.parametrize("node", [
    {"a": 1}, [], [1, 2], ["X", 1], ["D", 1], ["B", 1], ["B", "zz"], ["C", "1", 2],
    ["C", True, 1], ["I", 5], ["S", ["L"]], ["D", ["L"], 1], ["T", {"k": 1}]])
def test_malformed_data_is_refused(node):
  with pytest.raises((ValueError, TypeError)):
    harness._decode(node)
