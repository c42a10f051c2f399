"""The store contract, run over HashStore, FileStore, TCPStore and PrefixStore; then
TCPStore under load and under hostile input."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from datetime import timedelta

import pytest

import ringtree
from harness import LATE_BY_S

KINDS = ["hash", "file", "tcp", "prefix"]


@pytest.fixture(params=KINDS)
def stores(request, tmp_path):
    """Two handles on one store: (writer, reader). For File/TCP they are separate
    objects (another client); for Hash/Prefix the same object."""
    kind = request.param
    if kind == "hash":
        store = ringtree.HashStore()
        yield store, store
    elif kind == "file":
        path = str(tmp_path / "store")
        yield ringtree.FileStore(path), ringtree.FileStore(path)
    elif kind == "tcp":
        server = ringtree.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        client = ringtree.TCPStore("127.0.0.1", server.port)
        yield server, client
    else:
        store = ringtree.PrefixStore("pfx", ringtree.HashStore())
        yield store, store


def test_set_get(stores):
    a, b = stores
    a.set("k", "v1")
    assert b.get("k") == b"v1"
    a.set("k", b"\x00binary\xff")
    assert b.get("k") == b"\x00binary\xff"
    a.set("empty", b"")
    assert b.get("empty") == b""


def test_get_waits_for_set(stores):
    a, b = stores
    threading.Timer(0.2, lambda: a.set("late", "here")).start()
    start = time.monotonic()
    assert b.get("late") == b"here"
    assert time.monotonic() - start >= 0.15


def test_barrier_waits_for_world_size_callers(stores):
    a, b = stores
    threading.Timer(0.2, lambda: a.barrier("b", 2)).start()
    start = time.monotonic()
    b.barrier("b", 2, timedelta(seconds=10))
    assert time.monotonic() - start >= 0.15
    b.barrier("alone", 1)
    with pytest.raises(ringtree.DistStoreError):
        b.barrier("short", 2, timedelta(milliseconds=100))


def test_get_timeout_names_key_and_timeout(stores):
    a, b = stores
    b.set_timeout(timedelta(milliseconds=200))
    assert b.timeout == timedelta(milliseconds=200)
    start = time.monotonic()
    with pytest.raises(ringtree.DistStoreError) as info:
        b.get("missing-key")
    elapsed = time.monotonic() - start
    assert 0.18 <= elapsed < 0.2 + LATE_BY_S  # at its 200 ms deadline, not the store's default
    assert "missing-key" in str(info.value) and "200" in str(info.value)


def test_wait_with_explicit_timeout(stores):
    a, b = stores
    a.set("x", "1")
    b.wait(["x"])
    b.wait(["x"], timedelta(milliseconds=10))
    start = time.monotonic()
    with pytest.raises(ringtree.DistStoreError, match="y"):
        b.wait(["x", "y"], timedelta(milliseconds=150))
    assert 0.14 <= time.monotonic() - start < 0.15 + LATE_BY_S  # its own 150 ms, not the store's timeout


def test_zero_timeout_checks_once(stores):
    a, b = stores
    a.set("present", "1")
    b.wait(["present"], timedelta(0))
    with pytest.raises(ringtree.DistStoreError):
        b.wait(["absent"], timedelta(0))


def test_negative_timeout_rejected(stores):
    a, _ = stores
    with pytest.raises(ValueError):
        a.set_timeout(timedelta(seconds=-1))


def test_add(stores):
    a, b = stores
    assert a.add("counter", 5) == 5
    assert b.add("counter", -7) == -2
    assert a.get("counter") == b"-2"
    a.set("text", "abc")
    with pytest.raises(ValueError):
        a.add("text", 1)


def test_compare_set(stores):
    a, b = stores
    # missing key, empty expected: sets
    assert a.compare_set("cs", "", "first") == b"first"
    # matching expected: sets
    assert b.compare_set("cs", "first", "second") == b"second"
    # not matching: returns current, unchanged
    assert a.compare_set("cs", "wrong", "third") == b"second"
    assert b.get("cs") == b"second"
    # missing key, non-empty expected: returns expected, stores nothing
    assert a.compare_set("nokey", "exp", "des") == b"exp"
    assert not a.check(["nokey"])


def test_check_delete_num_keys(stores):
    a, b = stores
    base = b.num_keys()
    a.set("k1", "1")
    a.set("k2", "2")
    assert b.check(["k1", "k2"]) and not b.check(["k1", "nope"])
    assert b.num_keys() == base + 2
    assert a.delete_key("k1") is True
    assert a.delete_key("k1") is False
    assert not b.check(["k1"])
    assert b.num_keys() == base + 1


def test_append(stores):
    a, b = stores
    a.append("log", "ab")
    b.append("log", b"cd")
    assert a.get("log") == b"abcd"


def test_multi_get_set(stores):
    a, b = stores
    a.multi_set(["m1", "m2"], ["one", b"two"])
    assert b.multi_get(["m2", "m1"]) == [b"two", b"one"]
    with pytest.raises(ValueError):
        a.multi_set(["m1"], ["x", "y"])


def test_concurrent_adds(stores):
    a, b = stores

    def work(store):
        for _ in range(300):
            store.add("shared", 1)

    threads = [threading.Thread(target=work, args=(a if i % 2 else b,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert a.get("shared") == b"1800"


def test_prefix_stores_do_not_see_each_other():
    base = ringtree.HashStore()
    p1, p2 = ringtree.PrefixStore("one", base), ringtree.PrefixStore("two", base)
    p1.set("k", "1")
    assert not p2.check(["k"])
    assert base.get("one/k") == b"1"
    assert p1.underlying_store is base


def test_file_store_removed_by_last_user(tmp_path):
    path = str(tmp_path / "fs")
    a = ringtree.FileStore(path, 2)
    b = ringtree.FileStore(path, 2)
    a.set("x", "1")
    assert b.get("x") == b"1"
    assert a.path == path
    del a
    assert os.path.exists(path)
    del b
    assert not os.path.exists(path)


def test_tcp_store_port_zero_and_attributes():
    server = ringtree.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    assert server.port > 0 and server.host == "127.0.0.1"
    assert server._num_server_clients == 1
    client = ringtree.TCPStore("localhost", server.port)
    assert client._num_server_clients == -1
    deadline = time.monotonic() + 2
    while server._num_server_clients != 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server._num_server_clients == 2


def test_tcp_store_wait_for_workers():
    result = {}

    def serve():
        result["server"] = ringtree.TCPStore("127.0.0.1", 0, world_size=2, is_master=True,
                                             timeout=timedelta(seconds=1))

    with pytest.raises(ringtree.DistStoreError):
        serve()  # nobody else connects: times out


@pytest.mark.parametrize("bad_port", [-1, 70000])
def test_tcp_store_bad_port(bad_port):
    with pytest.raises(ValueError):
        ringtree.TCPStore("127.0.0.1", bad_port, is_master=True)


def test_tcp_store_token(monkeypatch):
    server = ringtree.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, token="s3cret")
    good = ringtree.TCPStore("127.0.0.1", server.port, token="s3cret", timeout=timedelta(seconds=2))
    good.set("k", "v")
    with pytest.raises(ringtree.DistNetworkError, match="secret"):
        ringtree.TCPStore("127.0.0.1", server.port, timeout=timedelta(seconds=2))
    with pytest.raises(ringtree.DistNetworkError, match="secret"):
        ringtree.TCPStore("127.0.0.1", server.port, token="wrong", timeout=timedelta(seconds=2))
    monkeypatch.setenv("RINGTREE_STORE_TOKEN", "s3cret")
    from_env = ringtree.TCPStore("127.0.0.1", server.port, timeout=timedelta(seconds=2))
    assert from_env.get("k") == b"v"


def test_tcp_store_64_clients_1000_adds():
    server = ringtree.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    clients = [ringtree.TCPStore("127.0.0.1", server.port) for _ in range(64)]

    def work(store):
        for _ in range(1000):
            store.add("load", 1)

    threads = [threading.Thread(target=work, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert server.get("load") == b"64000"


def test_stores_constructed_in_many_threads_at_once(tmp_path):
    """Store constructors release the GIL while they connect; the Python objects must
    still be registered under the GIL, or threads constructing at once corrupt memory."""
    server = ringtree.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    errors: list[str] = []
    start = threading.Barrier(32)

    def construct(index):
        try:
            start.wait()
            for round_ in range(100):
                tcp = ringtree.TCPStore("127.0.0.1", server.port)
                tcp.add("constructed", 1)
                files = ringtree.FileStore(str(tmp_path / f"store-{index}"), -1)
                files.set(str(round_), "x")
                del tcp, files
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(repr(exc))

    threads = [threading.Thread(target=construct, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, "\n".join(errors)
    assert server.get("constructed") == b"3200"


def test_tcp_store_survives_garbage():
    server = ringtree.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    good = ringtree.TCPStore("127.0.0.1", server.port)
    good.set("before", "1")
    rng = __import__("random").Random(1234)
    payloads = [bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300))) for _ in range(50)]
    payloads += [b"", b"\x00", b"\xff" * 8, struct.pack("<IIQ", 0xFFFFFFFF, 0xFFFFFFFF, 2**63)]
    silent = socket.create_connection(("127.0.0.1", server.port))  # connects and sends nothing
    for payload in payloads:
        with socket.create_connection(("127.0.0.1", server.port), timeout=2) as s:
            try:  # the server may close the connection before we are done sending
                s.sendall(payload)
                s.shutdown(socket.SHUT_WR)
                s.recv(100)
            except OSError:
                pass
        good.add("ops", 1)
    assert good.get("before") == b"1"
    assert good.get("ops") == str(len(payloads)).encode()
    # a truncated frame that stops mid-way, with the connection left open
    stalled = socket.create_connection(("127.0.0.1", server.port))
    stalled.sendall(b"\x01\x02\x03")
    good.set("after", "2")
    assert ringtree.TCPStore("127.0.0.1", server.port).get("after") == b"2"
    silent.close()
    stalled.close()
