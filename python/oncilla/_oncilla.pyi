"""Type stubs for the extension module ``oncilla._oncilla`` (re-exported by
``oncilla``)."""

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import Kind, Policy

__version__: str

class OncillaError(Exception):
    """Base class of every Oncilla error."""

class AgentUnreachable(OncillaError, ConnectionError):
    """The local agent's socket cannot be reached (is oncillad running? ONCILLA_SOCKET)."""

class Unavailable(OncillaError, ConnectionError):
    """The master or another daemon could not be reached."""

class NotFound(OncillaError, LookupError):
    """No such allocation (unknown, or already freed)."""

class CapacityExhausted(OncillaError, MemoryError):
    """Not enough free memory; the message says where what is free."""

class QuotaExceeded(CapacityExhausted):
    """The request would take this user past a quota (the message names it)."""

class PermissionDenied(OncillaError, PermissionError):
    """Wrong credential or key, or another session's allocation."""

class InvalidArgument(OncillaError, ValueError):
    """A request that is malformed or cannot be met as asked."""

class NodeDown(OncillaError, ConnectionError):
    """A named node is down."""

class AlreadyExists(OncillaError, FileExistsError):
    """The name is taken by another allocation."""

class InUse(OncillaError, RuntimeError):
    """Other processes (or live views) still use it."""

class OutOfBounds(OncillaError, IndexError):
    """A copy outside the allocation."""

class MapError(OncillaError):
    """Remote memory cannot be mapped here (userfaultfd not allowed, kernel too old, GPU memory), or its paging failed."""

class NodeUnreachable(OncillaError, ConnectionError):
    """A node holding bytes of the allocation cannot be reached."""

class FabricError(OncillaError, ConnectionError):
    """The data path to a node failed."""

class NoGpu(OncillaError):
    """GPU memory was asked for where there is none; the message says why."""

class GpuError(OncillaError):
    """The CUDA driver failed a copy or an allocation."""

class TokenError(OncillaError):
    """No usable cluster token."""

class InternalError(OncillaError, RuntimeError):
    """A bug or an unexpected answer."""

def connect(socket: Optional[str] = None) -> Session:
    """Connects to the local agent as liboncilla does (``ONCILLA_SOCKET`` or
    ``socket``, and the other ``ONCILLA_*`` settings)."""

class Session:
    """A session with the local agent; its allocations end with it unless persistent."""

    @property
    def node(self) -> str:
        """The name of this node."""
    @property
    def session_id(self) -> str:
        """This session's id, as ``ocmctl allocs`` shows it."""
    def alloc(
        self,
        size: int,
        kind: Union[Kind, str, None] = None,
        *,
        policy: Union[Policy, str, None] = None,
        nodes: Optional[Sequence[str]] = None,
        weights: Optional[Sequence[int]] = None,
        stripe: Optional[int] = None,
        name: Optional[str] = None,
        persistent: bool = False,
        shared: bool = False,
        gpu: Optional[int] = None,
        fabric: Optional[str] = None,
        replicas: Optional[int] = None,
    ) -> Allocation:
        """Allocates ``size`` bytes of ``kind`` (remote host memory by default),
        placed by ``policy`` or on ``nodes`` (with ``weights``), striped in
        ``stripe``-byte units, optionally ``name``d (persistent),
        ``persistent``, ``shared`` with other users, on GPU ``gpu``, reached
        over ``fabric`` (``"auto"``, ``"tcp"``, ``"shm"``, ``"verbs"``), kept
        in ``replicas`` copies (1 to 3) on different nodes: reads survive the
        loss of a copy."""
    def alloc_many(
        self,
        size: int,
        count: int,
        kind: Union[Kind, str, None] = None,
        *,
        policy: Union[Policy, str, None] = None,
        nodes: Optional[Sequence[str]] = None,
        weights: Optional[Sequence[int]] = None,
        stripe: Optional[int] = None,
        gpu: Optional[int] = None,
        fabric: Optional[str] = None,
        replicas: Optional[int] = None,
    ) -> List[Allocation]:
        """Makes ``count`` (1 to 256) allocations of ``size`` bytes of
        ``kind`` together: one call to the master, all or none. Each is an
        allocation of its own, placed and reached as ``alloc`` says; none is
        named or persistent (those are made one at a time)."""
    def free_many(self, allocs: Sequence[Allocation]) -> None:
        """Frees 1 to 256 of this session's allocations together: one call
        to the master, all or none. When one may not be freed (views of it
        alive, mapped, another process attached), none is and every handle
        stays open; once freed, each is closed."""
    def attach(self, alloc: Union[str, int]) -> Allocation:
        """Attaches a persistent allocation by name or id."""
    def copy(self, dst: Allocation, dst_offset: int, src: Allocation, src_offset: int, n: int) -> None:
        """Copies ``n`` bytes between two allocations of any kinds."""

