"""Plain data as bytes, both ways: the harness's codec (rlcode.sandbox.harness).

`_encode` writes None, bool, int, float, complex, str, bytes and list, tuple, dict, set,
frozenset of them, checked by exact type (a subclass is an error); `_decode` rebuilds
the value. The launcher sends this file's text before the harness's to the sandboxed
interpreter (rlcode.sandbox.launch), so both of the harness's processes hold these two
functions; standard library only, no imports at all.
"""


def _encode(value):
  """`value` as bytes if it is plain data (exact types, no subclass), else TypeError.

  None N, True T, False F, int i<hex>;, float f<float.hex>;, complex
  c<hex>,<hex>;, str s<n>:<utf-8>, bytes b<n>:<bytes>, and list l, tuple t, set
  e, frozenset g, dict d: <tag><count>: then the items (a dict's as key, value).
  """
  parts = []
  append = parts.append
  containers = {list: b"l", tuple: b"t", set: b"e", frozenset: b"g"}

  def put(v):
    kind = type(v)
    if v is None:
      append(b"N")
    elif kind is bool:
      append(b"T" if v else b"F")
    elif kind is int:
      append(b"i%x;" % v)
    elif kind is float:
      append(b"f%s;" % v.hex().encode())
    elif kind is str or kind is bytes:
      data = v.encode("utf-8", "surrogatepass") if kind is str else v
      append(b"%s%d:" % (b"s" if kind is str else b"b", len(data)))
      append(data)
    elif kind is complex:
      append(b"c%s,%s;" % (v.real.hex().encode(), v.imag.hex().encode()))
    elif kind is dict:
      items = tuple(v.items())
      append(b"d%d:" % len(items))
      for key, item in items:
        put(key)
        put(item)
    elif kind in containers:
      items = tuple(v)
      append(b"%s%d:" % (containers[kind], len(items)))
      for item in items:
        put(item)
    else:
      raise TypeError(f"a {kind.__name__} is not plain data")

  put(value)
  return b"".join(parts)


def _decode(data):
  """The value `data` (from `_encode`) stands for; ValueError and kin when malformed."""
  end = len(data)
  makers = {108: list, 116: tuple, 101: set, 103: frozenset}

  def field(pos, stop):
    close = data.index(stop, pos)
    return data[pos:close], close + 1

  def size(pos):
    text, pos = field(pos, b":")
    if not text.isdigit() or len(text) > 12:
      raise ValueError("malformed length")
    return int(text), pos

  def get(pos):
    tag = data[pos]
    pos += 1
    if tag in (78, 84, 70):  # N T F
      return (None, True, False)[(78, 84, 70).index(tag)], pos
    if tag == 105 or tag == 102:  # i f
      text, pos = field(pos, b";")
      return (int(text, 16) if tag == 105 else float.fromhex(text.decode("ascii"))), pos
    if tag == 99:  # c
      text, pos = field(pos, b";")
      real, comma, imag = text.decode("ascii").partition(",")
      if not comma:
        raise ValueError("malformed complex")
      return complex(float.fromhex(real), float.fromhex(imag)), pos
    if tag == 115 or tag == 98:  # s b
      n, pos = size(pos)
      if pos + n > end:
        raise ValueError("truncated")
      chunk = data[pos:pos + n]
      return (chunk.decode("utf-8", "surrogatepass") if tag == 115 else chunk), pos + n
    if tag in makers or tag == 100:  # l t e g d
      n, pos = size(pos)
      items = []
      for _ in range(n * 2 if tag == 100 else n):
        item, pos = get(pos)
        items.append(item)
      if tag == 100:
        return {items[i]: items[i + 1] for i in range(0, len(items), 2)}, pos
      return makers[tag](items), pos
    raise ValueError(f"unknown tag {tag}")

  value, pos = get(0)
  if pos != end:
    raise ValueError("trailing bytes")
  return value
