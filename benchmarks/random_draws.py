"""What drawing as one device costs on 2 workers: a model with Dropout, whole fit, each replica
drawing its rows of one device's draw (kdist) against every replica drawing the same numbers
(Keras as shipped: kdist's fix `random_draws_as_one_device` removed).

    python benchmarks/random_draws.py [--rounds 3]

The work (issue "the same training as one device inside the step"): an MLP on the 8,000
training digits of the 10,000 MNIST digits kdist's examples ship (Flatten, Dense 512, Dropout
0.3, Dense 512, Dropout 0.3, GaussianNoise 0.1, Dense 10), Adam, `fit(batch_size=64 x workers,
epochs=2, shuffle=False)` under `kdist.scope()` on 2 workers launched by `kdist launch`, each
pinned to one core with one compute thread, on 127.0.0.1. Drawing as one device costs one
all-gather of the replicas' batch sizes per step and, on the replica whose rows start at row o,
o more rows of each draw. Per run: the whole fit, the median warm step (epoch 2), the step's
share of the same draws'. Rounds take turns; the table shows medians over rounds. Saves
benchmarks/results/random_draws.{json,md}.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402
import results_table  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PER_WORKER_BATCH, EPOCHS, ROWS = 64, 2, 8_000  # examples/data/mnist_offline.npz's x_train
CONTENDERS = ("the same draws on every replica", "each replica's rows of one device's draw")


def train(out_path: str, same_draws: bool) -> None:
    """One worker's fit of the launched job."""
    measure.pin_worker_to_one_core()
    measure.one_thread()
    import keras
    import numpy as np

    import kdist
    from kdist.keras_seam import patches

    kdist.strategy()
    if same_draws:
        patches.patch("random_draws_as_one_device").uninstall()
    data = np.load(os.path.join(ROOT, "examples", "data", "mnist_offline.npz"))
    images = (data["x_train"] / 255.0).astype("float32")
    labels = data["y_train"].astype("int32")
    with kdist.scope():
        keras.utils.set_random_seed(1)
        layers = keras.layers
        model = keras.Sequential([
            keras.Input(images.shape[1:]), layers.Flatten(),
            layers.Dense(512, activation="relu"), layers.Dropout(0.3, seed=2),
            layers.Dense(512, activation="relu"), layers.Dropout(0.3, seed=3),
            layers.GaussianNoise(0.1, seed=4), layers.Dense(10)])
        model.compile(keras.optimizers.Adam(1e-3),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    report, history = measure.timed_fit(model, images, labels, EPOCHS,
                                        batch_size=PER_WORKER_BATCH * 2, shuffle=False)
    measure.write_task_report(out_path, {**report, "last_loss": history.history["loss"][-1]})


def run(contender: str, folder: str) -> dict:
    same = contender == CONTENDERS[0]
    return measure.fit_on_two_workers(os.path.abspath(__file__),
                                      os.path.join(folder, "same" if same else "rows"),
                                      ["--same-draws"] if same else [], contender)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--train")
    parser.add_argument("--same-draws", action="store_true")
    args = parser.parse_args()
    if args.train:
        return train(args.train, args.same_draws)
    runs, medians = measure.in_rounds(CONTENDERS, args.rounds, run)
    title = (f"MLP with 2 Dropout layers and GaussianNoise on {ROWS:,} MNIST digits, Adam, "
             f"{EPOCHS} epochs, global batch {2 * PER_WORKER_BATCH} on 2 workers (one core "
             f"each); medians of {args.rounds} rounds")
    results_table.save("random_draws", measure.fit_table(title, "random draws", medians),
                       {"runs": runs, "medians": medians})


if __name__ == "__main__":
    main()
