"""kdist's TCP ring all-reduce (`kdist.exchange.ring`) between real sockets: every worker gets the
same sum, equal to NumPy's within float summation order, for 2 to 4 workers, float32, float16 and
bfloat16, uneven sizes; a silent peer ends in an error naming it, never a hang. (Two real worker
processes training through it: tests/test_multi_worker.py.)"""

import threading

import numpy as np
import pytest

from kdist.exchange.ring import Ring, RingError


def rings(size, timeout=20.0, generation=0):
    """`size` connected rings in this process (threads), rendezvous through a dict."""
    store, changed = {}, threading.Condition()

    def publish(key, value):
        with changed:
            store[key] = value
            changed.notify_all()

    def lookup(key):
        with changed:
            changed.wait_for(lambda: key in store, timeout)
            return store[key]

    addresses = [f"127.0.0.1:{9000 + r}" for r in range(size)]
    made = [None] * size
    threads = [threading.Thread(target=lambda r=r: made.__setitem__(r, Ring.connect(
        r, addresses, publish, lookup, timeout, generation=generation))) for r in range(size)]
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


def test_a_silent_peer_fails_the_all_reduce_naming_it():
    members = rings(2, timeout=2.0)
    with pytest.raises(RingError, match=r"127\.0\.0\.1:9001 sent nothing for 2 s"):
        members[0].all_reduce_sum(np.ones(1000, "float32"))  # worker 1 never joins this one


def test_rings_of_other_models_do_not_mix():
    """Each ring is a generation (every worker builds its models in the same order): a worker
    that joins another generation's ring is refused, naming the fix."""
    store = {"kdist/ring/3/1": "127.0.0.1:1"}  # a stale address of another ring
    with pytest.raises(RingError, match="cannot reach the ring's successor"):
        Ring.connect(0, ["127.0.0.1:1", "127.0.0.1:2"], store.__setitem__, store.__getitem__,
                     timeout=0.5, generation=3)
