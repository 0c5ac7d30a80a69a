"""`Ring`: a ring all-reduce over TCP between the worker processes of a cluster, for CPU workers.

TensorFlow's CPU collectives move each chunk through gRPC: the tensor is copied into a protobuf,
serialized, framed, parsed and copied out again, several times the bytes on the wire
(`benchmarks/collectives.py` measures it). This ring moves the same bytes as TensorFlow's ring
algorithm, 2 (N - 1) / N of the tensor per worker, straight from a NumPy buffer to the socket and
back: in N - 1 reduce-scatter steps each worker adds the chunk it receives from its predecessor
to its own, in N - 1 all-gather steps it passes the summed chunks on. Each step sends and receives
at once (a sender thread beside the receiving one; both release the GIL, as NumPy's add does).

Every worker ends with the same sum, bit for bit (each chunk is summed once, in ring order, and
copied to the others). `kdist.exchange.Comm` routes a multi-worker strategy's gradient sums here
by default on CPU workers (`kdist.strategies.sums_over_tcp`); the rendezvous (each worker's
listening address) goes through TensorFlow's coordination service, and a peer silent for
`timeout` seconds fails the step with an error naming it instead of a hang; a member whose
collective fails closes the ring, so that the others fail at once too.

Who may join: each worker listens on every interface, on `port` (``KDIST_RING_PORT`` on
Kubernetes, where the NetworkPolicy admits it from the job's own pods) or an ephemeral one, only
until its predecessor has joined; the listener is closed then. A connection joins only by proving
the job's secret: the listener sends a fresh 16-byte nonce and expects
HMAC-SHA256(secret, nonce, ring, rank) back (`hmac`, `secrets`). A stranger that cannot prove it
is refused and the listener waits on for the real predecessor (training goes on); a worker whose
secret differs is refused and fails, naming the cause. The secret is ``KDIST_JOB_SECRET`` (set by
`kdist launch` for each job, by the rendered Kubernetes manifests from a Secret), else one the
first worker draws and shares through TensorFlow's coordination service (`kdist.exchange.comm`).

>>> import numpy as np
>>> [len(c) for c in chunks(np.zeros(10, "float32"), 3)]
[4, 3, 3]
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import queue
import secrets
import socket
import struct
import threading
import time

import numpy as np

from kdist import global_state

BUFFER_BYTES = 4 << 20
NONCE_BYTES, PROOF_BYTES = 16, 32
ACCEPTED, REFUSED = b"\x01", b"\x00"
logger = logging.getLogger("kdist")


class RingError(RuntimeError):
    """A peer of the ring did not answer, or answered wrongly: names it and the fix."""


def chunks(array: np.ndarray, parts: int) -> list[np.ndarray]:
    """`array` (flat) cut into `parts` contiguous views, sizes differing by at most one."""
    return np.array_split(array, parts)


class Ring:
    """This worker's place in the ring: a socket to its successor, one from its predecessor."""

    def __init__(self, rank: int, size: int, to_next: socket.socket | None,
                 from_previous: socket.socket | None, names: list[str]):
        self.rank, self.size, self.names = rank, size, names
        self._next, self._previous = to_next, from_previous
        self._sends: queue.Queue = queue.Queue()
        self._sent: queue.Queue = queue.Queue()
        self._scratch = np.empty(0, np.uint8)
        self._lock = threading.Lock()
        if size > 1:
            threading.Thread(target=self._sender, name="kdist-ring-sender", daemon=True).start()

    # ------------------------------------------------------------------ rendezvous
    @classmethod
    def connect(cls, rank: int, addresses: list[str], publish, lookup, timeout: float,
                generation: int | None = None, secret: bytes = b"", port: int = 0,
                names: list[str] | None = None) -> "Ring":
        """Joins the ring of `len(addresses)` workers as `rank`: listens on this worker's host
        (`port`, 0: any free one), `publish(key, "host:port")`es the address, connects to the
        successor's (`lookup(key)`, blocking), proves `secret` to it, and accepts the
        predecessor once it has proved the same secret. `generation` tells the rings of one job
        apart (default: this process's count of rings); errors call the workers `names`
        (default: their addresses)."""
        size = len(addresses)
        names = list(names or addresses)
        if size == 1:
            return cls(rank, size, None, None, names)
        if generation is None:  # every worker builds its rings in the same order: the same keys
            generation = next(global_state.setdefault("exchange.rings", itertools.count))
        host = addresses[rank].rpartition(":")[0].strip("[]")
        listener = socket.create_server(("", port), family=socket.AF_INET6
                                        if ":" in host else socket.AF_INET, backlog=4)
        publish(f"kdist/ring/{generation}/{rank}", f"{host}:{listener.getsockname()[1]}")
        admitted: dict = {}  # the predecessor is admitted while this worker proves itself:
        admitting = threading.Thread(  # each waits for the other's nonce or proof
            target=lambda: admitted.update(_admitted(listener, secret, generation,
                                                     (rank - 1) % size,
                                                     names[(rank - 1) % size], timeout)),
            name="kdist-ring-admit", daemon=True)
        admitting.start()
        successor = (rank + 1) % size
        to_next = None
        try:
            target = lookup(f"kdist/ring/{generation}/{successor}")
            to_next = _connect(target, timeout, names[successor])
            _prove(to_next, secret, generation, rank, names[successor], target)
            admitting.join()
            if "error" in admitted:
                raise admitted["error"]
        except BaseException:
            if to_next is not None:
                to_next.close()
            listener.close()  # ends the admitting thread's wait too
            admitting.join(timeout=5)
            if "socket" in admitted:
                admitted["socket"].close()
            raise
        listener.close()
        _tune(admitted["socket"]).settimeout(timeout)
        return cls(rank, size, to_next, admitted["socket"], names)

    # ------------------------------------------------------------------ the all-reduce
    def all_reduce_sum(self, array: np.ndarray, in_place: bool = False) -> np.ndarray:
        """The sum of every worker's `array` (the same shape and dtype on every worker). With
        `in_place`, a writable contiguous `array` receives the sum itself (no copy: the exchange
        passes the buffer it packed for this collective)."""
        with self._lock:  # one collective at a time, in the order the workers issue them
            writable = in_place and array.flags.writeable and array.flags.c_contiguous
            result = array if writable else np.array(array, copy=True)
            flat = result.reshape(-1)  # a view: summing into it sums into `result`
            if self.size == 1 or flat.size == 0:
                return result
            try:
                self._sum_into(flat)
            except RingError:
                self.close()  # the ring is broken: its other members learn it now, not at timeout
                raise
            return result

    def _sum_into(self, flat: np.ndarray) -> None:
        parts = chunks(flat, self.size)
        rank, size = self.rank, self.size
        scratch = self._scratch_for(max(p.nbytes for p in parts)).view(flat.dtype)
        for step in range(size - 1):  # reduce-scatter
            incoming = parts[(rank - step - 1) % size]
            received = scratch[:incoming.size]
            self._exchange(parts[(rank - step) % size], received)
            np.add(incoming, received, out=incoming)
        for step in range(size - 1):  # all-gather
            self._exchange(parts[(rank - step + 1) % size], parts[(rank - step) % size])

    def _scratch_for(self, nbytes: int) -> np.ndarray:
        if self._scratch.nbytes < nbytes:
            self._scratch = np.empty(nbytes, np.uint8)
        return self._scratch

    def _exchange(self, outgoing: np.ndarray, incoming: np.ndarray) -> None:
        """Sends `outgoing` to the successor while receiving `incoming` from the predecessor."""
        self._sends.put(outgoing)
        _receive_into(self._previous, _bytes(incoming),
                      self.names[(self.rank - 1) % self.size])
        failure = self._sent.get()
        if failure is not None:
            raise failure

    def _sender(self) -> None:
        while True:
            outgoing = self._sends.get()
            try:
                self._next.sendall(_bytes(outgoing))
                self._sent.put(None)
            except OSError as err:
                self._sent.put(RingError(
                    f"sending to {self.names[(self.rank + 1) % self.size]} failed ({err}): the "
                    "peer stopped or is unreachable"))

    def close(self) -> None:
        for sock in (self._next, self._previous):
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked on it, too
                except OSError:
                    pass
                sock.close()


