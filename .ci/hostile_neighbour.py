"""Hostile sandbox and session cases in a loop, to run beside the suite on the same cores.

    python .ci/hostile_neighbour.py --minutes 20     # or until SIGINT / SIGTERM

Each round runs, with the sandbox's default limits, programs that fork without end, write
2 GB, allocate without end, print without end and spin; and in an agent session (the
tools' shell) the same in bash. Every case must score 0 or be cut at its limit, and leave
nothing behind: no sandbox directory in the temporary directory, no process of ours
left. A case that does not is printed and counted; the exit status is the number of
rounds with a miss (0: all held). Run `.ci/run` beside this loop to check the suite
under a hostile neighbour.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import os
import shutil
import signal
import sys
import tempfile
import time

from rlcode import sandbox as sb
from rlcode.sandbox.session import Session, SessionLimits

ADD_TESTS = "def check(candidate):\n    assert candidate(1, 2) == 3\n"
PROGRAMS = {
    "fork_bomb": "import os\nwhile True:\n    os.fork()\n",
    "write_2gb": "f = open('big', 'wb')\nfor _ in range(2048):\n    f.write(b'x' * (1 << 20))\n",
    "memory_hog": "x = []\nwhile True:\n    x.append(bytearray(10**7))\n",
    "print_forever": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
    "spin": "while True:\n    pass\n",
}
COMMANDS = {
    "fork_bomb": ":(){ :|:& };:",
    "write_2gb": "head -c 2000000000 /dev/zero > big; ls -l big",
    "memory_hog": "python3 -c 'x = []\nwhile True: x.append(bytearray(10**7))'",
    "print_forever": "yes",
    "spin": "python3 -c 'while True: pass'",
}


def _ours() -> set[int]:
  """Processes whose parent chain reaches this one (the sandboxes' and sessions')."""
  parents = {}
  for stat in glob.glob("/proc/[0-9]*/stat"):
    try:
      fields = open(stat).read().rsplit(")", 1)[1].split()
      parents[int(stat.split("/")[2])] = int(fields[1])
    except (OSError, IndexError, ValueError):
      continue
  me, found = os.getpid(), set()
  for pid in parents:
    seen, p = 0, pid
    while p in parents and p != me and seen < 64:
      p, seen = parents[p], seen + 1
    if p == me and pid != me:
      found.add(pid)
  return found


def one_round(box: sb.Sandbox) -> list[str]:
  misses = []
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    results = dict(zip(PROGRAMS, pool.map(
        lambda program: box.run(sb.Job(program, ADD_TESTS, "add")), PROGRAMS.values())))
  for name, r in results.items():
    if r.passed or r.fraction != 0.0:
      misses.append(f"sandbox {name}: scored {r.fraction} ({r.status})")
  with Session(SessionLimits(command_seconds=3.0, max_output_bytes=4096)) as session:
    for name, command in COMMANDS.items():
      session.exec(command, timeout=3.0)
      if session.exec("echo alive").output != "alive\n":
        misses.append(f"session {name}: the session did not survive")
      left = int(session.exec("ls /proc | grep -c '^[0-9]'").output or 0)
      if left > 4:
        misses.append(f"session {name}: {left} processes left in the session")
  deadline = time.monotonic() + 10
  while _ours() and time.monotonic() < deadline:  # sessions stop asynchronously
    time.sleep(0.1)
  if _ours():
    misses.append(f"processes left behind: {sorted(_ours())}")
  left = glob.glob(os.path.join(tempfile.gettempdir(), "rlcode-sandbox-*"))
  if left:
    misses.append(f"sandbox directories left behind: {left}")
  return misses


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--minutes", type=float, default=None, help="stop after this long")
  args = parser.parse_args()
  # Stopped by SIGINT or SIGTERM, it ends its round's bookkeeping and says what it saw. A
  # shell starts a background job with SIGINT ignored (so Python never installs its
  # handler): both are set here.
  def stop(signum, frame):
    raise KeyboardInterrupt
  signal.signal(signal.SIGINT, stop)
  signal.signal(signal.SIGTERM, stop)
  # A temporary directory of its own, so that what is left there is this loop's (the suite
  # beside it makes sandbox directories of its own in the system's).
  tempfile.tempdir = os.environ["TMPDIR"] = tempfile.mkdtemp(prefix="rlcode-neighbour-")
  box = sb.Sandbox(sb.Limits(), workers=2)
  end = time.monotonic() + 60 * args.minutes if args.minutes else float("inf")
  rounds = missed = 0
  try:
    while time.monotonic() < end:
      misses = one_round(box)
      rounds, missed = rounds + 1, missed + bool(misses)
      for miss in misses:
        print(f"round {rounds}: {miss}", flush=True)
      print(f"round {rounds}: {len(PROGRAMS)} sandbox + {len(COMMANDS)} session cases, "
            f"{len(misses)} missed", flush=True)
  except KeyboardInterrupt:
    pass
  print(f"{rounds} rounds, {missed} with a miss", flush=True)
  shutil.rmtree(tempfile.tempdir, ignore_errors=True)
  return missed


if __name__ == "__main__":
  sys.exit(main())