class Allocation:
    """An allocation. A context manager: leaving the block frees a session
    allocation and detaches a persistent one (with views alive it only
    closes the handle; the memory goes with the last view)."""

    @property
    def id(self) -> int:
        """The allocation's id."""
    @property
    def size(self) -> int:
        """Its size in bytes."""
    @property
    def kind(self) -> Kind:
        """Its kind."""
    @property
    def name(self) -> Optional[str]:
        """Its name, for a named allocation."""
    @property
    def persistent(self) -> bool:
        """True when it outlives this session."""
    @property
    def nodes(self) -> List[str]:
        """The nodes holding its bytes, in the order of the bytes."""
    @property
    def extents(self) -> List[Dict[str, Any]]:
        """Every extent: ``offset``, ``len``, ``node``, ``gpu`` and the ``fabric`` used."""
    def __len__(self) -> int: ...
    def copy_in(self, offset: int, data: Any) -> None:
        """Writes the bytes of ``data`` (any buffer) at ``offset``."""
    def copy_out(self, offset: int, n: int) -> bytes:
        """Reads ``n`` bytes at ``offset``."""
    def copy_out_into(self, offset: int, buffer: Any) -> None:
        """Reads ``len(buffer)`` bytes at ``offset`` into a writable buffer."""
    def copy_from(self, offset: int, src: Allocation, src_offset: int, n: int) -> None:
        """Copies ``n`` bytes from ``src`` into this allocation (``oncilla.copy``)."""
    def free(self) -> None:
        """Frees it now (``InUse`` while views may be alive or others are attached)."""
    def force_free(self) -> None:
        """Frees it even while other processes are attached."""
    def __enter__(self) -> Allocation: ...
    def __exit__(self, *exc: Any) -> bool: ...
    def map(
        self,
        *,
        block: Optional[int] = None,
        read_ahead: Optional[int] = None,
        budget: Optional[int] = None,
        timeout: Optional[float] = None,
        threads: Optional[int] = None,
    ) -> Mapping:
        """Maps the allocation into this process; remote memory is fetched in blocks as it is touched."""
    def view(self) -> memoryview:
        """A writable memoryview of local host memory, no copy."""
    def __buffer__(self, flags: int) -> memoryview:
        """PEP 688: ``memoryview(alloc)`` on CPython 3.12 and later."""
    def __release_buffer__(self, view: memoryview) -> None: ...
    def __array__(self, dtype: Any = None, copy: Optional[bool] = None) -> Any:
        """``numpy.asarray(alloc)``: local host memory as a uint8 array, no copy (``copy=True`` copies)."""
    def __dlpack__(
        self,
        *,
        stream: Optional[int] = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """A DLPack capsule of the memory in this process (uint8), no copy."""
    def __dlpack_device__(self) -> Tuple[int, int]:
        """``(1, 0)`` for host memory, ``(2, gpu)`` for GPU memory."""
    def cuda_view(self) -> _ViewLease:
        """Local GPU memory for CUDA consumers (CuPy, Numba, ``torch.as_tensor``), no copy;
        the allocation can be freed once the view and what was made from it are gone."""
    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        """The CUDA array interface of local GPU memory (uint8); keeps the memory as long as
        this object (``cuda_view()`` gives a view that ends)."""

class _ViewLease:
    """A view's hold on an allocation's memory (what ``Allocation.cuda_view()`` returns, and
    the base of NumPy views): the memory is not freed while it lives."""
    @property
    def __array_interface__(self) -> Dict[str, Any]: ...
    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]: ...

class Mapping:
    """A mapped allocation (``Allocation.map()``): ``numpy.asarray(m)``,
    ``m.view()`` and (3.12+) ``memoryview(m)`` are its memory, no copy.
    Writes reach the allocation at ``flush()``; ``invalidate()`` drops clean
    cached blocks. A context manager: leaving the block unmaps."""

    def __len__(self) -> int: ...
    def flush(self, offset: int = 0, length: Optional[int] = None) -> None: ...
    def invalidate(self, offset: int = 0, length: Optional[int] = None) -> None: ...
    def unmap(self) -> None: ...
    @property
    def stats(self) -> Dict[str, int]: ...
    @property
    def last_error(self) -> Optional[str]: ...
    def view(self) -> memoryview: ...
    def __buffer__(self, flags: int) -> memoryview: ...
    def __release_buffer__(self, view: memoryview) -> None: ...
    @property
    def __array_interface__(self) -> Dict[str, Any]: ...
    def __enter__(self) -> Mapping: ...
    def __exit__(self, *exc: Any) -> bool: ...
