"""MNIST with MirroredStrategy in one process: `python examples/mnist_mirrored.py`.

Replicates over the local GPUs when there are at least two, else splits the CPU into
--cpu_devices logical devices (the way to try synchronous data parallelism on a laptop). Same
flags, model and data as mnist_multiworker.py.
"""

import os
import sys

from absl import app, flags, logging

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kdist  # noqa: E402
import mnist_multiworker  # noqa: E402  (defines the shared flags)

FLAGS = flags.FLAGS
flags.DEFINE_integer("cpu_devices", 2, "logical CPU devices to replicate over when there is no GPU")


def main(argv):
    import tensorflow as tf

    logging.set_verbosity(logging.WARNING)
    if "TF_CONFIG" in os.environ:
        raise app.UsageError("mnist_mirrored.py trains in one process; unset TF_CONFIG, or use "
                             "mnist_multiworker.py for a cluster")
    gpus = tf.config.list_physical_devices("GPU")
    devices = None if len(gpus) > 1 else kdist.split_cpu(FLAGS.cpu_devices)
    mnist_multiworker.train(FLAGS.data, FLAGS.epochs, FLAGS.per_replica_batch, FLAGS.learning_rate,
                            FLAGS.data_dir, FLAGS.checkpoint_dir, strategy="mirrored",
                            devices=devices)


if __name__ == "__main__":
    app.run(main)
