"""TCPStore server under hostile load: 200 concurrent clients of which some disconnect in
the middle of their requests, and 10,000 malformed frames (hypothesis-generated) sent
while silent and byte-by-byte ("slowloris") connections stay open. Throughout, the
well-behaved clients must keep getting exactly the right answers, a request cut short
must have no effect, every connection the server ends must end cleanly (whole reply
frames, then end of stream), and the server's memory must stay bounded.

The server runs in a child process (a plain ``ringtree.TCPStore(..., is_master=True)``),
so that its resident memory can be read from /proc. The frames are built here from the
wire format of src/cpp/store/tcp_store_protocol.h.
"""

from __future__ import annotations

import random
import socket
import struct
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ringtree

# --- the wire format (tcp_store_protocol.h) ------------------------------------------------

MAGIC = 0x31535452
MAGIC_BYTES = struct.pack("<I", MAGIC)
VERSION = 1
HEADER = struct.Struct("<IB3sI")  # magic, code, reserved, payload length
HELLO, SET, GET, ADD, COMPARE_SET, CHECK, WAIT, DELETE, NUM_KEYS, APPEND, MULTI_SET = range(1, 12)
OK, TIMEOUT, INVALID_ARGUMENT, ERROR, AUTH_REFUSED, VERSION_MISMATCH = range(6)
MAX_HELLO_PAYLOAD = 4096
MAX_MESSAGE_BYTES = 64 << 20  # TcpStoreOptions::maxMessageBytes, the default
MAX_KEYS_PER_REQUEST = 1 << 20


def frame(code: int, payload: bytes = b"", *, length: int | None = None, reserved: bytes = b"\0\0\0") -> bytes:
    return HEADER.pack(MAGIC, code, reserved, len(payload) if length is None else length) + payload


def field(data: bytes) -> bytes:
    """A ``bytes`` field: u32 length, then the bytes."""
    return struct.pack("<I", len(data)) + data


def key_list(*keys: bytes) -> bytes:
    return struct.pack("<I", len(keys)) + b"".join(field(k) for k in keys)


def hello(version: int = VERSION, token: bytes = b"") -> bytes:
    return frame(HELLO, struct.pack("<I", version) + field(token))


def set_request(key: bytes, value: bytes) -> bytes:
    return frame(SET, field(key) + field(value))


def get_request(keys: list[bytes], timeout_ms: int = 0) -> bytes:
    return frame(GET, struct.pack("<q", timeout_ms) + key_list(*keys))


def wait_request(keys: list[bytes], timeout_ms: int) -> bytes:
    return frame(WAIT, struct.pack("<q", timeout_ms) + key_list(*keys))


def add_request(key: bytes, delta: int) -> bytes:
    return frame(ADD, field(key) + struct.pack("<q", delta))


def read_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"end of stream after {len(data)} of {n} bytes")
        data += chunk
    return data


def read_reply(sock: socket.socket) -> tuple[int, bytes]:
    magic, status, reserved, length = HEADER.unpack(read_exact(sock, HEADER.size))
    assert magic == MAGIC and reserved == b"\0\0\0" and status <= VERSION_MISMATCH, (magic, status, reserved)
    return status, read_exact(sock, length)


