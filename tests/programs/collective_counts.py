"""Shared by the test programs that count TensorFlow's collectives (mirrored_equivalence.py,
mwms_job.py), imported from their own folder."""


def reduces(strategy, run) -> int:
    """How many of TensorFlow's reduces across `strategy`'s replicas `run()` makes."""
    calls = []
    original = strategy.extended.reduce_to
    strategy.extended.reduce_to = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        run()
    finally:
        del strategy.extended.reduce_to
    return len(calls)
