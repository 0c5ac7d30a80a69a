"""A plain Keras fit in a process whose TF_CONFIG is not kdist's business, with kdist's patches
installed and then removed: prints a JSON report (weights both ways, what fit printed)."""

import contextlib
import io
import json

import keras
import numpy as np

from kdist.keras_seam import patches as keras_seam


def train():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # verbose="auto": Keras's progress bar
        model.fit(np.ones((8, 3)), np.ones((8, 2)), batch_size=4, epochs=2)
        model.evaluate(np.ones((4, 3)), np.ones((4, 2)))
        model.predict(np.ones((4, 3)))
    return [w.tolist() for w in model.get_weights()], printed.getvalue()


keras_seam.install()
patched_weights, patched_output = train()
keras_seam.uninstall()
plain_weights, plain_output = train()


def shape(output):
    """What fit/evaluate/predict printed, without the timings: epochs, bar cells, step counters."""
    return [output.count("Epoch "), output.count("\u2501"), output.count("2/2"),
            output.count("1/1")]


print(json.dumps({"same_weights": patched_weights == plain_weights,
                  "patched_printed": shape(patched_output), "plain_printed": shape(plain_output),
                  "patched_has_bar": "2/2" in patched_output}))
