"""MNIST with parameter-server training: `python examples/mnist_parameter_server.py`.

With no TF_CONFIG it launches cluster_specs/local-ps.json (chief + 2 workers + 2 ps) on 127.0.0.1,
the same as `kdist launch --spec cluster_specs/local-ps.json -- python examples/mnist_parameter_server.py`.
Every task runs this script: on ps and worker tasks `kdist.strategy()` serves the chief and exits
when it is done; the chief trains with asynchronous SGD, the first layer's kernel split over the ps
(kdist.layers.PartitionedDense), and prints the test accuracy. Flags as mnist_multiworker.py.
"""

import os
import sys

from absl import app, flags, logging

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kdist  # noqa: E402
import mnist_multiworker  # noqa: E402  (defines the shared flags)

FLAGS = flags.FLAGS
flags.DEFINE_string("spec", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                         "cluster_specs", "local-ps.json"),
                    "cluster launched when TF_CONFIG is unset")
flags.DEFINE_string("backup_dir", None, "BackupAndRestore directory: a rerun resumes from it")


def train(source, epochs, per_worker_batch, learning_rate, data_dir=None, backup_dir=None):
    """On the chief: asynchronous training through the ps; returns the test accuracy."""
    import mnist_data

    kdist.strategy()  # ps and worker tasks serve here, and exit when the chief is done
    data = mnist_data.load(mnist_data.resolve(source, data_dir), data_dir)
    steps_per_epoch = -(-len(data.x_train) // per_worker_batch)
    with kdist.scope():
        model = mnist_multiworker.build_model(data.x_train.shape[1:], learning_rate,
                                              steps_per_epoch, kdist.layers.PartitionedDense)
    callbacks = [kdist.callbacks.BackupAndRestore(backup_dir)] if backup_dir else []
    model.fit(data.x_train, data.y_train, batch_size=per_worker_batch, epochs=epochs,
              steps_per_epoch=steps_per_epoch, callbacks=callbacks)
    _, accuracy = model.evaluate(data.x_test, data.y_test, batch_size=256, verbose=0)
    print(f"{data.name}: test accuracy {accuracy:.4f} after {epochs} epochs of asynchronous "
          f"training, {kdist.cluster().roles['worker']} workers, {kdist.cluster().roles['ps']} ps, "
          f"batch {per_worker_batch} per step")
    return accuracy


def main(argv):
    logging.set_verbosity(logging.WARNING)
    if "TF_CONFIG" in os.environ:
        train(FLAGS.data, FLAGS.epochs, FLAGS.per_replica_batch, FLAGS.learning_rate,
              FLAGS.data_dir, FLAGS.backup_dir)
        return 0
    import mnist_data
    from kdist.launch import Launcher
    from kdist.cluster.spec_file import load_spec

    source = mnist_data.resolve(FLAGS.data, FLAGS.data_dir)
    spec = load_spec(FLAGS.spec)
    print(f"No TF_CONFIG: launching {FLAGS.spec} ({spec.roles}) on 127.0.0.1")
    command = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], f"--data={source}"]
    return Launcher(spec, command, timeout=FLAGS.timeout).run()


if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
