"""Oncilla from Python: allocate memory anywhere in an Oncilla cluster and
copy to and from it, with zero-copy views for NumPy, DLPack (PyTorch, JAX,
CuPy) and the CUDA array interface.

    import oncilla
    ocm = oncilla.connect()                    # ONCILLA_SOCKET, as liboncilla
    with ocm.alloc(64 << 20, "remote-host", policy="spread", stripe=1 << 20) as a:
        a.copy_in(0, b"hello")
        assert a.copy_out(0, 5) == b"hello"

Every copy and wait releases the GIL. Errors are subclasses of
:class:`OncillaError`, one per kind of failure.

This module holds the pure-Python parts: the :class:`Kind` and
:class:`Policy` enums, :func:`copy`, and :class:`Batch` (copies run in the
background, as a :class:`concurrent.futures.Future` or awaited from
``asyncio``). The rest is the extension ``oncilla._oncilla``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import os
import sys
import threading
from typing import Any, Callable, List, Optional

from ._oncilla import (  # noqa: F401  (re-exported)
    AgentUnreachable,
    AlreadyExists,
    Allocation,
    CapacityExhausted,
    FabricError,
    GpuError,
    InternalError,
    InUse,
    InvalidArgument,
    MapError,
    Mapping,
    NodeDown,
    NodeUnreachable,
    NoGpu,
    NotFound,
    OncillaError,
    OutOfBounds,
    PermissionDenied,
    QuotaExceeded,
    Session,
    TokenError,
    Unavailable,
    __version__,
    connect,
)

if sys.version_info >= (3, 12):
    # PEP 688: setting `__buffer__` on a class installs its buffer slots
    # (the extension's class gets them no other way under the 3.9 stable
    # ABI), so memoryview(alloc) and bytes-like use work directly.
    for _cls in (Allocation, Mapping):
        for _name in ("__buffer__", "__release_buffer__"):
            setattr(_cls, _name, _cls.__dict__[_name])
    del _cls, _name

__all__ = [
    "AgentUnreachable",
    "AlreadyExists",
    "Allocation",
    "Batch",
    "CapacityExhausted",
    "FabricError",
    "GpuError",
    "InUse",
    "InternalError",
    "InvalidArgument",
    "Kind",
    "MapError",
    "Mapping",
    "NoGpu",
    "NodeDown",
    "NodeUnreachable",
    "NotFound",
    "OncillaError",
    "OutOfBounds",
    "PermissionDenied",
    "QuotaExceeded",
    "Policy",
    "Session",
    "TokenError",
    "Unavailable",
    "connect",
    "copy",
]


class Kind(str, enum.Enum):
    """What memory an allocation is made of (values as ``ocmctl`` names them)."""

    LOCAL_HOST = "local-host"
    """Host memory of this node (the local agent's pool), mapped in this process."""
    REMOTE_HOST = "remote-host"
    """Host memory anywhere in the cluster, placed by the policy."""
    LOCAL_GPU = "local-gpu"
    """Device memory of one of this node's GPUs, in this process."""
    REMOTE_GPU = "remote-gpu"
    """Device memory of a GPU held by an agent anywhere in the cluster."""

    def __str__(self) -> str:
        return self.value


class Policy(str, enum.Enum):
    """How the master chooses nodes when none are named."""

    LOCAL_FIRST = "local-first"
    """This node if it holds it all, else the emptiest node that does, else spill over."""
    SPREAD = "spread"
    """An equal share on every node with room (stripe it to use them all)."""
    PACK = "pack"
    """As few nodes as possible."""

    def __str__(self) -> str:
        return self.value


def copy(dst: Allocation, dst_offset: int, src: Allocation, src_offset: int, n: int) -> None:
    """Copies ``n`` bytes from ``src`` at ``src_offset`` to ``dst`` at
    ``dst_offset``, between any two kinds, with no bounce through this
    process where none is needed (two remote allocations: the agents move
    the bytes between themselves)."""
    dst.copy_from(dst_offset, src, src_offset, n)


def _default_workers() -> int:
    return max(4, min(32, (os.cpu_count() or 4) * 2))


_POOL_LOCK = threading.Lock()
_POOL: Optional[concurrent.futures.ThreadPoolExecutor] = None


def _forget_pool() -> None:
    """A forked child has none of its parent's threads: it makes its own pool."""
    global _POOL, _POOL_LOCK
    _POOL = None
    _POOL_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    """The threads batches run on (each copy releases the GIL)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = concurrent.futures.ThreadPoolExecutor(
                max_workers=_default_workers(), thread_name_prefix="oncilla-batch"
            )
        return _POOL


class Batch:
    """Copies to run together in the background, with no order among them.

    Add copies, then :meth:`submit` for a :class:`concurrent.futures.Future`
    (its result is ``None`` once every copy is done; its exception the first
    failure) or ``await batch`` from ``asyncio``. A training loop prefetches
    the next chunk this way while it computes on the current one. The
    objects given stay referenced until the batch ends. A submitted batch
    cannot be cancelled: its copies are already moving bytes into the
    buffers given (cancelling a task that awaits it leaves them to finish).
    """

    def __init__(self) -> None:
        self._ops: List[Callable[[], None]] = []
        self._future: Optional[concurrent.futures.Future] = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._ops)

    def copy_in(self, alloc: Allocation, offset: int, data: Any) -> "Batch":
        """Writes ``data`` (any buffer) at ``offset`` of ``alloc``."""
        self._add(lambda: alloc.copy_in(offset, data))
        return self

    def copy_out_into(self, alloc: Allocation, offset: int, buffer: Any) -> "Batch":
        """Reads ``len(buffer)`` bytes at ``offset`` of ``alloc`` into ``buffer``."""
        self._add(lambda: alloc.copy_out_into(offset, buffer))
        return self

    def copy(self, dst: Allocation, dst_offset: int, src: Allocation, src_offset: int, n: int) -> "Batch":
        """As :func:`oncilla.copy`."""
        self._add(lambda: dst.copy_from(dst_offset, src, src_offset, n))
        return self

    def _add(self, op: Callable[[], None]) -> None:
        with self._lock:
            if self._future is not None:
                raise InvalidArgument("this batch was submitted already; make a new one")
            self._ops.append(op)

    def submit(self) -> concurrent.futures.Future:
        """Starts every copy and returns at once (again: the same future)."""
        with self._lock:
            if self._future is not None:
                return self._future
            done: concurrent.futures.Future = concurrent.futures.Future()
            # Running from now on: it can no longer be cancelled.
            done.set_running_or_notify_cancel()
            self._future = done
            ops = list(self._ops)
        if not ops:
            done.set_result(None)
            return done
        left = [len(ops)]
        errors: List[BaseException] = []
        lock = threading.Lock()

        def finished(part: concurrent.futures.Future) -> None:
            error = part.exception()
            with lock:
                if error is not None:
                    errors.append(error)
                left[0] -= 1
                last = left[0] == 0
            if last:
                if errors:
                    done.set_exception(errors[0])
                else:
                    done.set_result(None)

        pool = _pool()
        for op in ops:
            try:
                part = pool.submit(op)
            except RuntimeError as e:  # the pool shut down (interpreter exit)
                part = concurrent.futures.Future()
                part.set_exception(e)
            part.add_done_callback(finished)
        return done

    def wait(self, timeout: Optional[float] = None) -> None:
        """Submits (if not yet) and waits for every copy; raises the first failure."""
        self.submit().result(timeout)

    def __await__(self):
        return asyncio.wrap_future(self.submit()).__await__()
