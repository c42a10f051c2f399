"""ringtree's TCPStore server serving torch's own TCPStore client (``torch.distributed.TCPStore``
with ``is_master=False``): every Store method torch has, one key space with ringtree's
clients, waits woken by either kind of client, timeouts, and a server with a shared secret
refusing torch's client (which has no way to present one). This is what lets torch programs
run under ``ringtree-run`` (test_torch_backend.py launches them)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import ringtree  # noqa: E402
from harness import PROMPT_S  # noqa: E402


@pytest.fixture
def server():
    store = ringtree.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)
    yield store


def _torch_client(port: int, seconds: float = 10) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=seconds))


def test_every_method_of_torchs_client(server):
    client = _torch_client(server.port)
    client.set("a", "alpha")
    assert client.get("a") == b"alpha"
    assert server.get("a") == b"alpha"
    server.set("b", b"beta")
    assert client.get("b") == b"beta"

    assert client.add("n", 5) == 5
    assert client.add("n", -7) == -2
    assert server.add("n", 0) == -2

    assert client.compare_set("cas", "", "first") == b"first"
    assert client.compare_set("cas", "wrong", "x") == b"first"
    assert client.compare_set("cas", "first", "second") == b"second"
    assert client.compare_set("absent", "expected", "x") == b"expected"

    assert client.check(["a", "b"]) and not client.check(["a", "absent"])
    client.append("log", "ab")
    client.append("log", b"c")
    assert client.get("log") == b"abc"
    client.multi_set(["m1", "m2"], [b"1", b"2"])
    assert client.multi_get(["m2", "m1"]) == [b"2", b"1"]
    binary = bytes(range(256))
    client.set("binary", binary)
    assert server.get("binary") == binary and client.get("binary") == binary

    assert client.num_keys() == server.num_keys()
    assert client.delete_key("m1") is True
    assert client.delete_key("m1") is False
    assert not server.check(["m1"])


def test_waits_are_woken_by_either_kind_of_client(server):
    torch_client = _torch_client(server.port)
    ringtree_client = ringtree.TCPStore("127.0.0.1", server.port, timeout=timedelta(seconds=10))
    other_torch_client = _torch_client(server.port)

    def write_later():
        time.sleep(0.2)
        ringtree_client.set("from-ringtree", b"1")
        time.sleep(0.1)
        other_torch_client.set("from-torch", "2")

    writer = threading.Thread(target=write_later)
    writer.start()
    torch_client.wait(["from-ringtree", "from-torch"])
    writer.join()
    assert torch_client.get("from-torch") == b"2"
    ringtree_client.wait(["from-torch"])


def test_a_wait_past_its_timeout_raises_and_the_connection_still_serves(server):
    client = _torch_client(server.port)
    started = time.monotonic()
    with pytest.raises(dist.DistStoreError, match="(?i)timeout"):
        client.wait(["never"], timedelta(seconds=0.5))
    assert 0.4 < time.monotonic() - started < 0.5 + PROMPT_S
    server.set("never", b"late")
    assert client.get("never") == b"late"
    client.set_timeout(timedelta(seconds=0.3))
    with pytest.raises(dist.DistStoreError):
        client.get("missing")
    assert client.add("after", 1) == 1


def test_many_torch_clients_count_together(server):
    clients = [_torch_client(server.port) for _ in range(16)]
    threads = [threading.Thread(target=lambda c=c: [c.add("count", 1) for _ in range(50)]) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert server.add("count", 0) == 16 * 50


def test_a_server_with_a_shared_secret_refuses_torchs_client():
    store = ringtree.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10),
                              wait_for_workers=False, token="s3cret")
    started = time.monotonic()
    with pytest.raises(Exception):  # noqa: B017 - torch's client only sees the connection closed
        client = _torch_client(store.port, seconds=2)
        client.set("k", "v")
    assert time.monotonic() - started < 2 + PROMPT_S
    assert not store.check(["k"])