def _proof(secret: bytes, nonce: bytes, generation: int, rank: int) -> bytes:
    header = struct.pack("!II", generation, rank)
    return hmac.new(secret, b"kdist-ring\x00" + nonce + header, hashlib.sha256).digest()


def _prove(sock: socket.socket, secret: bytes, generation: int, rank: int, name: str,
           address: str) -> None:
    """Answers the successor's nonce with this worker's proof of the secret."""
    try:
        nonce = _receive_exactly(sock, NONCE_BYTES, name)
        sock.sendall(struct.pack("!II", generation, rank) + _proof(secret, nonce, generation, rank))
        verdict = _receive_exactly(sock, 1, name)
    except (RingError, OSError) as err:  # it gave up on this worker, or on its own handshake
        raise RingError(f"{name} at {address} ended the handshake before its verdict ({err}): "
                        "it refused this worker's proof of the job secret, or it stopped. Fix: "
                        "set the same KDIST_JOB_SECRET on every task of the job (or unset it on "
                        "all of them)") from None
    if verdict != ACCEPTED:
        raise RingError(f"{name} at {address} refused this worker's proof of the job secret: the "
                        "workers do not share one secret. Fix: set the same KDIST_JOB_SECRET on "
                        "every task of the job (or unset it on all of them)")


