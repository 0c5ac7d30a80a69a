"""`Ring`: a ring all-reduce over TCP between the worker processes of a cluster, for CPU workers.

TensorFlow's CPU collectives move each chunk through gRPC: the tensor is copied into a protobuf,
serialized, framed, parsed and copied out again, several times the bytes on the wire
(`benchmarks/collectives.py` measures it). This ring moves the same bytes as TensorFlow's ring
algorithm, 2 (N - 1) / N of the tensor per worker, straight from a NumPy buffer to the socket and
back: in N - 1 reduce-scatter steps each worker adds the chunk it receives from its predecessor
to its own, in N - 1 all-gather steps it passes the summed chunks on. Each step sends and receives
at once (a sender thread beside the receiving one; both release the GIL, as NumPy's add does).

Every worker ends with the same sum, bit for bit (each chunk is summed once, in ring order, and
copied to the others). `kdist.exchange.Comm` routes a multi-worker strategy's gradient sums here by
default on CPU workers (the strategy's plan, `kdist.strategies.StrategyPlan`), and its all-gathers
(TopK's payloads) to the ring's `all_gather`; the rendezvous (each worker's listening address) goes
through TensorFlow's coordination service, and a peer silent for `timeout` seconds fails the step
with an error naming it instead of a hang; a member whose collective fails closes the ring, so that
the others fail at once too, and first writes why in the same store (`Causes`): a neighbour that
sees it close reports that cause, the dead peer, and not the member that closed on it.

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
>>> Pieces([np.zeros(10, "float32")]).chunk_bounds(3)
[(0, 4), (4, 7), (7, 10)]
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import logging
import queue
import secrets
import selectors
import socket
import struct
import sys
import threading
import time

import numpy as np

from kdist import global_state
from kdist.cluster.addresses import host_of

BUFFER_BYTES = 4 << 20
NONCE_BYTES, PROOF_BYTES = 16, 32
ACCEPTED, REFUSED = b"\x01", b"\x00"
HANDSHAKE_SECONDS = 5.0  # for a connection to the listener to prove the secret (side by side)
TELLING_SECONDS = 1.0  # for a failing member to write its cause before it closes the ring anyway
SILENCE_GRACE_SECONDS = 0.5  # for what a silent peer writes (`Causes`), in rings of 3 or more
logger = logging.getLogger("kdist")


class RingError(RuntimeError):
    """A peer of the ring did not answer, or answered wrongly: names it and the fix. `silent`:
    the peer sent nothing for the ring's timeout (it hangs, or waits for one that does)."""

    def __init__(self, message: str, silent: bool = False):
        super().__init__(message)
        self.silent = silent
        self.peer: int | None = None  # the rank of the peer it names, inside a collective


class Causes:
    """Why a ring broke, in the store its members met through (TensorFlow's coordination service).

    A member whose collective fails writes what it saw (`tell`: which peer, and what) before it
    closes its sockets. A member that then sees its own connection fail follows what the peers
    wrote from the one it saw fail (`first`): the peer a neighbour names, the peer that one names,
    and so on, up to the last that wrote nothing, the one that failed first. So every member names
    a dead peer, not the neighbour that closed on it. A peer found silent may itself wait for a
    hung one further back, which its own predecessor found silent a moment earlier: where a
    member's error is a silence, it waits briefly for what that peer writes.

    >>> store = {}
    >>> causes = Causes(0, store.__setitem__, store.get)
    >>> causes.tell(2, 1, "worker:1 closed the connection: the peer stopped")
    >>> causes.tell(0, 2, "worker:2 closed the connection: the peer stopped")
    >>> causes.first(2)
    (2, 'worker:1 closed the connection: the peer stopped')
    >>> causes.first(1) is None
    True
    """

    def __init__(self, generation: int, publish, peek):
        self._generation, self._publish, self._peek = generation, publish, peek

    def _key(self, rank: int) -> str:
        return f"kdist/ring/{self._generation}/broken/{rank}"

    def tell(self, rank: int, peer: int, cause: str) -> None:
        """Writes that `rank` saw `peer` fail with `cause`, waiting at most TELLING_SECONDS (a
        store whose host died may not answer: the ring closes all the same)."""
        def write():
            try:
                self._publish(self._key(rank), f"{peer}\n{cause}")
            except Exception as err:  # noqa: BLE001 (written once already, or the store is gone)
                logger.debug("kdist: the ring's cause was not written (%s)", err)

        writer = threading.Thread(target=write, name="kdist-ring-cause", daemon=True)
        writer.start()
        writer.join(TELLING_SECONDS)

    def first(self, peer: int, wait: float = 0.0, me: int | None = None) -> tuple[int, str] | None:
        """(the member that saw the first failure, what it saw), following what `peer` and the
        peers after it wrote, each looked for again up to `wait` seconds in all; None when
        `peer` wrote nothing, or wrote that `me` failed (two members that lost each other: each
        keeps its own error).

        >>> store = {}
        >>> Causes(0, store.__setitem__, store.get).tell(1, 0, "worker:0 sent nothing")
        >>> Causes(0, store.__setitem__, store.get).first(1, me=0) is None
        True
        """
        deadline = time.monotonic() + wait
        found, seen = None, {me}
        while peer not in seen:
            seen.add(peer)
            written = self._read(peer, deadline)
            if written is None or written[0] == me:
                break
            found = (peer, written[1])
            peer = written[0]
        return found

    def _read(self, rank: int, deadline: float) -> tuple[int, str] | None:
        while True:
            try:
                value = self._peek(self._key(rank))
            except Exception:  # noqa: BLE001 (the store is gone: the member's error stands)
                return None
            if value:
                peer, _, cause = value.partition("\n")
                return int(peer), cause
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)


