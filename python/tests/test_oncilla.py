"""`import oncilla` against a real local cluster (conftest.py): every call,
every kind pair (GPU pairs skip with the reason where there is no GPU),
zero-copy views proven by writing through them, view lifetimes, errors,
batches as futures and from asyncio, and threads copying at once with the
GIL released. Every loop is bounded."""

from __future__ import annotations

import array
import asyncio
import gc
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import oncilla
from conftest import allocation_ids, ocmctl

MiB = 1 << 20


def pattern(n: int, seed: int) -> bytes:
    return ((np.arange(n, dtype=np.uint64) * 31 + seed) % 251).astype(np.uint8).tobytes()


def assert_freed(cluster, ident: int, why: str) -> None:
    """The master stops listing `ident` (the release runs on a thread of
    its own after the last reference goes); at most 50 listings."""
    for _ in range(3):
        gc.collect()
    ids = set()
    for _ in range(50):
        ids = allocation_ids(cluster)
        if ident not in ids:
            return
    assert ident not in ids, why


def gpu_or_skip(ocm):
    try:
        a = ocm.alloc(MiB, "local-gpu")
    except oncilla.NoGpu as e:
        pytest.skip(str(e))
    a.free()


def test_connect_names_the_node_and_session(ocm):
    assert ocm.node == "node-0"
    assert ocm.session_id.startswith("node-0-")
    assert "node-0" in repr(ocm)
    assert isinstance(oncilla.__version__, str)


def test_alloc_takes_kinds_and_policies_by_name_or_member(ocm):
    with ocm.alloc(3 * MiB + 5, oncilla.Kind.REMOTE_HOST, policy=oncilla.Policy.SPREAD, stripe=MiB) as a:
        assert a.kind is oncilla.Kind.REMOTE_HOST
        assert a.size == 3 * MiB + 5 and len(a) == a.size
        assert a.nodes == ["node-0", "node-1", "node-2"]
        ext = a.extents
        assert [e["offset"] for e in ext] == [0, MiB, 2 * MiB, 3 * MiB]
        assert sum(e["len"] for e in ext) == a.size
        assert all(e["gpu"] is None and e["fabric"] in ("shm", "tcp", "verbs") for e in ext)
        r = repr(a)
        assert f"id={a.id}" in r and "remote-host" in r and "node-2" in r and "extents=4" in r
    with ocm.alloc(MiB, "remote-host", nodes=["node-1", "node-2"], weights=[3, 1], policy="pack") as a:
        assert a.nodes == ["node-1", "node-2"]
        assert a.extents[0]["len"] == 3 * MiB // 4
    with ocm.alloc(4096, "local-host") as a:
        assert a.nodes == ["node-0"] and a.kind == "local-host"


