"""Reading the harness's plain-data encoding on the host (the probes' answers).

The harness (harness.py, never imported by rlcode) encodes values with `_encode`: None N,
True T, False F, int i<hex>;, float f<float.hex>;, complex c<hex>,<hex>;, str s<n>:<utf-8>,
bytes b<n>:<bytes>, and list l, tuple t, set e, frozenset g, dict d: <tag><count>: then
the items (a dict's as key, value). `decode` rebuilds exactly those types from untrusted
bytes; anything else, truncated or trailing bytes included, is a ValueError. It creates no
object but builtins of those types and runs no code. tests/test_sandbox_codec.py checks it
against the harness's encoder on every plain type.
"""

from __future__ import annotations

_MAKERS = {ord("l"): list, ord("t"): tuple, ord("e"): set, ord("g"): frozenset}
_MAX_DEPTH = 200


def decode(data: bytes):
  """The value `data` encodes; ValueError when it is not a well-formed encoding."""
  data = bytes(data)
  end = len(data)

  def until(pos: int, stop: bytes) -> tuple[bytes, int]:
    close = data.find(stop, pos)
    if close < 0:
      raise ValueError(f"unterminated field at byte {pos}")
    return data[pos:close], close + 1

  def count(pos: int) -> tuple[int, int]:
    text, pos = until(pos, b":")
    if not text.isdigit() or len(text) > 12:
      raise ValueError(f"malformed length at byte {pos}")
    return int(text), pos

  def get(pos: int, depth: int):
    if pos >= end:
      raise ValueError("truncated")
    if depth > _MAX_DEPTH:
      raise ValueError(f"nested deeper than {_MAX_DEPTH}")
    tag = data[pos]
    pos += 1
    if tag in b"NTF":
      return {ord("N"): None, ord("T"): True, ord("F"): False}[tag], pos
    if tag in b"if":
      text, pos = until(pos, b";")
      try:
        return (int(text, 16) if tag == ord("i") else float.fromhex(text.decode("ascii"))), pos
      except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"malformed number {text[:20]!r}") from e
    if tag == ord("c"):
      text, pos = until(pos, b";")
      real, comma, imag = text.partition(b",")
      if not comma:
        raise ValueError("malformed complex")
      try:
        parts = [float.fromhex(x.decode("ascii")) for x in (real, imag)]
        return complex(*parts), pos
      except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"malformed complex {text[:40]!r}") from e
    if tag in b"sb":
      n, pos = count(pos)
      if pos + n > end:
        raise ValueError("truncated")
      chunk = data[pos:pos + n]
      if tag == ord("b"):
        return chunk, pos + n
      try:
        return chunk.decode("utf-8", "surrogatepass"), pos + n
      except UnicodeDecodeError as e:
        raise ValueError("malformed utf-8") from e
    if tag in _MAKERS or tag == ord("d"):
      n, pos = count(pos)
      items = []
      for _ in range(2 * n if tag == ord("d") else n):
        item, pos = get(pos, depth + 1)
        items.append(item)
      try:
        if tag == ord("d"):
          return {items[i]: items[i + 1] for i in range(0, len(items), 2)}, pos
        return _MAKERS[tag](items), pos
      except TypeError as e:  # an unhashable key or set member
        raise ValueError(f"malformed container: {e}") from e
    raise ValueError(f"unknown tag {tag} at byte {pos - 1}")

  value, pos = get(0, 0)
  if pos != end:
    raise ValueError("trailing bytes")
  return value