class Pieces:
    """Flat arrays of one dtype seen as one buffer, their concatenation, without copying them:
    the ring's chunks of it are lists of views.

    >>> pieces = Pieces([np.arange(3.0), np.arange(3.0, 5.0)])
    >>> pieces.chunk_bounds(2)
    [(0, 3), (3, 5)]
    >>> [v.tolist() for v in pieces.views(2, 4)]
    [[2.0], [3.0]]
    """

    def __init__(self, arrays: list):
        self.arrays = arrays
        self.dtype = arrays[0].dtype
        self.itemsize = self.dtype.itemsize
        self.starts = np.cumsum([0] + [a.size for a in arrays]).tolist()

    def chunk_bounds(self, parts: int) -> list[tuple[int, int]]:
        """[start, stop) of `parts` contiguous chunks, sizes differing by at most one (the
        first ones longer), as `np.array_split` cuts."""
        size, extra = divmod(self.starts[-1], parts)
        stops = np.cumsum([0] + [size + (k < extra) for k in range(parts)]).tolist()
        return list(zip(stops, stops[1:]))

    def views(self, start: int, stop: int) -> list[np.ndarray]:
        """The elements [start, stop) of the concatenation, as views of the arrays."""
        found = []
        for array, first in zip(self.arrays, self.starts):
            low, high = max(start - first, 0), min(stop - first, array.size)
            if low < high:
                found.append(array[low:high])
        return found


class Outputs:
    """The arrays `all_reduce_sums` writes its sums into, reused once nobody holds them: a new
    array's pages cost a page fault each on first touch, more than the sum's own additions (a
    step's gradients: 1,800 faults, 2-3 ms measured). An array is free when the only references
    left are these sets' (TensorFlow's tensor of it, and any view, hold one until released)."""

    KEPT = 2  # sets per layout: this step's and the last's

    def __init__(self):
        self._sets: dict = {}

    def take(self, layout: list) -> list:
        """Free arrays of `layout` ([(shape, dtype)]), new ones where all kept are held."""
        key = tuple((tuple(shape), np.dtype(dtype).str) for shape, dtype in layout)
        kept = self._sets.setdefault(key, [])
        for arrays in kept:
            if _free(arrays):
                return list(arrays)
        arrays = tuple(aligned_empty(shape, dtype) for shape, dtype in layout)
        kept.insert(0, arrays)
        del kept[self.KEPT:]
        return list(arrays)


def _free(arrays: tuple) -> bool:
    """Nobody but `Outputs`' tuple holds any of `arrays` (the other two references: this loop's
    variable and `sys.getrefcount`'s argument), nor a view of one (which refers to the memory's
    owner, `array.base`, held otherwise by the array alone)."""
    return all(sys.getrefcount(array) <= 3 and sys.getrefcount(array.base) <= 2
               for array in arrays)


