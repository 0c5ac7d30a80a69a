"""What `kdist plan` measures on this machine: t1 (a training step of the user's model on one
replica) and the host cost of a real all-reduce (two workers on the loopback)."""

from __future__ import annotations

import copy
import os
import time


def measure_host_cost(payload: int, timeout: float = 300) -> float:
    """Seconds per byte a real all-reduce costs this machine's CPUs when the wire is free: two
    MultiWorkerMirrored workers on the loopback (`kdist launch`) sum `payload` bytes as they sum
    gradients (kdist's TCP ring on CPU workers)."""
    import json
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "host_cost.json")
        code = f"from kdist.planner import host_cost; host_cost.task({payload}, {out!r})"
        subprocess.run([sys.executable, "-m", "kdist", "launch", "--workers", "2", "--timeout",
                        str(timeout), "--", sys.executable, "-c", code], check=True,
                       timeout=timeout + 30,  # the launcher stops its tasks within that
                       stdout=subprocess.DEVNULL, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        with open(out) as f:
            seconds = json.load(f)["seconds"]
    return seconds / payload  # n = 2: each worker moves 2(n-1)/n x payload = payload bytes


def measure_compute_time(model_fn, per_replica_batch: int, steps: int = 8, repeats: int = 5) -> float:
    """t1: seconds of one training step of `model_fn()` on one replica of this machine (the best
    of `repeats` averages over `steps` steps, so that noise from other processes is left out)."""
    return measure_compute(model_fn, per_replica_batch, steps, repeats)[0]


def measure_compute(model_fn, per_replica_batch: int, steps: int = 8,
                    repeats: int = 5) -> tuple[float, float]:
    """(t1, spread): `measure_compute_time`'s best, and (slowest - best) / best of its repeats."""
    import keras
    import numpy as np

    model = model_fn()
    if not model.compiled:
        model.compile("sgd", "mse")
    rng = np.random.default_rng(0)
    x = [rng.normal(size=(per_replica_batch, *i.shape[1:])).astype("float32") for i in model.inputs]
    y = [rng.normal(size=(per_replica_batch, *o.shape[1:])).astype("float32")
         for o in model.outputs]
    if isinstance(model.loss, str) and "sparse" in model.loss or \
            isinstance(model.loss, keras.losses.SparseCategoricalCrossentropy):
        y = [rng.integers(0, o.shape[-1], size=(per_replica_batch,)) for o in model.outputs]
    x, y = (x[0] if len(x) == 1 else x), (y[0] if len(y) == 1 else y)
    for _ in range(3):  # trace and warm up
        model.train_on_batch(x, y)
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(steps):
            model.train_on_batch(x, y)
        timings.append((time.perf_counter() - started) / steps)
    return min(timings), (max(timings) - min(timings)) / min(timings)


def measure_compression(model, compressor, replicas: int, steps: int = 4,
                        repeats: int = 5) -> float:
    """Seconds per step that `compressor` adds to this machine's CPU for `model`'s gradients:
    compressing them, summing the payload as kdist's TCP ring does (NumPy, in the payload's own
    dtype: a float16 sum costs many times a float32 one) and decompressing the sums, for
    `replicas` replicas. The bytes' time on the wire is t2's, not this. 0.0 for no compressor."""
    import keras
    import tensorflow as tf

    variables = [v for v in model.trainable_variables
                 if compressor is not None and compressor.should_compress(tuple(v.shape))]
    if not variables:
        return 0.0
    compressor = copy.copy(compressor)  # its stage is this measurement's, as an Exchange's is
    compressor.enter_stage(compressor.stage_at(compressor.last_stage_step()))
    grads = [tf.random.normal(v.shape, seed=k) * 1e-3 for k, v in enumerate(variables)]
    states = [{name: keras.Variable(initializer, shape=shape, dtype="float32", trainable=False)
               for name, (shape, initializer) in compressor.state_spec(tuple(v.shape)).items()}
              for v in variables]
    comm = _LocalComm(replicas)
    step = tf.function(lambda: compressor.aggregate(grads, states, comm))
    for _ in range(2):  # trace and warm up
        step()
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(steps):
            float(tf.reduce_sum(step()[0]))
        timings.append((time.perf_counter() - started) / steps)
    return min(timings)


class _LocalComm:
    """The collectives of `measure_compression` on one process: an all-reduce adds each payload
    element as each of `replicas` ring members does ((n-1)/n of the elements, NumPy, the payload's
    dtype); an all-gather hands decompression `replicas` payloads."""

    def __init__(self, replicas: int):
        import tensorflow as tf

        self.replicas, self.step = replicas, tf.constant(0, tf.int64)

    def all_reduce_sum(self, tensors: list) -> list:
        import numpy as np
        import tensorflow as tf

        share = (self.replicas - 1) / self.replicas

        def ring_adds(*arrays):
            sums = []
            for array in arrays:
                flat = np.ascontiguousarray(array).reshape(-1)
                summed, added = np.empty_like(flat), int(flat.size * share)
                np.add(flat[:added], flat[:added], out=summed[:added])
                summed[added:] = flat[added:]
                sums.append(summed.reshape(array.shape))
            return sums

        return [tf.ensure_shape(s, t.shape) for s, t in zip(
            tf.numpy_function(ring_adds, list(tensors), [t.dtype for t in tensors],
                              stateful=True), tensors)] if tensors else []

    def all_gather(self, tensors: list) -> list:
        import tensorflow as tf

        return [tf.concat([t] * self.replicas, axis=0) for t in tensors]