def replies_until_end(sock: socket.socket, timeout: float = 5.0) -> list[tuple[int, bytes]]:
    """Reads what the server sends until it closes the connection: it must be whole,
    well-formed reply frames, and the end must come within ``timeout`` seconds."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:  # the server closed with our unread bytes pending
        pass
    except socket.timeout:
        raise AssertionError(f"the server kept the connection open for {timeout} s after our end of stream") from None
    replies = []
    while data:
        assert len(data) >= HEADER.size, f"a partial reply header: {data!r}"
        magic, status, reserved, length = HEADER.unpack_from(data)
        assert magic == MAGIC and reserved == b"\0\0\0" and status <= VERSION_MISMATCH, data[:HEADER.size]
        assert len(data) >= HEADER.size + length, f"a partial reply payload: {data!r}"
        replies.append((status, data[HEADER.size:HEADER.size + length]))
        data = data[HEADER.size + length:]
    return replies


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def greet(port: int) -> socket.socket:
    """A raw connection that has completed the handshake."""
    sock = connect(port)
    sock.sendall(hello())
    assert read_reply(sock) == (OK, struct.pack("<I", VERSION))
    return sock


def hang_up(sock: socket.socket, reset: bool) -> None:
    """Closes ``sock``; with ``reset`` abortively (RST instead of FIN)."""
    if reset:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


# --- the server --------------------------------------------------------------------------

SERVER = r"""
import sys, ringtree
server = ringtree.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
print(server.port, flush=True)
sys.stdin.read()  # serve until the test closes our stdin
"""
# Growth of the server's resident memory the tests allow (nothing they send needs more
# than a few MiB; an allocation driven by a length field would show as far more).
RSS_GROWTH_LIMIT = 64 << 20


class Server:
    """The TCPStore server under test, in a child process; a client of it; and its
    resident memory at the start."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        self.port = int(self.proc.stdout.readline())
        self.client = ringtree.TCPStore("127.0.0.1", self.port, timeout=timedelta(seconds=10))
        self.baseline_rss = self.rss()

    def rss(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS in /proc/<pid>/status")

    def assert_memory_bounded(self) -> None:
        growth = self.rss() - self.baseline_rss
        assert growth < RSS_GROWTH_LIMIT, f"the server's RSS grew by {growth >> 20} MiB"

    def assert_serving(self, key: str) -> None:
        """The server is alive, answers a fresh client correctly, and its memory is bounded."""
        assert self.proc.poll() is None, f"the server exited with {self.proc.returncode}"
        fresh = ringtree.TCPStore("127.0.0.1", self.port, timeout=timedelta(seconds=10))
        fresh.set(key, b"\x00still serving\xff")
        assert self.client.get(key) == b"\x00still serving\xff"
        self.assert_memory_bounded()

    def stop(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def server():
    server = Server()
    yield server
    server.stop()


class Nuisances:
    """Connections that stay open while a test runs: some that never send a byte, some
    that stopped in the middle of a frame, and a thread that sends whole requests one
    byte at a time and checks the replies (slowloris)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.silent = [connect(port) for _ in range(20)]
        self.stalled = []
        for i in range(20):
            sock = greet(port) if i % 2 else connect(port)
            request = set_request(b"stalled/%d" % i, b"never complete")
            sock.sendall(request[: 1 + i % (len(request) - 1)])
            self.stalled.append(sock)
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.trickled = 0
        self.thread = threading.Thread(target=self._slowloris, daemon=True)
        self.thread.start()

    def _slowloris(self) -> None:
        try:
            while not self.stop.is_set():
                with connect(self.port) as sock:
                    key = b"slow/%d" % self.trickled
                    for request in (hello(), set_request(key, b"v" * 40), get_request([key])):
                        for i in range(len(request)):
                            sock.sendall(request[i:i + 1])
                            time.sleep(0.001)
                        status, payload = read_reply(sock)
                        assert status == OK, (request[:12], status, payload)
                    assert payload == struct.pack("<I", 1) + field(b"v" * 40), payload
                    self.trickled += 1
        except Exception as exc:  # noqa: BLE001 - reported by close()
            self.errors.append(f"slowloris client: {exc!r}")

    def close(self) -> None:
        """Stops the slowloris thread and closes everything; fails if a trickled request
        got a wrong answer or none, or if the stalled requests took effect."""
        self.stop.set()
        self.thread.join(30)
        checker = ringtree.TCPStore("127.0.0.1", self.port, timeout=timedelta(seconds=10))
        assert not any(checker.check([f"stalled/{i}"]) for i in range(len(self.stalled))), "a partial SET took effect"
        for sock in self.silent + self.stalled:
            sock.close()
        assert not self.errors, self.errors
        assert self.trickled > 0, "no request sent byte by byte completed"


@pytest.fixture
def nuisances(server):
    nuisances = Nuisances(server.port)
    yield nuisances
    nuisances.close()


# --- 200 concurrent clients ------------------------------------------------------------------

POLITE_CLIENTS = 150
RUDE_CLIENTS = 50
ROUNDS = 100


def _polite(port: int, index: int, start: threading.Barrier, errors: list[str], added: list[int]) -> None:
    """A ringtree client doing set/get/add/wait and checking every answer."""
    try:
        rng = random.Random(index)
        store = ringtree.TCPStore("127.0.0.1", port, timeout=timedelta(seconds=30))
        start.wait()
        store.set(f"polite/{index}/hello", str(index))
        total = 0
        for round_ in range(ROUNDS):
            action = rng.choice(["set", "add", "wait", "get-other"])
            if action == "set":
                value = rng.randbytes(rng.randrange(0, 2000))
                store.set(f"polite/{index}/{round_}", value)
                if store.get(f"polite/{index}/{round_}") != value:
                    errors.append(f"client {index}: get after set returned another value")
            elif action == "add":
                delta = rng.randrange(-5, 100)
                total += delta
                store.add("polite/total", delta)
                if store.add(f"polite/{index}/own", delta) != total:
                    errors.append(f"client {index}: its own counter is not {total}")
            elif action == "wait":
                others = [f"polite/{rng.randrange(POLITE_CLIENTS)}/hello" for _ in range(3)]
                store.wait(others, timedelta(seconds=30))
            else:
                other = rng.randrange(POLITE_CLIENTS)
                if store.get(f"polite/{other}/hello") != str(other).encode():
                    errors.append(f"client {index}: wrong hello of client {other}")
        added[index] = total
    except Exception as exc:  # noqa: BLE001 - reported by the test
        errors.append(f"client {index}: {exc!r}")


def _rude(port: int, index: int, start: threading.Barrier, errors: list[str], cut: list[str]) -> None:
    """A raw client that disconnects in the middle of its requests (FIN or RST): after
    part of a frame, or after a whole WAIT/GET that is still parked. One connection in
    five skips the handshake, so the server drops it at its first frame (an error here
    only then). Records the keys of the SETs it cut short, which must never appear."""
    rng = random.Random(10_000 + index)
    start.wait()
    for round_ in range(ROUNDS):
        greeted = rng.random() < 0.8
        key = b"rude/%d/%d" % (index, round_)
        how = rng.choice(["partial-set", "partial-get", "parked-wait", "parked-get", "between"])
        try:
            sock = greet(port) if greeted else connect(port)
            if how == "partial-set":
                request = set_request(key, rng.randbytes(rng.randrange(1, 3000)))
                cut.append(key.decode())
                sock.sendall(request[: rng.randrange(len(request))])
            elif how == "partial-get":
                request = get_request([key, b"rude/never"])
                sock.sendall(request[: rng.randrange(len(request))])
            elif how in ("parked-wait", "parked-get"):
                make = wait_request if how == "parked-wait" else get_request
                sock.sendall(make([b"rude/never"], 60_000))
                time.sleep(rng.random() * 0.01)
            else:  # a whole request answered, then gone before the next
                sock.sendall(add_request(b"rude/counter", 1))
                read_reply(sock)
            hang_up(sock, reset=rng.random() < 0.5)
        except OSError as exc:
            if greeted:
                errors.append(f"rude client {index}, round {round_} ({how}): {exc!r}")
                return


def test_200_concurrent_clients_with_disconnects_mid_request(server, nuisances):
    errors: list[str] = []
    added = [0] * POLITE_CLIENTS
    cut: list[str] = []
    start = threading.Barrier(POLITE_CLIENTS + RUDE_CLIENTS, timeout=60)  # all connected, then all at once
    threads = [threading.Thread(target=_polite, args=(server.port, i, start, errors, added))
               for i in range(POLITE_CLIENTS)]
    threads += [threading.Thread(target=_rude, args=(server.port, i, start, errors, cut)) for i in range(RUDE_CLIENTS)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while any(thread.is_alive() for thread in threads) and time.monotonic() < deadline:
        server.assert_memory_bounded()
        time.sleep(0.05)
    assert not any(thread.is_alive() for thread in threads), "a client is stuck"
    assert not errors, "\n".join(errors[:20])
    assert server.client.add("polite/total", 0) == sum(added)
    assert cut, "no request was cut short"
    present = [key for key in cut if server.client.check([key])]
    assert not present, f"SETs cut short took effect: {present[:10]}"
    server.assert_serving("after-concurrent-clients")


# --- 10,000 malformed frames -------------------------------------------------------------------

MALFORMED_FRAMES = 10_000
FRAMES_PER_EXAMPLE = 5

op_codes = st.integers(SET, MULTI_SET)
small_bytes = st.binary(max_size=64)


@st.composite
def valid_requests(draw) -> bytes:
    key = draw(st.binary(min_size=1, max_size=16))
    return draw(st.sampled_from([
        set_request(key, draw(small_bytes)),
        get_request([key, b"fuzz/never"], draw(st.integers(0, 10))),
        add_request(b"fuzz/" + key, draw(st.integers(-(2**63), 2**63 - 1))),
        frame(CHECK, key_list(key)),
        frame(DELETE, field(key)),
        frame(NUM_KEYS),
    ]))


# What the server may send back before it closes the connection: nothing at all; a
# version-mismatch reply (a HELLO of another version); or any well-formed replies, for
# bytes that can form valid requests by chance.
NO_REPLY, VERSION_REPLY, ANY_REPLY = "none", "version", "any"


# Each strategy gives (whether to greet first, the bytes, the replies allowed).
def _malformed_kinds():
    random_bytes = st.binary(max_size=300).map(
        lambda b: (False, b, ANY_REPLY if b.startswith(MAGIC_BYTES) else NO_REPLY))
    absurd_length_before_hello = st.tuples(st.integers(0, 255), st.integers(MAX_HELLO_PAYLOAD + 1, 2**32 - 1),
                                           small_bytes).map(lambda t: (False, frame(t[0], t[2], length=t[1]), NO_REPLY))
    absurd_length = st.tuples(op_codes, st.integers(MAX_MESSAGE_BYTES + 1, 2**32 - 1), small_bytes).map(
        lambda t: (True, frame(t[0], t[2], length=t[1]), NO_REPLY))
    truncated = st.tuples(st.booleans(), valid_requests(), st.floats(0, 1, exclude_max=True)).map(
        lambda t: (t[0], t[1][: int(len(t[1]) * t[2])], NO_REPLY))
    wrong_version = st.integers(0, 2**32 - 1).filter(lambda v: v != VERSION).map(
        lambda v: (False, hello(version=v), VERSION_REPLY))
    huge_key_count = st.tuples(st.sampled_from([GET, WAIT, CHECK, MULTI_SET]), st.integers(0, 2**32 - 1),
                               st.integers(0, 10)).map(_huge_key_count)
    header_then_garbage = st.tuples(op_codes, small_bytes).map(lambda t: (True, frame(t[0], t[1]), ANY_REPLY))
    trailing_bytes = st.tuples(valid_requests(), st.binary(min_size=1, max_size=8)).map(_with_trailing_bytes)
    bad_header = st.one_of(
        st.tuples(st.integers(0, 255).filter(lambda c: not 1 <= c <= MULTI_SET), small_bytes).map(
            lambda t: frame(t[0], t[1])),
        st.tuples(st.binary(min_size=3, max_size=3).filter(lambda r: r != b"\0\0\0"), small_bytes).map(
            lambda t: frame(SET, t[1], reserved=t[0])),
        st.integers(0, 2**32 - 1).filter(lambda m: m != MAGIC).map(lambda m: struct.pack("<IB3sI", m, SET, b"", 0)),
    ).flatmap(lambda data: st.booleans().map(lambda greeted: (greeted, data, NO_REPLY)))
    negative_timeout = st.tuples(st.sampled_from([GET, WAIT]), st.integers(-(2**63), -1)).map(
        lambda t: (True, frame(t[0], struct.pack("<q", t[1]) + key_list(b"k")), NO_REPLY))
    before_hello = valid_requests().map(lambda request: (False, request, NO_REPLY))
    second_hello = st.just((True, hello(), NO_REPLY))
    return st.one_of(random_bytes, absurd_length_before_hello, absurd_length, truncated, wrong_version,
                     huge_key_count, header_then_garbage, trailing_bytes, bad_header, negative_timeout, before_hello,
                     second_hello)


def _huge_key_count(spec: tuple[int, int, int]) -> tuple[bool, bytes, str]:
    """A request announcing more keys than its payload holds (up to 2**32 - 1, beyond
    the limit of MAX_KEYS_PER_REQUEST too)."""
    op, count, present = spec
    count = max(count, present + 1)
    if op == MULTI_SET:
        payload = struct.pack("<I", count) + b"".join(field(b"k%d" % i) + field(b"") for i in range(present))
    else:
        payload = struct.pack("<I", count) + b"".join(field(b"k%d" % i) for i in range(present))
        if op != CHECK:
            payload = struct.pack("<q", 0) + payload
    return True, frame(op, payload), NO_REPLY


def _with_trailing_bytes(spec: tuple[bytes, bytes]) -> tuple[bool, bytes, str]:
    """A valid request whose frame carries bytes after the last field."""
    request, extra = spec
    _, code, _, _ = HEADER.unpack_from(request)
    return True, frame(code, request[HEADER.size:] + extra), NO_REPLY


malformed_frames = _malformed_kinds()


def _send_malformed(port: int, greeted: bool, data: bytes, allowed: str, valid_first: list[bytes]) -> None:
    """One connection: optionally the handshake and some valid requests (each answered
    before the next), then the malformed bytes and our end of stream. The server must end
    the connection within seconds, having sent only the replies ``allowed``."""
    sock = greet(port) if greeted else connect(port)
    with sock:
        if greeted:
            for request in valid_first:
                sock.sendall(request)
                status, _ = read_reply(sock)
                assert status in (OK, TIMEOUT, INVALID_ARGUMENT), status
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # EPIPE, ECONNRESET, ENOTCONN: closed by the server before we were done
            return
        replies = replies_until_end(sock)
        if allowed == NO_REPLY:
            assert not replies, f"the server answered malformed bytes {data[:64]!r}: {replies}"
        elif allowed == VERSION_REPLY:
            assert replies == [(VERSION_MISMATCH, struct.pack("<I", VERSION))], replies


def test_10000_malformed_frames_leave_the_server_serving(server, nuisances):
    sent = 0
    checks = 0

    @settings(max_examples=MALFORMED_FRAMES // FRAMES_PER_EXAMPLE, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(batch=st.lists(st.tuples(malformed_frames, st.lists(valid_requests(), max_size=2)),
                          min_size=FRAMES_PER_EXAMPLE, max_size=FRAMES_PER_EXAMPLE))
    def send_batch(batch):
        nonlocal sent, checks
        for (greeted, data, allowed), valid_first in batch:
            _send_malformed(server.port, greeted, data, allowed, valid_first)
            sent += 1
        # A well-behaved client gets exact answers all along, and memory stays bounded.
        checks += 1
        assert server.client.add("well-behaved client's counter", 1) == checks
        server.assert_memory_bounded()

    send_batch()
    assert sent >= MALFORMED_FRAMES
    server.assert_serving("after-malformed-frames")
