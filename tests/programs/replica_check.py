"""kdist's replica check under MirroredStrategy on 2 logical CPUs, run by tests/test_replicas.py:

    python tests/programs/replica_check.py

Prints one JSON report: for a model whose BatchNormalization statistics drift apart (kdist's fix
removed, as Keras ships it), what fit does with check_replicas 'error' (the default), 'warn' and
'off', and what kdist.check_replicas says on demand, for it and for a healthy model.
"""

import json
import logging

import kdist

kdist.split_cpu(2)
import keras  # noqa: E402
import numpy as np  # noqa: E402
from kdist.keras_seam import patches  # noqa: E402

rng = np.random.default_rng(0)
x, y = rng.normal(size=(64, 4)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


lines = Lines()
logging.getLogger("kdist").addHandler(lines)


def drifting(check):
    with kdist.scope(check_replicas=check):
        patches.patch("batch_norm_statistics_averaged").uninstall()
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8),
                                  keras.layers.BatchNormalization(), keras.layers.Dense(1)])
        model.compile("adam", "mse")
    patches.install()
    return model


report = {}
for check in ("error", "warn", "off"):
    model = drifting(check)
    lines.lines.clear()
    try:
        history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)
        report[check] = {"epochs": len(history.history["loss"])}
    except kdist.ReplicasDisagree as error:
        report[check] = {"error": str(error), "variables": [d.variable for d in error.differences]}
    report[check]["warnings"] = [line for line in lines.lines if "disagree" in line]
found = kdist.check_replicas(model, on_mismatch="warn")
report["on_demand"] = [(d.variable.split("/")[-1], d.replicas, d.largest > 0) for d in found]
with kdist.scope():
    healthy = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8),
                                keras.layers.BatchNormalization(), keras.layers.Dense(1)])
    healthy.compile("adam", "mse")
healthy.fit(x, y, batch_size=16, epochs=2, verbose=0)
report["healthy"] = kdist.check_replicas(healthy)
print(json.dumps(report))
