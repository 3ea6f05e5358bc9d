"""The seccomp filter's decisions, run through a reference classic-BPF interpreter."""

from __future__ import annotations

import struct

import pytest

from rlcode.sandbox import seccomp_filter


def _run_bpf(program: bytes, nr: int, arch: int, arg0: int = 0) -> int:
  """A reference interpreter for the classic-BPF subset the filter uses."""
  data = struct.pack("<iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
  ins = [struct.unpack_from("<HBBI", program, 8 * i) for i in range(len(program) // 8)]
  pc, acc = 0, 0
  while True:
    code, jt, jf, k = ins[pc]
    if code == 0x20:
      acc = struct.unpack_from("<I", data, k)[0]
      pc += 1
    elif code in (0x15, 0x35, 0x45):
      hit = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
      pc += 1 + (jt if hit else jf)
    elif code == 0x06:
      return k
    else:
      raise AssertionError(f"unexpected opcode {code:#x}")


@pytest.mark.parametrize("machine,arch,nrs", [
    ("x86_64", 0xC000003E, {"read": 0, "fork": 57, "vfork": 58, "clone": 56, "ptrace": 101,
                            "bpf": 321, "mmap": 9}),
    ("aarch64", 0xC00000B7, {"read": 63, "clone": 220, "ptrace": 117, "bpf": 280,
                             "mmap": 222}),
])
def test_seccomp_filter_decisions(machine, arch, nrs):
  prog = seccomp_filter(machine)
  allow, eperm, enosys = 0x7FFF0000, 0x50001, 0x50026
  assert _run_bpf(prog, nrs["read"], arch) == allow
  assert _run_bpf(prog, nrs["mmap"], arch) == allow
  assert _run_bpf(prog, nrs["ptrace"], arch) == eperm
  assert _run_bpf(prog, nrs["bpf"], arch) == eperm
  assert _run_bpf(prog, 435, arch) == enosys
  assert _run_bpf(prog, nrs["clone"], arch, 0x11) == eperm            # fork-like
  assert _run_bpf(prog, nrs["clone"], arch, 0x3D0F00) == allow        # pthread flags
  assert _run_bpf(prog, nrs["read"], 0x40000003) == eperm             # i386 ABI
  if machine == "x86_64":
    assert _run_bpf(prog, nrs["fork"], arch) == eperm
    assert _run_bpf(prog, nrs["vfork"], arch) == eperm
    assert _run_bpf(prog, 0x40000000 | 0, arch) == eperm              # x32 ABI
  # bwrap's filter: the same, but the harness may fork the program process.
  outer = seccomp_filter(machine, allow_fork=True)
  assert _run_bpf(outer, nrs["clone"], arch, 0x11) == allow
  assert _run_bpf(outer, nrs["clone"], arch, 0x3D0F00) == allow
  assert _run_bpf(outer, nrs["ptrace"], arch) == eperm
  assert _run_bpf(outer, nrs["bpf"], arch) == eperm
  assert _run_bpf(outer, 435, arch) == enosys
  assert _run_bpf(outer, nrs["read"], 0x40000003) == eperm
  if machine == "x86_64":
    assert _run_bpf(outer, nrs["fork"], arch) == allow
    assert _run_bpf(outer, nrs["vfork"], arch) == allow
