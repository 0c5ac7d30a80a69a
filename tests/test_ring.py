"""kdist's TCP ring all-reduce (`kdist.exchange.ring`) between real sockets: every worker gets the
same sum, equal to NumPy's within float summation order, for 2 to 4 workers, float32, float16 and
bfloat16, uneven sizes; a silent peer ends in an error naming it, never a hang; a stranger without
the job's secret is refused while the ring forms all the same, and a worker with another secret
fails naming the cause. (Two real worker processes training through it:
tests/test_multi_worker.py.)"""

import re
import threading
import time

import numpy as np
import pytest

from kdist.exchange.ring import Outputs, Ring, RingError


def rings(size, timeout=20.0, generation=0, secrets=None, store=None, errors=None,
          peek="store", slow_writer=None):
    """`size` connected rings in this process (threads), rendezvous through a dict `store`; each
    member proves `secrets[rank]` (default: one shared secret); failures go to `errors`. A
    member that breaks the ring writes its cause there too (`peek=None`: it does not); what
    member `slow_writer` writes there takes 0.3 s (a coordination service's RPC from another
    host, where the others' are local)."""
    store = {} if store is None else store
    changed = threading.Condition()
    secrets = secrets or [b"the job's secret"] * size

    def publish(key, value):
        if slow_writer is not None and key.endswith(f"/broken/{slow_writer}"):
            time.sleep(0.3)
        with changed:
            store[key] = value
            changed.notify_all()

    def lookup(key):
        with changed:
            changed.wait_for(lambda: key in store, timeout)
            return store[key]

    addresses = [f"127.0.0.1:{9000 + r}" for r in range(size)]
    made = [None] * size
    peek = store.get if peek == "store" else peek

    def join(r):
        try:
            made[r] = Ring.connect(r, addresses, publish, lookup, timeout, generation=generation,
                                   secret=secrets[r], peek=peek)
        except RingError as error:
            if errors is None:
                raise
            errors[r] = error

    threads = [threading.Thread(target=join, args=(r,)) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return made


def all_reduce(members, arrays, in_place=False):
    results = [None] * len(members)
    threads = [threading.Thread(target=lambda r=r: results.__setitem__(
        r, members[r].all_reduce_sum(arrays[r], in_place=in_place))) for r in range(len(members))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_every_worker_gets_the_same_sum(size, dtype):
    import ml_dtypes  # noqa: F401  (bfloat16 in NumPy, as TensorFlow hands it over)

    members = rings(size)
    rng = np.random.default_rng(size)
    for length in (1, 7, 1000, 100_003):  # fewer elements than workers, uneven chunks
        arrays = [rng.normal(size=length).astype(dtype) for _ in range(size)]
        results = all_reduce(members, arrays)
        assert all(np.array_equal(results[0], r) for r in results)  # bit for bit
        expected = np.sum([a.astype("float64") for a in arrays], axis=0)
        tolerance = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 5e-2}[dtype]
        assert np.allclose(results[0].astype("float64"), expected, rtol=tolerance,
                           atol=tolerance * size)
    for member in members:
        member.close()


def test_in_place_sums_into_the_buffer_given_and_copies_otherwise():
    members = rings(2)
    arrays = [np.ones(10, "float32"), np.full(10, 2.0, "float32")]
    kept = [a.copy() for a in arrays]
    copied = all_reduce(members, arrays)
    assert all(np.array_equal(a, k) for a, k in zip(arrays, kept))
    summed = all_reduce(members, arrays, in_place=True)
    assert all(s is a for s, a in zip(summed, arrays)) and np.all(arrays[0] == 3.0)
    assert np.array_equal(copied[0], arrays[0])


def test_a_list_sums_as_its_concatenation_would_leaving_the_inputs_alone():
    """The step's gradients go to the ring as a list (no packing copy): the sums equal, bit for
    bit, those of the packed buffer; the inputs are untouched (others may read the gradients);
    each sum is aligned for TensorFlow to take it without a copy."""
    members = rings(3)
    rng = np.random.default_rng(3)
    shapes = [(5, 7), (0,), (1,), (1000, 3), (2,)]  # chunks spanning several arrays, an empty one
    lists = [[rng.normal(size=s).astype("float32") for s in shapes] for _ in members]
    kept = [[a.copy() for a in arrays] for arrays in lists]
    results = [None] * len(members)
    threads = [threading.Thread(target=lambda r=r: results.__setitem__(
        r, members[r].all_reduce_sums(lists[r]))) for r in range(len(members))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    packed = all_reduce(members, [np.concatenate([a.ravel() for a in arrays]) for arrays in lists])
    for rank, sums in enumerate(results):
        assert [s.shape for s in sums] == shapes
        assert np.array_equal(np.concatenate([s.ravel() for s in sums]), packed[0])
        assert all(np.array_equal(a, k) for a, k in zip(lists[rank], kept[rank]))
        assert all(s.ctypes.data % 64 == 0 for s in sums if s.size)
    for member in members:
        member.close()


@pytest.mark.parametrize("size", [2, 3, 4])
def test_every_worker_gathers_every_workers_arrays_in_worker_order(size):
    """TopK's payloads (values and int32 indices) ride the ring's all-gather: every worker gets
    each worker's arrays bit for bit, stacked in worker order, an empty one and one of a single
    element included; the inputs are untouched, the results aligned for TensorFlow."""
    import ml_dtypes  # noqa: F401  (bfloat16 in NumPy, as TensorFlow hands it over)

    members = rings(size)
    rng = np.random.default_rng(size)
    for dtype in ("float32", "bfloat16", "int32"):
        shapes = [(7,), (0,), (1,), (1000, 3)]
        lists = [[(rng.normal(size=s) * 100).astype(dtype) for s in shapes] for _ in members]
        kept = [[a.copy() for a in arrays] for arrays in lists]
        results = [None] * size
        threads = [threading.Thread(target=lambda r=r: results.__setitem__(
            r, members[r].all_gather(lists[r]))) for r in range(size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for rank, gathered in enumerate(results):
            assert [g.shape for g in gathered] == [(size, *s) for s in shapes]
            for k in range(len(shapes)):
                expected = np.stack([lists[r][k] for r in range(size)])
                assert np.array_equal(gathered[k].view(np.uint8), expected.view(np.uint8))
            assert all(np.array_equal(a, b) for a, b in zip(lists[rank], kept[rank]))
            assert all(g.ctypes.data % 64 == 0 for g in gathered if g.size)
    for member in members:
        member.close()


def test_the_sums_arrays_are_reused_only_once_nobody_holds_them_or_a_view():
    """A step's sums go to TensorFlow without a copy, then come back to the ring for the next
    step (new pages cost a fault each): never while TensorFlow's tensor of one, or a view of
    one, is alive."""
    outputs = Outputs()
    layout = [((3,), "float32"), ((2, 2), "float32")]
    first = outputs.take(layout)
    second = outputs.take(layout)
    assert not any(a is b for a in first for b in second)  # the first set is held
    ids = [id(a) for a in first]
    del first
    assert [id(a) for a in outputs.take(layout)] == ids  # released: reused
    view = second[1][0]  # a view of one of the second set
    ids_second = [id(a) for a in second]
    del second
    third = outputs.take(layout)
    assert not {id(a) for a in third} & set(ids_second)
    assert view.base is not None and all(a.ctypes.data % 64 == 0 for a in third)


def test_a_silent_peer_fails_the_all_reduce_naming_it():
    members = rings(2, timeout=2.0)
    with pytest.raises(RingError, match=r"127\.0\.0\.1:9001 sent nothing for 2 s"):
        members[0].all_reduce_sum(np.ones(1000, "float32"))  # worker 1 never joins this one


def _stop_member_1_of_3(close=True, timeout=20.0, **ring_options):
    """Member 1 of 3 stops (`close`: its sockets close, as when its process dies; else it hangs,
    never joining the collective) during a collective of members 0 and 2: {rank: (error,
    when)}, and when it stopped."""
    members = rings(3, timeout=timeout, **ring_options)
    errors: dict = {}

    def sum_on(rank):
        try:
            members[rank].all_reduce_sum(np.ones(4_000_000, "float32"))
        except RingError as error:
            errors[rank] = (str(error), time.monotonic())

    threads = [threading.Thread(target=sum_on, args=(r,)) for r in (0, 2)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    stopped = time.monotonic()
    if close:
        members[1].close()
    for thread in threads:
        thread.join(timeout=30)
    assert set(errors) == {0, 2}, errors
    return errors, stopped


def test_a_member_that_stops_fails_every_other_member_promptly_naming_it():
    """Member 2 fails naming member 1; member 0 fails as soon as member 2's failure closes the
    ring, long before the 20 s timeout, never hanging, and names member 1 too: member 2 wrote
    the cause before it closed the ring."""
    errors, stopped = _stop_member_1_of_3()
    assert re.search(r"127\.0\.0\.1:9001 (closed|reset) the connection", errors[2][0])
    assert re.search(r"^127\.0\.0\.1:9001 (closed|reset) the connection.*\(as 127\.0\.0\.1:9002 "
                     r"found first; it then closed the ring\)$|^sending to 127\.0\.0\.1:9001 "
                     "failed", errors[0][0]), errors[0][0]
    assert max(at for _, at in errors.values()) - stopped < 5


def test_a_hung_member_is_named_by_both_others_though_its_successor_found_it_first():
    """Member 1 of 3 hangs: member 2 finds it silent first; member 0, waiting for member 2's
    next chunk, times out a moment later, before member 2's cause is written (its write takes
    0.3 s here), and waits for that cause instead of naming member 2."""
    errors, stopped = _stop_member_1_of_3(close=False, timeout=2.0, slow_writer=2)
    assert re.search(r"^127\.0\.0\.1:9001 sent nothing for 2 s", errors[2][0]), errors[2][0]
    assert re.search(r"^127\.0\.0\.1:9001 sent nothing for 2 s.*\(as 127\.0\.0\.1:9002 found "
                     r"first; it then closed the ring\)$", errors[0][0]), errors[0][0]
    assert max(at for _, at in errors.values()) - stopped < 5


def test_rings_of_other_models_do_not_mix():
    """Each ring is a generation (every worker builds its models in the same order): a worker
    that joins another generation's ring is refused, naming the fix."""
    store = {"kdist/ring/3/1": "127.0.0.1:1"}  # a stale address of another ring
    with pytest.raises(RingError, match="cannot reach the ring's successor"):
        Ring.connect(0, ["127.0.0.1:1", "127.0.0.1:2"], store.__setitem__, store.__getitem__,
                     timeout=0.5, generation=3)


def _intrude(store, key="kdist/ring/0/0"):
    """Connects to the listener published under `key` as a stranger would: answers its nonce
    with junk; returns the listener's verdict byte."""
    import socket
    import time

    while key not in store:
        time.sleep(0.01)
    host, _, port = store[key].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        assert len(sock.recv(16)) == 16  # the nonce
        sock.sendall(b"x" * 40)
        return sock.recv(1)


def _member(rank, store, outcome, timeout=20.0, secret=b"the job's secret"):
    def publish(key, value):
        store[key] = value

    def lookup(key):
        import time

        deadline = time.monotonic() + timeout
        while key not in store and time.monotonic() < deadline:
            time.sleep(0.01)
        return store[key]

    try:
        outcome[rank] = Ring.connect(rank, ["127.0.0.1:9000", "127.0.0.1:9001"], publish, lookup,
                                     timeout, generation=0, secret=secret)
    except RingError as error:
        outcome[rank] = error


def test_a_stranger_without_the_secret_is_refused_and_the_ring_forms_all_the_same(caplog):
    """A connection to a worker's ring port that cannot prove the job's secret (here: it answers
    the nonce with junk, as anyone who can reach the port could) is refused; the worker waits on
    for its real predecessor, and the sums are right."""
    import logging

    logging.getLogger("kdist").addHandler(caplog.handler)  # kdist's logger does not propagate
    store, outcome = {}, {}
    first = threading.Thread(target=_member, args=(0, store, outcome))
    first.start()
    assert _intrude(store) == b"\x00"  # refused, before the real predecessor comes
    second = threading.Thread(target=_member, args=(1, store, outcome))
    second.start()
    first.join()
    second.join()
    members = [outcome[0], outcome[1]]
    assert all(isinstance(m, Ring) for m in members), members
    results = all_reduce(members, [np.ones(8, "float32"), np.full(8, 2.0, "float32")])
    assert all(np.array_equal(r, np.full(8, 3.0, "float32")) for r in results)
    assert any("refused a connection from 127.0.0.1" in r.getMessage() and "did not prove the "
               "job secret" in r.getMessage() for r in caplog.records)
    logging.getLogger("kdist").removeHandler(caplog.handler)
    for member in members:
        member.close()


def _silent_connections(store, count, key="kdist/ring/0/0"):
    """Opens `count` connections to the listener published under `key` that never answer."""
    import socket

    while key not in store:
        time.sleep(0.01)
    host, _, port = store[key].rpartition(":")
    return [socket.create_connection((host, int(port)), timeout=5) for _ in range(count)]


def test_silent_strangers_do_not_delay_the_ring():
    """Connections that never answer the nonce are authenticated beside the real predecessor,
    not before it: the ring forms well within one handshake's deadline (sequentially, the 6 silent
    connections would hold it 6 x 5 s)."""
    from kdist.exchange import ring

    store, outcome = {}, {}
    first = threading.Thread(target=_member, args=(0, store, outcome))
    first.start()
    silent = _silent_connections(store, 6)
    started = time.monotonic()
    second = threading.Thread(target=_member, args=(1, store, outcome))
    second.start()
    first.join(timeout=60)
    second.join(timeout=60)
    formed = time.monotonic() - started
    assert all(isinstance(outcome[r], Ring) for r in (0, 1)), outcome
    assert formed < ring.HANDSHAKE_SECONDS, formed
    for sock in silent:
        sock.close()
    for member in outcome.values():
        member.close()


def test_many_strangers_make_one_warning_line(caplog):
    import logging

    logging.getLogger("kdist").addHandler(caplog.handler)  # kdist's logger does not propagate
    store, outcome = {}, {}
    first = threading.Thread(target=_member, args=(0, store, outcome))
    first.start()
    verdicts = [_intrude(store) for _ in range(20)]
    second = threading.Thread(target=_member, args=(1, store, outcome))
    second.start()
    first.join(timeout=60)
    second.join(timeout=60)
    logging.getLogger("kdist").removeHandler(caplog.handler)
    assert verdicts == [b"\x00"] * 20
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 1 and "refused a connection from 127.0.0.1" in lines[0], lines
    for member in outcome.values():
        member.close()


def test_a_taken_ring_port_names_kdist_ring_port_and_the_fix():
    """Two workers on one host given one KDIST_RING_PORT: the second cannot listen there."""
    import socket

    with socket.create_server(("", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(RingError, match=rf"the ring's port {port} on 127.0.0.1 is taken "
                           r"\(KDIST_RING_PORT\).*give each worker on a host its own "
                           "KDIST_RING_PORT"):
            Ring.connect(0, ["127.0.0.1:1", "127.0.0.1:2"], {}.__setitem__, {}.__getitem__,
                         timeout=1.0, generation=0, port=port)


def test_a_worker_left_with_only_strangers_says_so_at_its_deadline():
    store, outcome = {"kdist/ring/0/1": "127.0.0.1:1"}, {}  # its successor: nobody there
    alone = threading.Thread(target=_member, args=(0, store, outcome, 2.0))
    alone.start()
    assert _intrude(store) == b"\x00"
    alone.join()
    assert isinstance(outcome[0], RingError)


def test_a_worker_with_another_secret_fails_naming_the_cause():
    store, outcome = {}, {}
    members = [threading.Thread(target=_member, args=(r, store, outcome, 3.0, secret))
               for r, secret in ((0, b"ours"), (1, b"someone else's"))]
    for member in members:
        member.start()
    for member in members:
        member.join()
    assert all(isinstance(error, RingError) for error in outcome.values()), outcome
    # The first refused worker names the cause; the other may find that worker's listener
    # closed already (it stopped at its refusal), and then says it cannot reach it.
    named = [str(e) for e in outcome.values() if "refused this worker's proof of the job "
             "secret" in str(e) and "set the same KDIST_JOB_SECRET on every task" in str(e)]
    assert named, outcome
    assert all(str(e) in named or "cannot reach the ring's successor" in str(e)
               for e in outcome.values()), outcome


def test_the_deadline_names_the_refused_connections():
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    store = {}

    def intruder():
        store["kdist/ring/0/0"] = f"127.0.0.1:{listener.getsockname()[1]}"

    from kdist.exchange import ring

    thread = threading.Thread(target=lambda: store.update(verdict=_intrude(store)))
    intruder()
    thread.start()
    with pytest.raises(RingError, match=r"did not join within 2 s; refused 1 connection\(s\) that "
                                        r"did not prove the job secret \(from 127\.0\.0\.1:"):
        ring._admit(listener, b"s", 0, 1, "127.0.0.1:9001", 2.0)
    thread.join()
    listener.close()