def test_copy_in_and_out_with_every_buffer_kind(ocm):
    with ocm.alloc(2 * MiB, nodes=["node-1"]) as a:
        data = pattern(MiB, 1)
        for obj in (data, bytearray(data), memoryview(data), np.frombuffer(data, np.uint8),
                    array.array("B", data)):
            a.copy_in(7, obj)
            assert a.copy_out(7, MiB) == data
        into = bytearray(MiB)
        a.copy_out_into(7, into)
        assert bytes(into) == data
        arr = np.zeros(MiB // 8, np.uint64)
        a.copy_out_into(7, arr)
        assert arr.tobytes() == data
        a.copy_in(0, b"")
        assert a.copy_out(0, 0) == b""
        with pytest.raises((BufferError, ValueError), match="contiguous"):
            a.copy_in(0, np.zeros((64, 64), np.uint8)[:, ::2])
        with pytest.raises((BufferError, TypeError)):
            a.copy_out_into(0, data)  # bytes are read-only
        with pytest.raises(TypeError):
            a.copy_in(0, "a str is no buffer")


def test_every_host_kind_pair_copies(ocm):
    n = 3 * MiB + 123
    specs = {
        "local-host": dict(kind="local-host"),
        "remote-host": dict(kind="remote-host", nodes=["node-1"]),
        "striped": dict(kind="remote-host", policy="spread", stripe=MiB),
    }
    allocs = {k: (ocm.alloc(n + 8192, **s), ocm.alloc(n + 8192, **s)) for k, s in specs.items()}
    try:
        for i, (src_kind, (src, _)) in enumerate(allocs.items()):
            data = pattern(n, i)
            src.copy_in(4096, data)
            for dst_kind, (one, two) in allocs.items():
                dst = two if dst_kind == src_kind else one
                oncilla.copy(dst, 11, src, 4096, n)
                assert dst.copy_out(11, n) == data, f"{src_kind} -> {dst_kind}"
        with pytest.raises(oncilla.InvalidArgument, match="overlap"):
            src.copy_from(10, src, 0, 100)
    finally:
        for one, two in allocs.values():
            one.free()
            two.free()


def test_gpu_kind_pairs(ocm):
    gpu_or_skip(ocm)
    n = 4 * MiB
    kinds = ["local-host", "remote-host", "local-gpu", "remote-gpu"]
    allocs = [ocm.alloc(n, k, nodes=["node-1"] if k.startswith("remote") else None) for k in kinds]
    data = pattern(n, 9)
    for i, src in enumerate(allocs):
        src.copy_in(0, data)
        for j, dst in enumerate(allocs):
            if i != j:
                oncilla.copy(dst, 0, src, 0, n)
                assert dst.copy_out(0, n) == data, f"{kinds[i]} -> {kinds[j]}"
    gpu = allocs[2]
    assert gpu.__dlpack_device__()[0] == 2
    cai = gpu.__cuda_array_interface__
    assert cai["shape"] == (n,) and cai["data"][0] != 0
    torch = pytest.importorskip("torch", reason="PyTorch not installed")
    t = torch.from_dlpack(gpu)
    assert t.is_cuda and t.numel() == n
    assert bytes(t[:16].cpu().numpy()) == data[:16]
    t[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8, device=t.device)
    torch.cuda.synchronize()
    assert gpu.copy_out(0, 4) == bytes([1, 2, 3, 4])


def test_gpu_memory_frees_once_its_cuda_views_are_gone(ocm):
    gpu_or_skip(ocm)
    a = ocm.alloc(MiB, "local-gpu")
    a.copy_in(0, b"oncilla")
    v = a.cuda_view()
    cai = v.__cuda_array_interface__
    assert cai["shape"] == (MiB,) and cai["data"][0] != 0 and cai["stream"] is None
    with pytest.raises(oncilla.InvalidArgument, match="GPU memory"):
        v.__array_interface__
    with pytest.raises(oncilla.InUse, match="cuda_view"):
        a.free()
    torch = pytest.importorskip("torch", reason="PyTorch not installed")
    t = torch.as_tensor(v, device="cuda")  # keeps the view as its owner
    assert t.data_ptr() == cai["data"][0]
    assert bytes(t[:7].cpu().numpy()) == b"oncilla"
    del v
    gc.collect()
    with pytest.raises(oncilla.InUse):
        a.free()  # the tensor still holds the view
    del t
    gc.collect()
    a.free()
    with pytest.raises(oncilla.NotFound):
        a.copy_out(0, 1)


def test_numpy_view_is_the_memory_itself(ocm):
    with ocm.alloc(MiB, "local-host") as a:
        v = np.asarray(a)
        assert v.dtype == np.uint8 and v.shape == (MiB,)
        ptr = v.__array_interface__["data"][0]
        assert np.asarray(a).__array_interface__["data"][0] == ptr
        v[:5] = np.frombuffer(b"hello", np.uint8)
        assert a.copy_out(0, 5) == b"hello"  # written through the view
        a.copy_in(100, b"world")
        assert bytes(v[100:105]) == b"world"  # seen through the view, no copy made
        m = a.view()
        assert m.nbytes == MiB and not m.readonly
        m[10:13] = b"abc"
        assert a.copy_out(10, 3) == b"abc"
        d = np.from_dlpack(a)
        assert d.__array_interface__["data"][0] == ptr
        a.copy_in(20, b"\x07")
        assert d[20] == 7  # the DLPack tensor is the same memory
        assert a.__dlpack_device__() == (1, 0)
        del v, m, d


@pytest.mark.skipif(
    sys.version_info < (3, 12),
    reason="memoryview(alloc) needs CPython >= 3.12 (PEP 688) under the 3.9 stable ABI; alloc.view() is tested instead",
)
def test_memoryview_of_the_allocation_itself(ocm):
    with ocm.alloc(MiB, "local-host") as a:
        m = memoryview(a)
        assert m.nbytes == MiB and m.format == "B" and not m.readonly
        m[40:43] = b"xyz"
        assert a.copy_out(40, 3) == b"xyz"
        assert np.frombuffer(a, np.uint8)[40] == ord("x")
        del m


def test_a_view_keeps_its_allocation_alive(ocm, cluster):
    with ocm.alloc(MiB, "local-host") as a:
        ident = a.id
        a.copy_in(0, b"kept")
        v = np.asarray(a)
        m = a.view()
        with pytest.raises(oncilla.InUse, match="views"):
            a.free()
    # The block closed the handle; the memory is still valid and held.
    assert bytes(v[:4]) == b"kept"
    v[:4] = np.frombuffer(b"more", np.uint8)
    assert bytes(m[:4]) == b"more"
    assert ident in allocation_ids(cluster)
    with pytest.raises(oncilla.NotFound):
        a.copy_out(0, 4)
    del a, v, m
    assert_freed(cluster, ident, "the last view's end did not free it")


def test_a_closed_session_ends_what_it_owned(cluster):
    s = oncilla.connect()
    a = s.alloc(MiB, "local-host")
    ident = a.id
    a.copy_in(0, b"gone")
    s.close()
    assert_freed(cluster, ident, "closing the session did not free what it owned")
    with pytest.raises(oncilla.InvalidArgument, match="closed"):
        s.alloc(MiB)
    s.close()  # again: nothing
    del a  # its session's end released it: dropping it says nothing
    with oncilla.connect() as t:
        b = t.alloc(MiB)
        ident = b.id
        assert ident in allocation_ids(cluster)
    assert_freed(cluster, ident, "leaving the session's with block did not free it")


def test_free_works_again_once_the_views_are_gone(ocm, cluster):
    a = ocm.alloc(MiB, "local-host")
    ident = a.id
    a.copy_in(0, b"seen")
    v, m, d = np.asarray(a), a.view(), np.from_dlpack(a)
    assert bytes(v[:4]) == b"seen" and bytes(m[:4]) == b"seen"
    with pytest.raises(oncilla.InUse, match="views"):
        a.free()
    del v, m
    gc.collect()
    with pytest.raises(oncilla.InUse, match="views"):
        a.free()  # the DLPack tensor is still alive
    del d
    gc.collect()
    a.free()
    assert_freed(cluster, ident, "free() after its views were gone did not free it")
    c = np.array(ocm.alloc(MiB, "local-host"), copy=True)
    assert c.shape == (MiB,)  # a copy holds no view


def test_dlpack_keeps_its_allocation_and_queries_mark_nothing(ocm, cluster):
    a = ocm.alloc(MiB, "local-host")
    assert a.__dlpack_device__() == (1, 0)
    a.free()  # a query handed nothing out: the free goes through
    with ocm.alloc(MiB, "local-host") as a:
        ident = a.id
        a.copy_in(0, b"dl")
        d = np.from_dlpack(a)
    assert bytes(d[:2]) == b"dl"
    assert ident in allocation_ids(cluster)
    del a, d
    assert_freed(cluster, ident, "the DLPack tensor's end did not free it")
    unused = ocm.alloc(MiB, "local-host")
    cap = unused.__dlpack__()
    del cap  # never consumed: the capsule's destructor lets go
    gc.collect()
    unused.__exit__(None, None, None)


def test_a_view_of_an_allocation_cannot_be_its_own_buffer(ocm):
    with ocm.alloc(MiB, "local-host") as a:
        v = np.asarray(a)
        with pytest.raises(oncilla.InvalidArgument, match="itself"):
            a.copy_in(0, v[8:16])
        with pytest.raises(oncilla.InvalidArgument, match="itself"):
            a.copy_out_into(0, v[100:200])
        with pytest.raises(oncilla.OutOfBounds):
            a.copy_out(0, 1 << 60)  # refused before any bytes object is made
        del v


def test_views_of_remote_memory_are_refused(ocm):
    a = ocm.alloc(MiB, nodes=["node-1"])
    with pytest.raises(oncilla.InvalidArgument, match="not local host memory"):
        a.view()
    with pytest.raises(oncilla.InvalidArgument):
        np.asarray(a)
    with pytest.raises(oncilla.InvalidArgument, match="CUDA array interface"):
        a.__cuda_array_interface__
    with pytest.raises(oncilla.InvalidArgument, match="CUDA array interface"):
        a.cuda_view()
    with ocm.alloc(MiB, "local-host") as host:
        with pytest.raises(oncilla.InvalidArgument, match="not local GPU memory"):
            host.cuda_view()
    # A refused view marks nothing: the allocation still frees at once.
    a.free()


def test_a_mapped_remote_allocation_is_a_numpy_array(ocm, cluster):
    n = 8 * MiB + 4096 + 17
    data = (np.arange(n, dtype=np.uint64) * 2654435761 >> 11).astype(np.uint8)
    a = ocm.alloc(n, nodes=["node-1"])
    ident = a.id
    a.copy_in(0, data.tobytes())
    m = a.map(budget=2 * MiB)
    assert len(m) == n and m.stats["resident"] == 0, "nothing read before a touch"
    v = np.asarray(m)
    assert v.shape == (n,) and v.dtype == np.uint8
    # Summed through the pointer, with a budget a quarter of the size.
    assert int(v.sum(dtype=np.uint64)) == int(data.sum(dtype=np.uint64))
    assert m.stats["resident"] <= 2 * MiB and m.stats["evicted"] > 0
    # Writes through the view reach the allocation at flush...
    v[:5] = np.frombuffer(b"hello", np.uint8)
    assert a.copy_out(0, 5) != b"hello"
    m.flush(0, 4096)
    assert a.copy_out(0, 5) == b"hello"
    # ...and another writer's bytes show after invalidate.
    a.copy_in(n - 5, b"world")
    m.invalidate()
    assert bytes(v[n - 5:]) == b"world"
    w = m.view()
    assert w.nbytes == n and bytes(w[:5]) == b"hello"
    # Not freed while mapped, not unmapped under views.
    with pytest.raises(oncilla.InUse, match="mapped"):
        a.free()
    with pytest.raises(oncilla.InUse, match="views"):
        m.unmap()
    with pytest.raises(oncilla.InvalidArgument, match="page size"):
        a.map(block=1000)
    # The last view's end unmaps; then the allocation frees.
    del v, w, m
    gc.collect()
    a.free()
    assert_freed(cluster, ident, "free after the mapping went did not free it")


def test_unmap_beside_a_flush_on_another_thread_never_deadlocks(ocm):
    # A flush runs without the GIL; an unmap on another thread (holding the
    # GIL) must not wait on the flush while the flush waits for the GIL.
    n = 4 * MiB
    b = ocm.alloc(n, nodes=["node-1"])
    mb = b.map()
    stop = threading.Event()

    def flusher():
        while not stop.is_set():
            try:
                mb.flush()
            except oncilla.NotFound:
                return  # unmapped under it: the next call says so

    t = threading.Thread(target=flusher)
    t.start()
    # Racing the flushes: each try unmaps or is refused (InUse), never waits.
    unmapped = False
    for _ in range(200):
        try:
            mb.unmap()
            unmapped = True
            break
        except oncilla.InUse:
            pass
    stop.set()
    t.join(timeout=60)
    assert not t.is_alive(), "the flushing thread hung"
    if not unmapped:
        mb.unmap()  # the flushes are over: nothing holds it now
    b.free()  # the unmapped mapping holds nothing of it


def test_errors_are_typed(ocm, cluster):
    # Each is also the builtin that means the same, for code that knows
    # nothing of Oncilla.
    for cls, builtin in [
        (oncilla.InvalidArgument, ValueError),
        (oncilla.CapacityExhausted, MemoryError),
        (oncilla.QuotaExceeded, MemoryError),
        (oncilla.PermissionDenied, PermissionError),
        (oncilla.NotFound, LookupError),
        (oncilla.OutOfBounds, IndexError),
        (oncilla.AlreadyExists, FileExistsError),
        (oncilla.AgentUnreachable, ConnectionError),
        (oncilla.Unavailable, ConnectionError),
    ]:
        assert issubclass(cls, builtin) and issubclass(cls, oncilla.OncillaError), cls
        assert cls.__module__ == "oncilla", cls
    with pytest.raises(MemoryError):
        ocm.alloc(1 << 40)
    with pytest.raises(ValueError, match="node-9"):
        ocm.alloc(MiB, nodes=["node-9"])
    with pytest.raises(ConnectionError):
        oncilla.connect(socket="/nonexistent/oncilla.sock")
    with ocm.alloc(MiB, nodes=["node-1"]) as a:
        with pytest.raises(IndexError):
            a.copy_in(MiB - 2, b"abc")
        with pytest.raises(oncilla.OutOfBounds):
            a.copy_in(MiB - 2, b"abc")
        with pytest.raises(oncilla.OutOfBounds):
            a.copy_out(MiB, 1)
    assert issubclass(oncilla.OutOfBounds, oncilla.OncillaError)
    with pytest.raises(ValueError, match="unknown kind"):
        ocm.alloc(MiB, "bogus")
    with pytest.raises(ValueError, match="unknown policy"):
        ocm.alloc(MiB, policy="random")
    with pytest.raises(ValueError, match="one per node"):
        ocm.alloc(MiB, nodes=["node-1"], weights=[1, 2])
    with pytest.raises(TypeError):
        ocm.alloc(MiB, 3)
    with pytest.raises(oncilla.CapacityExhausted):
        ocm.alloc(1 << 40)
    with pytest.raises(oncilla.NotFound):
        ocm.attach("no-such-name")
    with pytest.raises(oncilla.InvalidArgument):
        ocm.alloc(MiB, nodes=["node-9"])
    a = ocm.alloc(MiB)
    a.free()
    with pytest.raises(oncilla.NotFound):
        a.free()
    with pytest.raises(oncilla.NotFound):
        a.copy_in(0, b"x")
    with pytest.raises(oncilla.AgentUnreachable):
        oncilla.connect(socket="/nonexistent/oncilla.sock")


def test_alloc_many_makes_distinct_allocations_all_or_none(ocm, cluster):
    before = allocation_ids(cluster)
    made = ocm.alloc_many(4096, 64, nodes=["node-1"])
    assert len(made) == 64
    assert len({a.id for a in made}) == 64
    assert {a.id for a in made} <= allocation_ids(cluster)
    for i, a in enumerate(made):
        a.copy_in(0, pattern(4096, i))
    for i, a in enumerate(made):
        assert a.copy_out(0, 4096) == pattern(4096, i)
    # Refused whole, nothing made.
    with pytest.raises(oncilla.CapacityExhausted):
        ocm.alloc_many(1 << 40, 2)
    for count in (0, 257):
        with pytest.raises(oncilla.InvalidArgument):
            ocm.alloc_many(4096, count)
    # Freed together, all or none: a handle with a live view refuses the
    # whole batch and every handle stays open.
    local = ocm.alloc(4096, "local-host")
    view = local.view()
    with pytest.raises(oncilla.InUse):
        ocm.free_many(made + [local])
    assert {a.id for a in made} | {local.id} <= allocation_ids(cluster)
    assert made[0].copy_out(0, 4096) == pattern(4096, 0)
    del view
    gc.collect()
    with pytest.raises(oncilla.InvalidArgument):
        ocm.free_many([made[0], made[0]])
    ocm.free_many(made + [local])
    assert allocation_ids(cluster) == before
    with pytest.raises(oncilla.NotFound):
        made[0].copy_out(0, 1)


def show_json(cluster, ident: int) -> dict:
    """`ocmctl show ID --json` against the suite's cluster."""
    env = {**os.environ, **{k: v for k, v in cluster.items() if v is not None}}
    env.pop("ONCILLA_TOKEN", None)
    out = subprocess.run(
        [str(ocmctl()), "show", str(ident), "--json"],
        env=env, capture_output=True, text=True, timeout=30, check=True,
    )
    return json.loads(out.stdout)


def test_replicas_keep_copies_on_other_nodes(ocm, cluster):
    data = bytes(range(256)) * 4096
    with ocm.alloc(len(data), nodes=["node-1"], replicas=2) as a:
        a.copy_in(0, data)
        assert a.copy_out(0, len(data)) == data
        shown = show_json(cluster, a.id)
        copies = {(e["copy"], e["node"]) for e in shown["extents"]}
        assert shown["replicas"] == 2
        assert (0, "node-1") in copies
        assert {c for c, _ in copies} == {0, 1}
        assert len({n for _, n in copies}) == 2, copies
    with pytest.raises(oncilla.InvalidArgument, match="remote host memory"):
        ocm.alloc(MiB, "local-host", replicas=2)
    with pytest.raises(oncilla.InvalidArgument, match="1 to 3 copies"):
        ocm.alloc(MiB, replicas=4)


def test_named_allocations_attach_detach_and_in_use(ocm, cluster):
    other = oncilla.connect()  # a second session of this process
    a = ocm.alloc(MiB, name="py-named", nodes=["node-2"])
    assert a.persistent and a.name == "py-named"
    a.copy_in(0, b"shared")
    with pytest.raises(oncilla.AlreadyExists):
        ocm.alloc(MiB, name="py-named")
    with other.attach("py-named") as b:
        assert b.copy_out(0, 6) == b"shared"
        with pytest.raises(oncilla.InUse):
            a.free()
    third = oncilla.connect()
    with third.attach(a.id) as c:  # by id
        assert c.id == a.id and c.copy_out(0, 6) == b"shared"
    # Leaving the blocks detached the others; now it frees.
    a.free()
    assert a.id not in allocation_ids(cluster)


def test_batches_are_futures_and_awaitables(ocm):
    with ocm.alloc(8 * MiB, policy="spread", stripe=MiB) as a:
        parts = [pattern(MiB, i) for i in range(8)]
        b = oncilla.Batch()
        for i, p in enumerate(parts):
            b.copy_in(a, i * MiB, p)
        assert len(b) == 8
        assert b.submit().result(timeout=60) is None
        outs = [bytearray(MiB) for _ in range(8)]

        async def read_all():
            batch = oncilla.Batch()
            for i, o in enumerate(outs):
                batch.copy_out_into(a, i * MiB, o)
            await batch

        asyncio.run(read_all())
        assert [bytes(o) for o in outs] == parts
        bad = oncilla.Batch().copy_in(a, 0, b"ok").copy_in(a, 8 * MiB, b"past the end")
        with pytest.raises(oncilla.OutOfBounds):
            bad.wait(timeout=60)
        with pytest.raises(oncilla.InvalidArgument):
            bad.copy_in(a, 0, b"late")


def test_threads_copy_at_once_with_the_gil_released(ocm):
    n = 4 * MiB
    with ocm.alloc(4 * n, policy="spread", stripe=MiB) as a:
        errors = []

        def worker(k):
            try:
                data = pattern(n, k)
                for _ in range(5):
                    a.copy_in(k * n, data)
                    out = np.empty(n, np.uint8)
                    a.copy_out_into(k * n, out)
                    assert out.tobytes() == data
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        assert not any(t.is_alive() for t in threads)

        # With a switch interval of 1000 s nothing takes the GIL from a
        # thread that holds it: the main thread can run while the worker is
        # still copying only if its copies release it. The worker copies
        # until the main thread says stop (at most 500 copies).
        stop = threading.Event()
        state = {"started": False, "copies": 0, "stopped_early": False}

        def copier():
            buf = bytearray(MiB)
            state["started"] = True
            for _ in range(500):
                a.copy_out_into(0, buf)
                state["copies"] += 1
                if stop.is_set():
                    state["stopped_early"] = True
                    return

        old = sys.getswitchinterval()
        sys.setswitchinterval(1000.0)
        try:
            t = threading.Thread(target=copier)
            t.start()
            for _ in range(100_000_000):
                if state["started"]:
                    break
            stop.set()
        finally:
            sys.setswitchinterval(old)
        t.join(timeout=120)
        assert not t.is_alive()
        assert state["stopped_early"], (
            f"the main thread ran only after all {state['copies']} copies: the GIL was held"
        )


def test_a_quota_refusal_is_quota_exceeded(ocm, cluster):
    """The operator holds this process's user to no persistent
    allocation: a named one is refused as QuotaExceeded (a
    CapacityExhausted), an unnamed one still works."""
    uid = str(os.getuid())

    def quota(*args):
        out = subprocess.run([str(ocmctl()), "quota", *args], capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 0, out.stderr

    quota("set", "--user", uid, "--persistent", "0")
    try:
        with pytest.raises(oncilla.QuotaExceeded, match="persistent allocations"):
            ocm.alloc(MiB, name="over-quota")
        assert issubclass(oncilla.QuotaExceeded, oncilla.CapacityExhausted)
        with ocm.alloc(MiB) as a:
            a.copy_in(0, b"fine")
    finally:
        quota("clear", "--user", uid)
