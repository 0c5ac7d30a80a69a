"""A plain Keras program with `import kdist` and no kdist.scope(), as a user writes it: run as a
task of a multi-worker TF_CONFIG by tests/test_startup.py. Prints "epoch N" after each epoch.

    python tests/programs/plain_fit.py EPOCHS
"""

import sys

import kdist  # noqa: F401
import keras
import numpy as np

model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
print_epoch = keras.callbacks.LambdaCallback(
    on_epoch_end=lambda epoch, logs: print(f"epoch {epoch + 1}", flush=True))
model.fit(np.ones((64, 4)), np.ones((64, 1)), batch_size=8, epochs=int(sys.argv[1]), verbose=0,
          callbacks=[print_epoch])
print("done", flush=True)
