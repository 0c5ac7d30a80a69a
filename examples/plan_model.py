"""A model for `kdist plan`: the MLP of benchmarks/planner_validation.py (64 -> 1024 -> 1024 -> 10).

    kdist plan --model examples/plan_model.py:mlp --per-replica-batch 32 --replicas 8 \\
        --bandwidth 1Gbit --latency 50us --compression powersgd:4
"""

import keras


def mlp(width: int = 1024):
    """A compiled MLP on 8x8 digit images (1.2 M parameters, 4.8 MB of float32 gradients)."""
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(width, activation="relu"),
                              keras.layers.Dense(width, activation="relu"), keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(0.05),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
