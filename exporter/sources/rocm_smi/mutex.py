"""Repair the /dev/shm/rocm_smi_* card mutexes a killed worker left behind — and only those.

librocm_smi64 guards each card with a process-shared, robust, recursive pthread mutex kept in
/dev/shm/rocm_smi_<cardN>. When a worker is killed while one of its threads holds it (a read
stuck on a hung GPU), the kernel marks the mutex "owner died". The next rsmi_init takes it,
gets EOWNERDEAD, makes it consistent — and never unlocks it: from then on that card's calls from
any other thread or process block forever (measured with 5.2.3; the library's own message says to
delete the files). So before starting a new worker we look at each file and, if its owner is a
thread of our dead worker, repair it: trylock (EOWNERDEAD) -> pthread_mutex_consistent -> unlock.
A mutex that cannot be repaired that way is unlinked so the next rsmi_init creates a fresh one.

A mutex owned by anyone else (another rocm-smi, a live thread) is never touched.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import struct
from collections.abc import Collection
from dataclasses import dataclass

# glibc x86-64 struct __pthread_mutex_s: int __lock; unsigned __count; int __owner; ...
MUTEX_BYTES = 40
FUTEX_TID_MASK = 0x3FFFFFFF
FUTEX_OWNER_DIED = 0x40000000
FILE_PREFIX = "rocm_smi_"


@dataclass(frozen=True, slots=True)
class MutexState:
    lock_tid: int  # thread id in the futex word (0 once the kernel has marked the owner dead)
    owner_died: bool
    owner: int  # glibc's __owner: the last owner's tid, left in place when it died
    count: int


def parse_mutex(raw: bytes) -> MutexState | None:
    """The state of a glibc pthread mutex from its first bytes; None when too short."""
    if len(raw) < 16:
        return None
    lock, count, owner = struct.unpack_from("<IIi", raw, 0)
    return MutexState(lock & FUTEX_TID_MASK, bool(lock & FUTEX_OWNER_DIED), owner, count)


def owned_by(state: MutexState, dead_tids: Collection[int]) -> bool:
    """Whether the mutex is held by (or was abandoned by) one of the given dead threads."""
    if state.lock_tid and state.lock_tid in dead_tids:
        return True
    return state.owner_died and state.lock_tid == 0 and state.owner in dead_tids


def repair_abandoned_mutexes(shm_dir: str, dead_tids: Collection[int]) -> list[str]:
    """Repair (or remove) the card mutexes the given dead threads held. Returns what was done."""
    actions: list[str] = []
    if not dead_tids:
        return actions
    try:
        names = sorted(os.listdir(shm_dir))
    except OSError:
        return actions
    for name in names:
        if not name.startswith(FILE_PREFIX):
            continue
        path = os.path.join(shm_dir, name)
        try:
            with open(path, "rb") as handle:
                state = parse_mutex(handle.read(MUTEX_BYTES))
        except OSError:
            continue
        if state is None or not owned_by(state, dead_tids):
            continue
        outcome = _make_consistent(path)
        if outcome == "busy":  # taken over by a live thread since we looked: not ours to touch
            continue
        if outcome == "repaired":
            actions.append(f"repaired {name}")
        else:
            try:
                os.unlink(path)
                actions.append(f"removed {name}")
            except OSError as error:
                actions.append(f"could not remove {name}: {error.strerror}")
    return actions


def _make_consistent(path: str) -> str:
    """trylock -> (EOWNERDEAD) consistent -> unlock on the mutex mapped from `path`.

    Returns "repaired", "busy" (a live thread holds it) or "unrecoverable".
    """
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return "unrecoverable"
    try:
        if os.fstat(fd).st_size < MUTEX_BYTES:
            return "unrecoverable"
        area = mmap.mmap(fd, MUTEX_BYTES)
    finally:
        os.close(fd)
    holder = ctypes.c_char.from_buffer(area)
    try:
        address = ctypes.addressof(holder)
        result = libc.pthread_mutex_trylock(ctypes.c_void_p(address))
        if result == errno.EOWNERDEAD:
            repaired = libc.pthread_mutex_consistent(ctypes.c_void_p(address)) == 0
            libc.pthread_mutex_unlock(ctypes.c_void_p(address))
            return "repaired" if repaired else "unrecoverable"
        if result == 0:  # somebody already repaired it
            libc.pthread_mutex_unlock(ctypes.c_void_p(address))
            return "repaired"
        return "busy" if result == errno.EBUSY else "unrecoverable"  # e.g. ENOTRECOVERABLE
    finally:
        del holder
        area.close()
