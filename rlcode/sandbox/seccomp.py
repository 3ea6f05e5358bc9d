"""The seccomp filter of sandboxed programs: no new processes, less kernel surface.

`seccomp_filter` assembles a classic-BPF program in the format bwrap's
--seccomp reads (and prctl(PR_SET_SECCOMP) takes). This module only builds
bytes: bwrap installs the filter that allows the harness's fork, and each
sandboxed process installs the strict one itself (harness.py).
"""

from __future__ import annotations

import struct

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_NR_CLONE = {"x86_64": 56, "aarch64": 220}
_NR_CLONE3 = 435
_NR_FORK = {"x86_64": {"fork": 57, "vfork": 58}, "aarch64": {}}
_NR_DENY = {
    "x86_64": {
        "ptrace": 101, "mount": 165, "add_key": 248,
        "request_key": 249, "keyctl": 250, "unshare": 272, "perf_event_open": 298,
        "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311, "bpf": 321,
        "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427},
    "aarch64": {
        "mount": 40, "unshare": 97, "ptrace": 117, "add_key": 217,
        "request_key": 218, "keyctl": 219, "perf_event_open": 241, "setns": 268,
        "process_vm_readv": 270, "process_vm_writev": 271, "bpf": 280,
        "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427},
}
_CLONE_THREAD = 0x00010000
_X32_SYSCALL_BIT = 0x40000000


def seccomp_filter(machine: str, *, allow_fork: bool = False) -> bytes:
  """A classic-BPF seccomp program (bwrap --seccomp format) for `machine`.

  Denied with EPERM: fork, vfork, clone without CLONE_THREAD, the syscalls of
  _NR_DENY, every syscall of a foreign ABI (i386, x32); clone3 gets ENOSYS so
  glibc falls back to clone, whose flags the filter can read. With
  `allow_fork`, fork, vfork and every clone are allowed (the harness's one fork
  happens under this filter; each process then adds the strict one).
  """
  if machine not in AUDIT_ARCH:
    raise ValueError(f"no seccomp filter for machine {machine!r}; known: {sorted(AUDIT_ARCH)}")
  ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
  allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
  # (op, k, true target label, false target label); labels resolve below.
  code: list[tuple[int, int, str | None, str | None]] = [
      (ld, 4, None, None),
      (jeq, AUDIT_ARCH[machine], None, "eperm"),
      (ld, 0, None, None),
  ]
  if machine == "x86_64":
    code.append((jge, _X32_SYSCALL_BIT, "eperm", None))
  denied = dict(_NR_DENY[machine], **({} if allow_fork else _NR_FORK[machine]))
  code += [(jeq, nr, "eperm", None) for nr in sorted(denied.values())]
  code.append((jeq, _NR_CLONE3, "enosys", None))
  if not allow_fork:
    code.append((jeq, _NR_CLONE[machine], "clone", None))
  code.append((ret, allow, None, None))
  labels = {}
  if not allow_fork:
    labels["clone"] = len(code)
    code += [(ld, 16, None, None), (jset, _CLONE_THREAD, "allow", "eperm")]
  labels.update(allow=len(code), eperm=len(code) + 1, enosys=len(code) + 2)
  code += [(ret, allow, None, None), (ret, eperm, None, None), (ret, enosys, None, None)]
  out = b""
  for i, (op, k, jt, jf) in enumerate(code):
    rel = lambda label, i=i: 0 if label is None else labels[label] - i - 1
    out += struct.pack("<HBBI", op, rel(jt), rel(jf), k)
  return out