def aligned_empty(shape, dtype, alignment: int = 64) -> np.ndarray:
    """An uninitialised array whose data starts at a multiple of `alignment` bytes: TensorFlow
    takes such an array returned by a `numpy_function` as its tensor without copying it."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + alignment, np.uint8)
    offset = -raw.ctypes.data % alignment
    return raw[offset:offset + nbytes].view(dtype).reshape(shape)


class Ring:
    """This worker's place in the ring: a socket to its successor, one from its predecessor."""

    def __init__(self, rank: int, size: int, to_next: socket.socket | None,
                 from_previous: socket.socket | None, names: list[str],
                 causes: Causes | None = None):
        self.rank, self.size, self.names = rank, size, names
        self._next, self._previous = to_next, from_previous
        self._causes = causes
        self._sends: queue.Queue = queue.Queue()
        self._sent: queue.Queue = queue.Queue()
        self._scratch = np.empty(0, np.uint8)
        self._outputs = Outputs()
        self._lock = threading.RLock()  # the collectives take their outputs under it too
        if size > 1:
            threading.Thread(target=self._sender, name="kdist-ring-sender", daemon=True).start()

    # ------------------------------------------------------------------ rendezvous
    @classmethod
    def connect(cls, rank: int, addresses: list[str], publish, lookup, timeout: float,
                generation: int | None = None, secret: bytes = b"", port: int = 0,
                names: list[str] | None = None, peek=None) -> "Ring":
        """Joins the ring of `len(addresses)` workers as `rank`: listens on this worker's host
        (`port`, 0: any free one), `publish(key, "host:port")`es the address, connects to the
        successor's (`lookup(key)`, blocking), proves `secret` to it, and accepts the
        predecessor once it has proved the same secret. `generation` tells the rings of one job
        apart (default: this process's count of rings); errors call the workers `names`
        (default: their addresses). With `peek(key)` (the value, or None at once), a failed
        collective names the cause a neighbour wrote before it closed the ring (`Causes`)."""
        size = len(addresses)
        names = list(names or addresses)
        if size == 1:
            return cls(rank, size, None, None, names)
        if generation is None:  # every worker builds its rings in the same order: the same keys
            generation = next(global_state.process().rings)
        host = host_of(addresses[rank])
        listener = _listen(host, port)
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
        causes = Causes(generation, publish, peek) if peek is not None else None
        return cls(rank, size, to_next, admitted["socket"], names, causes)

    # ------------------------------------------------------------------ the all-reduce
    def all_reduce_sum(self, array: np.ndarray, in_place: bool = False) -> np.ndarray:
        """The sum of every worker's `array` (the same shape and dtype on every worker). With
        `in_place`, a writable contiguous `array` receives the sum itself (no copy)."""
        writable = in_place and array.flags.writeable and array.flags.c_contiguous
        result = array if writable else np.array(array, copy=True)
        self._sum([result.reshape(-1)], [result.reshape(-1)])  # views: the sum lands in `result`
        return result

    def all_reduce_sums(self, arrays: list) -> list:
        """The sums of every worker's `arrays` (one dtype; the same shapes on every worker), in
        one collective, as if they were one buffer, without packing them into one: each sum is
        written once, into a new array aligned for TensorFlow to take without a copy; `arrays`
        are only read (the step's gradients, which others may read too).

        >>> Ring(0, 1, None, None, ["me"]).all_reduce_sums([np.ones(2, "float32")])[0].tolist()
        [1.0, 1.0]
        """
        inputs = [np.ascontiguousarray(a) for a in arrays]
        with self._lock:  # two callers never take the same free outputs
            outputs = self._outputs.take([(a.shape, a.dtype) for a in inputs])
            self._sum([a.reshape(-1) for a in inputs], [o.reshape(-1) for o in outputs])
        return outputs

    def all_gather(self, arrays: list) -> list:
        """Every worker's `arrays` (one dtype; the same shapes on every worker), each stacked in
        worker order along a new first axis, in one collective: each worker's own travel once
        round the ring (size - 1 steps, as the all-reduce's second half passes the summed
        chunks), so each worker receives the others' bytes once and sums nothing. Written into
        arrays aligned for TensorFlow, as `all_reduce_sums`' are.

        >>> ring = Ring(0, 1, None, None, ["me"])
        >>> [a.tolist() for a in ring.all_gather([np.arange(2, dtype="int32")])]
        [[[0, 1]]]
        """
        inputs = [np.ascontiguousarray(a) for a in arrays]
        with self._lock:  # one collective at a time, in the order the workers issue them
            outputs = self._outputs.take([((self.size, *a.shape), a.dtype) for a in inputs])
            for source, target in zip(inputs, outputs):
                target[self.rank] = source
            if self.size > 1 and sum(a.size for a in inputs):
                self._collective(lambda: self._pass_rows(outputs))
        return outputs

    def _pass_rows(self, outputs: list) -> None:
        """Step s sends the row received in step s - 1 (first this worker's own) to the
        successor and receives the predecessor's next one."""
        rows = [[o[r].reshape(-1) for o in outputs] for r in range(self.size)]
        for step in range(self.size - 1):
            self._exchange(rows[(self.rank - step) % self.size],
                           rows[(self.rank - step - 1) % self.size])

    def _sum(self, inputs: list, outputs: list) -> None:
        with self._lock:  # one collective at a time, in the order the workers issue them
            if self.size == 1 or sum(a.size for a in inputs) == 0:
                for source, target in zip(inputs, outputs):
                    if target is not source:
                        target[...] = source
                return
            self._collective(lambda: self._sum_into(Pieces(inputs), Pieces(outputs)))

    def _collective(self, run) -> None:
        """Runs one collective; where a member fails, raises the first cause (`_first_cause`)
        and closes the ring: its other members learn it now, not at their timeout."""
        try:
            run()
        except RingError as error:
            failure = self._first_cause(error)
            self.close()
            raise failure from None

    def _first_cause(self, error: RingError) -> RingError:
        """The error to raise for `error`: where the peer it names saw another fail first (it
        wrote so before it closed the ring: `Causes`), that first failure; else `error`. This
        member writes what it saw, for the others, first."""
        if self._causes is None or error.peer is None:
            return error
        self._causes.tell(self.rank, error.peer, str(error))
        wait = SILENCE_GRACE_SECONDS if error.silent and self.size > 2 else 0.0
        first = self._causes.first(error.peer, wait, me=self.rank)
        if first is None:
            return error
        witness, cause = first
        return RingError(f"{cause} (as {self.names[witness]} found first; it then closed the "
                         "ring)")

    def _sum_into(self, inputs: "Pieces", outputs: "Pieces") -> None:
        """The ring: chunk c of the sum is `outputs`' chunk c; the chunk received in each
        reduce-scatter step is added to this worker's own (`inputs`') and passed on from
        `outputs`, where the all-gather then receives the summed chunks of the others."""
        rank, size = self.rank, self.size
        bounds = inputs.chunk_bounds(size)
        scratch = self._scratch_for(max(b - a for a, b in bounds) * inputs.itemsize) \
            .view(inputs.dtype)
        for step in range(size - 1):  # reduce-scatter
            sent, received = (rank - step) % size, (rank - step - 1) % size
            start, stop = bounds[received]
            self._exchange((inputs if step == 0 else outputs).views(*bounds[sent]),
                           [scratch[:stop - start]])
            offset = 0
            for mine, out in zip(inputs.views(start, stop), outputs.views(start, stop)):
                np.add(mine, scratch[offset:offset + mine.size], out=out)
                offset += mine.size
        for step in range(size - 1):  # all-gather
            self._exchange(outputs.views(*bounds[(rank - step + 1) % size]),
                           outputs.views(*bounds[(rank - step) % size]))

    def _scratch_for(self, nbytes: int) -> np.ndarray:
        if self._scratch.nbytes < nbytes:
            self._scratch = np.empty(nbytes, np.uint8)
        return self._scratch[:nbytes]

    def _exchange(self, outgoing: list, incoming: list) -> None:
        """Sends the arrays `outgoing` to the successor while receiving `incoming` from the
        predecessor (in order: one stream of bytes)."""
        previous, successor = (self.rank - 1) % self.size, (self.rank + 1) % self.size
        self._sends.put(outgoing)
        try:
            for view in incoming:
                _receive_into(self._previous, _bytes(view), self.names[previous])
        except RingError as error:
            error.peer = previous
            raise
        failure = self._sent.get()
        if failure is not None:
            failure.peer = successor
            raise failure

    def _sender(self) -> None:
        while True:
            outgoing = self._sends.get()
            try:
                for view in outgoing:
                    self._next.sendall(_bytes(view))
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