def _admitted(*args) -> dict:
    """`_admit`'s socket, or its error, for the thread that runs it."""
    try:
        return {"socket": _admit(*args)}
    except (RingError, OSError) as error:
        return {"error": error if isinstance(error, RingError) else RingError(
            f"the ring's listener failed ({error})")}


def _admit(listener: socket.socket, secret: bytes, generation: int, rank: int, name: str,
           timeout: float) -> socket.socket:
    """The predecessor's connection, once it has proved the secret; a connection that does not
    (a stranger, another job) is refused and the listener waits on, until `timeout`."""
    deadline = time.monotonic() + timeout
    refused: list[str] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RingError(f"the ring's predecessor {name} did not join within {timeout:g} s"
                            + (f"; refused {len(refused)} connection(s) that did not prove the "
                               f"job secret (from {', '.join(refused)}): a worker with another "
                               "KDIST_JOB_SECRET, or a stranger" if refused else "")
                            + ". Fix: check that every worker sums over kdist's ring (the same "
                            "all_reduce option) with the same KDIST_JOB_SECRET, and that its port "
                            "is open (KDIST_RING_PORT)")
        listener.settimeout(min(left, 0.5))
        try:
            sock, peer = listener.accept()
        except socket.timeout:
            continue  # the deadline, checked above
        nonce = secrets.token_bytes(NONCE_BYTES)
        expected = struct.pack("!II", generation, rank) + _proof(secret, nonce, generation, rank)
        try:
            sock.settimeout(min(5.0, max(left, 0.1)))
            sock.sendall(nonce)
            answer = _receive_exactly(sock, len(expected), f"a connection from {peer[0]}")
        except (OSError, RingError):
            answer = b""
        if hmac.compare_digest(answer, expected):
            sock.sendall(ACCEPTED)
            return sock
        refused.append(f"{peer[0]}:{peer[1]}")
        logger.warning("kdist: the TCP ring refused a connection from %s:%s: it did not prove the "
                       "job secret; waiting on for %s", peer[0], peer[1], name)
        try:
            sock.sendall(REFUSED)
        except OSError:
            pass
        sock.close()


def _bytes(chunk: np.ndarray) -> memoryview:
    """A contiguous chunk's bytes (a memoryview has no format for float16 or bfloat16)."""
    return memoryview(chunk.view(np.uint8))


def _tune(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, BUFFER_BYTES)
    return sock


def _connect(address: str, timeout: float, name: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
            return _tune(sock)
        except OSError as err:
            if time.monotonic() > deadline:
                raise RingError(f"cannot reach the ring's successor {name} at {address} within "
                                f"{timeout:g} s ({err}). Fix: let the job's tasks reach each "
                                "other's ring port (KDIST_RING_PORT; any port when unset), or "
                                "sum with TensorFlow's collectives: kdist.scope(all_reduce='ring')"
                                ) from None
            time.sleep(0.05)


def _receive_into(sock: socket.socket, view: memoryview, name: str) -> None:
    filled = 0
    while filled < len(view):
        try:
            count = sock.recv_into(view[filled:])
        except socket.timeout:
            raise RingError(f"{name} sent nothing for {sock.gettimeout():g} s: the peer died or "
                            "hangs (dead_peer_timeout)") from None
        except OSError as err:  # a reset: the peer's process ended
            raise RingError(f"{name} reset the connection ({err.strerror or err}): the peer "
                            "stopped") from None
        if count == 0:
            raise RingError(f"{name} closed the connection: the peer stopped")
        filled += count


def _receive_exactly(sock: socket.socket, count: int, name: str) -> bytes:
    data = bytearray(count)
    _receive_into(sock, memoryview(data), name)
    return bytes(data)
