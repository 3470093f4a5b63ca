"""A seccomp-BPF filter for the verifier child, assembled by hand and loaded with prctl.

Why by hand: libseccomp's Python bindings locate the library with `ctypes.util.find_library`,
which spawns `ldconfig`/`gcc` - impossible (and slow) inside the sandbox. The filter is small:
a deny-list on top of bubblewrap's namespaces and the rlimits, so a missed syscall is still
contained by the other layers.

Policy: no sockets, no new processes (fork/vfork/clone without CLONE_THREAD; clone3 answers
ENOSYS so glibc falls back to clone), no exec after start-up, no ptrace or cross-process memory
access, no mount/namespace/module/keyring/bpf/io_uring calls, no SysV IPC (shm*, sem*, msg*),
POSIX message queues (mq_open) or memfd_create/memfd_secret. SysV shared memory lives in the
IPC namespace, not in the process: a detached segment escapes RLIMIT_AS (6 x 256 MB stayed
allocated past the 1 GiB limit until the sandbox died). memfds are anonymous shared memory
too, and the Python runtime needs none of these (ctypes closures map their trampolines with
mmap). Denied calls fail with EPERM so user code sees a clean PermissionError; a foreign
architecture (x32 ABI) is refused too.

Imported only by `_bootstrap.py`: standard library only.
"""

import ctypes
import errno
import os
import struct

_DENY_X86_64 = {
    "socket": 41, "connect": 42, "accept": 43, "bind": 49, "listen": 50, "socketpair": 53,
    "accept4": 288, "fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "ptrace": 101,
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272,
    "setns": 308, "bpf": 321, "perf_event_open": 298, "keyctl": 250, "add_key": 248,
    "request_key": 249, "userfaultfd": 323, "kexec_load": 246, "kexec_file_load": 320,
    "init_module": 175, "finit_module": 313, "delete_module": 176, "reboot": 169,
    "swapon": 167, "swapoff": 168, "acct": 163, "process_vm_readv": 310,
    "process_vm_writev": 311, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "open_by_handle_at": 304, "name_to_handle_at": 303,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
    "fspick": 433, "mount_setattr": 442, "personality": 135, "syslog": 103, "quotactl": 179,
    "pidfd_getfd": 438, "kcmp": 312, "process_madvise": 440,
    "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "semget": 64, "semop": 65,
    "semctl": 66, "semtimedop": 220, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71,
    "memfd_create": 319, "memfd_secret": 447, "mq_open": 240,
}  # fmt: skip
_DENY_AARCH64 = {
    "socket": 198, "socketpair": 199, "bind": 200, "listen": 201, "accept": 202,
    "connect": 203, "accept4": 242, "execve": 221, "execveat": 281, "ptrace": 117,
    "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "unshare": 97, "setns": 268,
    "bpf": 280, "perf_event_open": 241, "keyctl": 219, "add_key": 217, "request_key": 218,
    "userfaultfd": 282, "kexec_load": 104, "kexec_file_load": 294, "init_module": 105,
    "finit_module": 273, "delete_module": 106, "reboot": 142, "swapon": 224, "swapoff": 225,
    "acct": 89, "process_vm_readv": 270, "process_vm_writev": 271, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "open_by_handle_at": 265,
    "name_to_handle_at": 264, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "personality": 92,
    "syslog": 116, "quotactl": 60, "pidfd_getfd": 438, "kcmp": 272, "process_madvise": 440,
    "msgget": 186, "msgctl": 187, "msgrcv": 188, "msgsnd": 189, "semget": 190, "semctl": 191,
    "semtimedop": 192, "semop": 193, "shmget": 194, "shmctl": 195, "shmat": 196, "shmdt": 197,
    "memfd_create": 279, "memfd_secret": 447, "mq_open": 180,
}  # fmt: skip
# machine -> (AUDIT_ARCH_*, deny table, clone, clone3, first foreign-ABI number or None)
_ARCHES = {
    "x86_64": (0xC000003E, _DENY_X86_64, 56, 435, 0x40000000),
    "aarch64": (0xC00000B7, _DENY_AARCH64, 220, 435, None),
}

_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _ERRNO, _KILL = 0x7FFF0000, 0x00050000, 0x80000000
_CLONE_THREAD = 0x00010000
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2


class _Sockfprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _program(arch, deny, clone, clone3, foreign):
    """The filter as (code, jt, jf, k) tuples; labels are resolved to relative jumps."""
    body = [("ld", 4), ("jne_kill", arch), ("ld", 0)]
    if foreign is not None:
        body.append(("jge_deny", foreign))
    body += [("jeq_deny", nr) for nr in sorted(set(deny.values()))]
    body += [("jeq_enosys", clone3), ("jne_allow", clone), ("ld", 16), ("jset_allow_else_deny",)]
    ends = {"allow": len(body), "deny": len(body) + 1, "enosys": len(body) + 2}
    ends["kill"] = len(body) + 3
    prog = []
    for pc, ins in enumerate(body):
        op = ins[0]

        def rel(label, pc=pc):
            return ends[label] - pc - 1

        if op == "ld":
            prog.append((_LD_ABS, 0, 0, ins[1]))
        elif op == "jne_kill":
            prog.append((_JEQ, 0, rel("kill"), ins[1]))
        elif op == "jge_deny":
            prog.append((_JGE, rel("deny"), 0, ins[1]))
        elif op == "jeq_deny":
            prog.append((_JEQ, rel("deny"), 0, ins[1]))
        elif op == "jeq_enosys":
            prog.append((_JEQ, rel("enosys"), 0, ins[1]))
        elif op == "jne_allow":
            prog.append((_JEQ, 0, rel("allow"), ins[1]))
        else:  # clone: a thread (CLONE_THREAD set) is allowed, a new process is not
            prog.append((_JSET, rel("allow"), rel("deny"), _CLONE_THREAD))
    prog += [
        (_RET, 0, 0, _ALLOW),
        (_RET, 0, 0, _ERRNO | errno.EPERM),
        (_RET, 0, 0, _ERRNO | errno.ENOSYS),
        (_RET, 0, 0, _KILL),
    ]
    assert all(0 <= jt < 256 and 0 <= jf < 256 for _, jt, jf, _ in prog)
    return prog


def install():
    """Load the filter into this process (irreversible). Raises OSError when it cannot."""
    machine = os.uname().machine
    if machine not in _ARCHES:
        raise OSError(errno.ENOSYS, f"no seccomp policy for architecture {machine}")
    prog = _program(*_ARCHES[machine])
    raw = b"".join(struct.pack("=HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))
    fprog = _Sockfprog(len(prog), ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [
        ctypes.c_int,
        ctypes.c_ulong,
        ctypes.c_void_p,
        ctypes.c_ulong,
        ctypes.c_ulong,
    ]
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