def _listen(host: str, port: int) -> socket.socket:
    """The listener for this worker's predecessor; a taken `port` names the setting."""
    try:
        return socket.create_server(("", port), family=socket.AF_INET6 if ":" in host
                                    else socket.AF_INET, backlog=16)
    except OSError as err:
        if port and err.errno == errno.EADDRINUSE:
            raise RingError(f"the ring's port {port} on {host} is taken (KDIST_RING_PORT): another "
                            "process holds it, such as another worker on this host. Fix: "
                            "give each worker on a host its own KDIST_RING_PORT, or unset it "
                            "(any free port)") from None
        raise


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
    """The predecessor's connection, once it has proved the secret. Connections are
    authenticated side by side, each within `HANDSHAKE_SECONDS`: one that does not prove the
    secret in time (a stranger, another job) is refused without delaying the others, and the
    listener waits on, until `timeout`."""
    deadline = time.monotonic() + timeout
    refusals = _Refusals(name)
    pending: dict[socket.socket, _Candidate] = {}
    listener.setblocking(False)
    with selectors.DefaultSelector() as selector:
        selector.register(listener, selectors.EVENT_READ)
        try:
            while True:
                now = time.monotonic()
                if now >= deadline:
                    raise RingError(refusals.deadline_message(timeout))
                for sock in [s for s, c in pending.items() if c.until <= now]:
                    selector.unregister(sock)
                    refusals.refuse(pending.pop(sock))
                wait = min([deadline, *(c.until for c in pending.values())]) - now
                for key, _ in selector.select(timeout=max(wait, 0.01)):
                    if key.fileobj is listener:
                        candidate = _Candidate.accepted(listener, generation, rank, secret)
                        if candidate is not None:
                            pending[candidate.sock] = candidate
                            selector.register(candidate.sock, selectors.EVENT_READ)
                        continue
                    candidate = pending[key.fileobj]
                    verdict = candidate.read()
                    if verdict is None:
                        continue
                    selector.unregister(candidate.sock)
                    del pending[candidate.sock]
                    if verdict:
                        candidate.sock.setblocking(True)
                        candidate.sock.sendall(ACCEPTED)
                        return candidate.sock
                    refusals.refuse(candidate)
        finally:
            for sock in pending:
                sock.close()


