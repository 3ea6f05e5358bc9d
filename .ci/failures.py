"""The failing tests of a JUnit report: each one's name and the first lines of its error.

    python3 .ci/failures.py .ci/out/junit.xml

Standard library only (it runs before or without the project's environment).
"""

import sys
import xml.etree.ElementTree as ET

LINES = 12


def main(path: str) -> int:
  root = ET.parse(path).getroot()
  failed = []
  for case in root.iter("testcase"):
    for kind in ("failure", "error"):
      for node in case.findall(kind):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        text = (node.get("message") or "") + "\n" + (node.text or "")
        failed.append((kind, name, [l for l in text.splitlines() if l.strip()]))
  tests = sum(1 for _ in root.iter("testcase"))
  if not failed:
    print(f"\n{tests} tests, none failed")
    return 0
  print(f"\n{len(failed)} of {tests} tests failed or errored:")
  for kind, name, lines in failed:
    errors = [l for l in lines if l.lstrip().startswith("E ")] or lines
    print(f"\n{kind.upper()} {name}")
    for line in errors[:LINES]:
      print(f"    {line.rstrip()[:300]}")
  return 1


if __name__ == "__main__":
  sys.exit(main(sys.argv[1]))
