"""MNIST with the hidden layers split across devices: `python examples/model_parallel_dense.py`.

A column-parallel ModelParallelDense (units split over the devices, output left split) feeds a
row-parallel one (features split, one reduction for the pair), Megatron style. Uses the local GPUs
when there are two or more, else splits the CPU into --cpu_devices logical devices. Prints the
test accuracy and how many kernel bytes each device holds.
"""

import os
import sys

from absl import app, flags, logging

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kdist  # noqa: E402
import mnist_data  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_enum("data", "auto", ["auto", "mnist", "offline", "digits"],
                  "as in mnist_multiworker.py")
flags.DEFINE_string("data_dir", None, "tensorflow-datasets data directory")
flags.DEFINE_integer("epochs", 5, "training epochs")
flags.DEFINE_integer("hidden", 1024, "units of the column-parallel layer")
flags.DEFINE_integer("cpu_devices", 2, "logical CPU devices when there are fewer than 2 GPUs")


def main(argv):
    import tensorflow as tf

    logging.set_verbosity(logging.WARNING)
    gpus = tf.config.list_physical_devices("GPU")
    devices = None if len(gpus) > 1 else kdist.split_cpu(FLAGS.cpu_devices)
    import keras

    data = mnist_data.load(mnist_data.resolve(FLAGS.data, FLAGS.data_dir), FLAGS.data_dir)
    column = kdist.layers.ModelParallelDense(FLAGS.hidden, devices=devices, gather_output=False,
                                             activation="relu")
    row = kdist.layers.ModelParallelDense(256, devices=devices, partition="row",
                                          input_is_split=True, activation="relu")
    model = keras.Sequential([keras.Input(data.x_train.shape[1:]), keras.layers.Flatten(), column,
                              row, keras.layers.Dense(10)])
    model.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(data.x_train, data.y_train, batch_size=128, epochs=FLAGS.epochs)
    _, accuracy = model.evaluate(data.x_test, data.y_test, verbose=0)
    print(f"{data.name}: test accuracy {accuracy:.4f} after {FLAGS.epochs} epochs, layers split over "
          f"{len(column.devices)} devices")
    for layer in (column, row):
        per_device = [int(k.shape[0] * k.shape[1]) * 4 for k in layer.kernel_shards]
        print(f"{layer.partition} layer kernel bytes per device: {per_device} "
              f"(whole kernel {sum(per_device)})")


if __name__ == "__main__":
    app.run(main)
