"""MNIST on 2 workers with gradient compression: `python examples/compression.py --compressor=powersgd:4`.

Same cluster, data and model as mnist_multiworker.py (it launches itself without TF_CONFIG); the
gradients cross the network compressed. Prints the test accuracy and the reduction in bytes.
"""

import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mnist_multiworker  # noqa: E402  (defines the shared flags)

FLAGS = flags.FLAGS
flags.DEFINE_string("compressor", "powersgd:4",
                    "how gradients are compressed: none, fp16, bf16, powersgd:RANK or topk:RATIO")


def main(argv):
    # kdist.scope(compression=...) takes the name as it is (or a kdist.compression object).
    return mnist_multiworker.launch_or_train(__file__, lambda: mnist_multiworker.train(
        FLAGS.data, FLAGS.epochs, FLAGS.per_replica_batch, FLAGS.learning_rate, FLAGS.data_dir,
        FLAGS.checkpoint_dir, compression=FLAGS.compressor))


if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
