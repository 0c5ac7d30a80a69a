"""MNIST on a multi-worker cluster with kdist: `python examples/mnist_multiworker.py`.

With no TF_CONFIG it launches itself on a local cluster of --workers processes on 127.0.0.1 (the
parent picks the data once and passes it on). With TF_CONFIG (a Kubernetes pod, `kdist launch`) it
just trains as that task. Global batch = --per_replica_batch x replicas; the learning rate follows
the linear scaling rule with a warm-up. Prints the test accuracy.
"""

import os
import sys

from absl import app, flags, logging

import kdist

FLAGS = flags.FLAGS
flags.DEFINE_enum("data", "auto", ["auto", "mnist", "offline", "digits"],
                  "auto: MNIST from tensorflow-datasets, or offline (said loudly) the 10,000 "
                  "MNIST digits shipped in examples/data; digits: 1,797 8x8 UCI digits (fast)")
flags.DEFINE_string("data_dir", None, "tensorflow-datasets data directory")
flags.DEFINE_integer("epochs", 5, "training epochs")
flags.DEFINE_integer("per_replica_batch", 64, "batch size per replica")
flags.DEFINE_float("learning_rate", 1e-3, "single-replica Adam learning rate (scaled by replicas)")
flags.DEFINE_integer("workers", 2, "workers of the local cluster launched when TF_CONFIG is unset")
flags.DEFINE_float("timeout", 1800, "seconds before the local cluster is stopped")
flags.DEFINE_string("checkpoint_dir", None, "where the chief saves model-{epoch}.keras (optional)")


def build_model(input_shape, learning_rate, steps_per_epoch, first_dense=None):
    """MLP 256-256-10 with Adam (linear LR scaling + warm-up); `first_dense` replaces the first
    Dense layer class (the parameter-server example passes kdist.layers.PartitionedDense)."""
    import keras

    model = keras.Sequential([
        keras.Input(input_shape),
        keras.layers.Flatten(),
        (first_dense or keras.layers.Dense)(256, activation="relu"),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(10),
    ])
    schedule = kdist.LinearWarmup(kdist.scale_learning_rate(learning_rate),
                                  warmup_steps=max(1, steps_per_epoch // 2))
    model.compile(keras.optimizers.Adam(schedule),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def train(source, epochs, per_replica_batch, learning_rate, data_dir=None, checkpoint_dir=None,
          compression=None, **strategy_options):
    """Trains on `source` ('auto', 'mnist', 'offline' or 'digits') under kdist.scope(**strategy_options),
    compressing gradients with `compression` if given; returns the test accuracy."""
    import mnist_data

    # The strategy comes first: preparing MNIST runs TF ops, and MultiWorkerMirrored must exist
    # before any.
    strategy = kdist.strategy(**strategy_options)
    data = mnist_data.load(mnist_data.resolve(source, data_dir), data_dir)
    global_batch = kdist.global_batch_size(per_replica_batch)
    steps_per_epoch = -(-len(data.x_train) // global_batch)
    with kdist.scope(compression=compression, **strategy_options):
        model = build_model(data.x_train.shape[1:], learning_rate, steps_per_epoch)
    callbacks = []
    if checkpoint_dir:
        callbacks.append(kdist.callbacks.ModelCheckpoint(
            os.path.join(checkpoint_dir, "model-{epoch}.keras")))
    model.fit(data.x_train, data.y_train, batch_size=global_batch, epochs=epochs,
              callbacks=callbacks)
    _, accuracy = model.evaluate(data.x_test, data.y_test, batch_size=global_batch, verbose=0)
    if kdist.cluster().is_chief:
        print(f"{data.name}: test accuracy {accuracy:.4f} after {epochs} epochs, "
              f"{strategy.num_replicas_in_sync} replica(s), global batch {global_batch}")
        if compression is not None:
            ratio = kdist.compression.stats(model)["comm_ratio"]
            print(f"{compression}: {ratio:.1f}x fewer gradient bytes per step than float32")
    return accuracy


def launch_or_train(script, train_task):
    """Inside a cluster (TF_CONFIG, or an srun step of several tasks): `train_task()` as this task.
    Otherwise: picks the data once, then runs `script` with the same flags on a local cluster of
    --workers; returns the exit code."""
    logging.set_verbosity(logging.WARNING)  # app.run turns on TF's INFO chatter
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import mnist_data

    if kdist.cluster().is_distributed:
        train_task()
        return 0
    from kdist.launch import Launcher

    source = mnist_data.resolve(FLAGS.data, FLAGS.data_dir)
    command = [sys.executable, os.path.abspath(script), *sys.argv[1:], f"--data={source}"]
    print(f"No TF_CONFIG: launching a local cluster of {FLAGS.workers} workers on 127.0.0.1")
    spec = kdist.ClusterSpec.local_layout({"worker": FLAGS.workers})
    return Launcher(spec, command, timeout=FLAGS.timeout).run()


def main(argv):
    return launch_or_train(__file__, lambda: train(
        FLAGS.data, FLAGS.epochs, FLAGS.per_replica_batch, FLAGS.learning_rate, FLAGS.data_dir,
        FLAGS.checkpoint_dir))


if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
