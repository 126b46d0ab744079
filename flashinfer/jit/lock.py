"""One file lock per module, so concurrent processes compile a module once.

Locks are an optimization, never needed for correctness: builds publish their
results by atomic rename. So:

- ``filelock`` uses ``fcntl.flock``: the kernel drops a lock when its holder dies, and
  a later process takes it at once; the owner record left behind is reported.
- The holder records itself (host, pid, start) beside the lock; a waiting process
  says who holds the lock and for how long, every few seconds.
- A lock held past FLASHINFER_JIT_LOCK_TIMEOUT (a hung holder, or one on another host
  of a network filesystem) is taken over with a warning: the waiter builds in a
  private staging dir instead of waiting forever.
- Where the filesystem refuses locks (some NFS setups), the build goes on without one,
  in a private staging dir.

``module_lock`` yields True when the lock is held, False when the caller must build
lock-free.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any, Iterator

from filelock import FileLock, Timeout

from ..config import config
from . import env

logger = logging.getLogger("flashinfer.jit")

_FIRST_WAIT_S = 1.0
_REPORT_EVERY_S = 10.0
_REFUSED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EACCES, errno.EPERM, errno.EIO}


def _owner_path(lock_path: Path) -> Path:
    return lock_path.with_name(lock_path.name + ".owner")


def read_owner(lock_path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(_owner_path(lock_path).read_text())
    except (OSError, ValueError):
        return None


def _describe_owner(owner: dict[str, Any] | None) -> str:
    if not owner:
        return "an unknown process"
    age = time.time() - float(owner.get("since", time.time()))
    return f"pid {owner.get('pid')} on {owner.get('host')} for {age:.0f} s"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _record_owner(lock_path: Path) -> None:
    previous = read_owner(lock_path)
    host = socket.gethostname()
    if previous and previous.get("host") == host and not pid_alive(int(previous.get("pid", 0))):
        logger.warning(
            "taking over the lock %s left by pid %s, which died while building",
            lock_path,
            previous.get("pid"),
        )
    record = {"host": host, "pid": os.getpid(), "since": time.time()}
    try:
        _owner_path(lock_path).write_text(json.dumps(record))
    except OSError:
        pass


def _clear_owner(lock_path: Path) -> None:
    try:
        _owner_path(lock_path).unlink()
    except OSError:
        pass


@contextlib.contextmanager
def module_lock(uri: str) -> Iterator[bool]:
    path = env.lock_path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    timeout = config.jit_lock_timeout
    start = time.monotonic()
    acquired = False
    try:
        try:
            lock.acquire(timeout=_FIRST_WAIT_S)
            acquired = True
        except Timeout:
            while not acquired:
                waited = time.monotonic() - start
                if waited >= timeout:
                    logger.warning(
                        "lock for %s held by %s past FLASHINFER_JIT_LOCK_TIMEOUT=%g s; "
                        "building in a private staging dir instead",
                        uri,
                        _describe_owner(read_owner(path)),
                        timeout,
                    )
                    break
                logger.info(
                    "waiting for %s: being built by %s (lock %s)",
                    uri,
                    _describe_owner(read_owner(path)),
                    path,
                )
                try:
                    lock.acquire(timeout=min(_REPORT_EVERY_S, timeout - waited))
                    acquired = True
                    logger.info("lock for %s acquired after %.1f s", uri, time.monotonic() - start)
                except Timeout:
                    pass
    except OSError as err:
        if err.errno not in _REFUSED:
            raise
        logger.warning(
            "the filesystem refused a lock on %s (%s); building without one, "
            "in a private staging dir",
            path,
            os.strerror(err.errno or 0),
        )
    if not acquired:
        yield False
        return
    _record_owner(path)
    try:
        yield True
    finally:
        _clear_owner(path)
        lock.release()
