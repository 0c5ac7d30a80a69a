"""The bytes a model's gradient exchange sends per step, for the fit logs and
`kdist.compression.stats`.

>>> import kdist, keras
>>> with kdist.scope(compression="fp16"):
...     model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
...     model.compile("sgd", "mse")
>>> stats(model)["comm_ratio"]
2.0
"""

from __future__ import annotations

import math

from kdist.model_state import exchange_of


def stats(model, compressing: bool = True) -> dict:
    """Nominal bytes one replica sends per optimizer step (a micro-step when aggregate_every > 1)
    once compression has started, and the ratio to plain float32 all-reduce every step
    (collective algorithm and framing not included)."""
    exchange = exchange_of(model)
    compressor = exchange.compressor if exchange is not None and compressing else None
    every = exchange.aggregate_every if exchange is not None else 1
    replicas = model.distribute_strategy.num_replicas_in_sync
    plain = sum(4 * math.prod(v.shape) for v in model.trainable_variables)
    sent = sum(compressor.route(v.shape, replicas)[1] if compressor is not None
               and compressor.should_compress(v.shape) else 4 * math.prod(v.shape)
               for v in model.trainable_variables) / every
    return {"comm_bytes_per_step": sent, "comm_uncompressed_bytes": plain,
            "comm_ratio": plain / sent if sent else math.inf}
