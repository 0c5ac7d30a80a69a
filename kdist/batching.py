"""Global batch size and learning-rate scaling for synchronous data parallelism.

With n replicas each taking `per_replica` examples, one step sees n x per_replica examples (the
"batch_size = 32 * NUM_GPUS" rule). The linear scaling rule multiplies the learning rate by the
same factor; a warm-up ramps it in for large global batches (Goyal et al., 2017).

>>> import kdist, keras
>>> with kdist.scope():
...     lr = kdist.LinearWarmup(kdist.scale_learning_rate(0.1), warmup_steps=100)
...     model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
...     model.compile(optimizer=keras.optimizers.SGD(lr), loss="mse")
>>> kdist.global_batch_size(64)
64
"""

from __future__ import annotations

import keras

from kdist import validators, verify_plan
from kdist.strategies import registry


def _replicas(strategy) -> int:
    """The replicas in sync; in `kdist verify`'s one-device run, the distributed run's (its one
    device stands for them with the global batch)."""
    return verify_plan.replayed_replicas() or (strategy or registry.current()).num_replicas_in_sync


def global_batch_size(per_replica: int, strategy=None) -> int:
    """Per-replica batch x replicas in sync (of `strategy`, default: the last `kdist.scope()`)."""
    validators.positive_int(per_replica, "per_replica")
    return per_replica * _replicas(strategy)


def scale_learning_rate(base_learning_rate: float, strategy=None) -> float:
    """Linear scaling rule: the single-replica learning rate x replicas in sync."""
    if not base_learning_rate > 0:
        raise ValueError(f"base_learning_rate={base_learning_rate!r}: use a positive learning rate")
    return float(base_learning_rate) * _replicas(strategy)


@keras.saving.register_keras_serializable(package="kdist")
class LinearWarmup(keras.optimizers.schedules.LearningRateSchedule):
    """Ramps the learning rate linearly from `initial` to `target` over `warmup_steps`, then hands
    over to `after` (a schedule, called with the steps since warm-up ended) or stays at `target`.

    Args:
        target: learning rate reached at the end of warm-up (e.g. `kdist.scale_learning_rate(0.1)`).
        warmup_steps: optimizer steps of warm-up (> 0).
        initial: learning rate at step 0 (default 0.0: a ramp from zero).
        after: optional `LearningRateSchedule` for the steps after warm-up.
    """

    def __init__(self, target, warmup_steps, initial=0.0, after=None):
        if not target > 0:
            raise ValueError(f"target={target!r}: use a positive learning rate")
        validators.positive_int(warmup_steps, "warmup_steps")
        if not 0 <= initial <= target:
            raise ValueError(f"initial={initial!r}: use a value from 0 to target={target}")
        self.target = float(target)
        self.warmup_steps = warmup_steps
        self.initial = float(initial)
        self.after = after

    def __call__(self, step):
        from keras import ops

        step = ops.cast(step, "float32")
        ramp = self.initial + (self.target - self.initial) * step / self.warmup_steps
        rest = self.after(step - self.warmup_steps) if self.after is not None else self.target
        return ops.where(step < self.warmup_steps, ramp, rest)

    def get_config(self):
        return {"target": self.target, "warmup_steps": self.warmup_steps, "initial": self.initial,
                "after": keras.saving.serialize_keras_object(self.after) if self.after else None}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if config.get("after") is not None:
            config["after"] = keras.saving.deserialize_keras_object(config["after"])
        return cls(**config)