class _Candidate:
    """One connection to the listener: the nonce it was sent and the answer it owes."""

    def __init__(self, sock: socket.socket, peer: str, expected: bytes):
        self.sock, self.peer, self.expected = sock, peer, expected
        self.answer = b""
        self.until = time.monotonic() + HANDSHAKE_SECONDS

    @classmethod
    def accepted(cls, listener: socket.socket, generation: int, rank: int,
                 secret: bytes) -> "_Candidate | None":
        try:
            sock, peer = listener.accept()
            nonce = secrets.token_bytes(NONCE_BYTES)
            sock.sendall(nonce)  # 16 bytes into a new connection's empty buffer
            sock.setblocking(False)
        except OSError:  # it went away at once
            return None
        return cls(sock, f"{peer[0]}:{peer[1]}",
                   struct.pack("!II", generation, rank) + _proof(secret, nonce, generation, rank))

    def read(self) -> bool | None:
        """True once the answer proves the secret, False once it cannot, None while it may."""
        try:
            chunk = self.sock.recv(len(self.expected) - len(self.answer))
        except BlockingIOError:
            return None
        except OSError:
            return False
        self.answer += chunk
        if chunk and len(self.answer) < len(self.expected):
            return None
        return hmac.compare_digest(self.answer, self.expected)


class _Refusals:
    """The connections a listener refused, and its warnings about them: the first at once, then
    at most one line per `WARN_EVERY_SECONDS` with the count since the last."""

    WARN_EVERY_SECONDS = 10.0

    def __init__(self, name: str):
        self.name = name
        self.peers: list[str] = []
        self.unreported = 0
        self.warned_at = -float("inf")

    def refuse(self, candidate: _Candidate) -> None:
        """Tells `candidate` it is refused (if it still listens) and closes it."""
        self.peers.append(candidate.peer)
        self.unreported += 1
        try:
            candidate.sock.send(REFUSED)  # one byte into a non-blocking socket: never waits
        except OSError:
            pass
        candidate.sock.close()
        if time.monotonic() - self.warned_at >= self.WARN_EVERY_SECONDS:
            many = f"{self.unreported} connections (the last from {candidate.peer})" \
                if self.unreported > 1 else f"a connection from {candidate.peer}"
            logger.warning("kdist: the TCP ring refused %s: it did not prove the job secret "
                           "within %g s; waiting on for %s", many, HANDSHAKE_SECONDS, self.name)
            self.unreported, self.warned_at = 0, time.monotonic()

    def deadline_message(self, timeout: float) -> str:
        shown = ", ".join(self.peers[:5]) + (f" and {len(self.peers) - 5} more"
                                             if len(self.peers) > 5 else "")
        return (f"the ring's predecessor {self.name} did not join within {timeout:g} s"
                + (f"; refused {len(self.peers)} connection(s) that did not prove the job secret "
                   f"(from {shown}): a worker with another KDIST_JOB_SECRET, or a stranger"
                   if self.peers else "")
                + ". Fix: check that every worker sums over kdist's ring (the same all_reduce "
                "option) with the same KDIST_JOB_SECRET, and that its port is open "
                "(KDIST_RING_PORT)")


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
                            "hangs (dead_peer_timeout)", silent=True) from None
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
