"""What synchronized BatchNormalization costs on 2 workers: a CNN's whole fit, per-replica
statistics (Keras's default) against `BatchNormalization(synchronized=True)`.

    python benchmarks/batchnorm.py [--rounds 3]

The work (issue "the same training as one device inside the step"): a CNN on the 8,000 training
digits of the 10,000 MNIST digits kdist's examples ship (Conv 16 3x3, BatchNormalization, ReLU, max-pool, Conv 32 3x3,
BatchNormalization, ReLU, global average pool, Dense 10), Adam, `fit(batch_size=64 x workers,
epochs=2, shuffle=False)` under `kdist.scope()` on 2 workers launched by `kdist launch`, each
pinned to one core with one compute thread, on 127.0.0.1. Synchronized statistics add one
all-reduce of each layer's batch sums per step (forward) and TensorFlow's own collectives for
them (kdist's TCP ring sums only the gradients). Per run: the whole fit, the median warm step
(epoch 2), the step's share of per-replica's. Rounds take turns; the table shows medians over
rounds. Saves benchmarks/results/batchnorm.{json,md}.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402
import results_table  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PER_WORKER_BATCH, EPOCHS, ROWS = 64, 2, 8_000  # examples/data/mnist_offline.npz's x_train
CONTENDERS = ("per-replica statistics", "synchronized=True")


def train(out_path: str, synchronized: bool) -> None:
    """One worker's fit of the launched job."""
    measure.pin_worker_to_one_core()
    measure.one_thread()
    import keras
    import numpy as np

    import kdist

    kdist.strategy()
    data = np.load(os.path.join(ROOT, "examples", "data", "mnist_offline.npz"))
    images = (data["x_train"][..., None] / 255.0).astype("float32")
    labels = data["y_train"].astype("int32")
    with kdist.scope():
        keras.utils.set_random_seed(1)
        layers = keras.layers
        model = keras.Sequential([
            keras.Input(images.shape[1:]),
            layers.Conv2D(16, 3), layers.BatchNormalization(synchronized=synchronized),
            layers.Activation("relu"), layers.MaxPooling2D(),
            layers.Conv2D(32, 3), layers.BatchNormalization(synchronized=synchronized),
            layers.Activation("relu"), layers.GlobalAveragePooling2D(), layers.Dense(10)])
        model.compile(keras.optimizers.Adam(1e-3),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    report, history = measure.timed_fit(model, images, labels, EPOCHS,
                                        batch_size=PER_WORKER_BATCH * 2, shuffle=False)
    measure.write_task_report(out_path, {**report, "last_loss": history.history["loss"][-1]})


def run(contender: str, folder: str) -> dict:
    synchronized = contender.startswith("synchronized")
    return measure.fit_on_two_workers(
        os.path.abspath(__file__), os.path.join(folder, contender.replace(" ", "_").replace(
            "=", "_")), ["--synchronized"] if synchronized else [], contender)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--train")
    parser.add_argument("--synchronized", action="store_true")
    args = parser.parse_args()
    if args.train:
        return train(args.train, args.synchronized)
    runs, medians = measure.in_rounds(CONTENDERS, args.rounds, run)
    title = (f"CNN with 2 BatchNormalization layers on {ROWS:,} MNIST digits, Adam, {EPOCHS} "
             f"epochs, global batch {2 * PER_WORKER_BATCH} on 2 workers (one core each); "
             f"medians of {args.rounds} rounds")
    results_table.save("batchnorm", measure.fit_table(title, "BatchNormalization", medians),
                       {"runs": runs, "medians": medians})


if __name__ == "__main__":
    main()
