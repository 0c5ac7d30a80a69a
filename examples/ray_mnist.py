"""MNIST on Ray Train with kdist: `python examples/ray_mnist.py` (needs the `ray` extra).

Ray's `TensorflowTrainer` starts --workers training workers and writes each one's TF_CONFIG; the
train loop is the usual Keras code plus ``kdist.scope()``, so it trains under MultiWorkerMirrored.
`kdist.integrations.ray.ReportCheckpoint` reports each epoch's metrics to Ray with a checkpoint
from rank 0, and kdist's `BackupAndRestore` saves every --save_freq steps; when a worker dies,
`FailureConfig(max_failures=--max_failures)` has Ray restart the group, which resumes at the
backup's step. With no --address it starts a local Ray cluster of this machine's CPUs on loopback.
Data: MNIST from tensorflow-datasets, or (offline, said loudly) the 10,000 MNIST digits shipped in
examples/data.
"""

import os
import sys
import tempfile

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_enum("data", "auto", ["auto", "mnist", "offline", "digits"],
                  "auto: MNIST from tensorflow-datasets, or offline (said loudly) the 10,000 "
                  "MNIST digits shipped in examples/data; digits: 1,797 8x8 UCI digits (fast)")
flags.DEFINE_integer("workers", 2, "Ray training workers")
flags.DEFINE_integer("epochs", 5, "training epochs")
flags.DEFINE_integer("per_replica_batch", 64, "batch size per worker")
flags.DEFINE_integer("save_freq", 20, "steps between kdist backups")
flags.DEFINE_integer("max_failures", 2, "worker-group restarts Ray may make")
flags.DEFINE_string("storage", None, "Ray's storage path (default: a temporary folder)")
flags.DEFINE_string("address", None, "a running Ray cluster's address (default: start one here)")

EXAMPLES = os.path.dirname(os.path.abspath(__file__))


def train_loop_per_worker(config):
    """What runs on every Ray worker: the Keras code of examples/mnist_multiworker.py."""
    sys.path.insert(0, config["examples"])
    import kdist
    import mnist_data
    from kdist.integrations.ray import ReportCheckpoint
    from mnist_multiworker import build_model

    kdist.strategy()  # MultiWorkerMirrored from Ray's TF_CONFIG, before any TF op
    data = mnist_data.load(config["data"])
    global_batch = kdist.global_batch_size(config["per_replica_batch"])
    steps_per_epoch = -(-len(data.x_train) // global_batch)
    with kdist.scope():
        model = build_model(data.x_train.shape[1:], 1e-3, steps_per_epoch)
    backup = kdist.callbacks.BackupAndRestore(config["backup_dir"], save_freq=config["save_freq"])
    model.fit(data.x_train, data.y_train, batch_size=global_batch, epochs=config["epochs"],
              callbacks=[ReportCheckpoint(), backup], verbose=2)
    _, accuracy = model.evaluate(data.x_test, data.y_test, batch_size=global_batch, verbose=0)
    if kdist.cluster().is_chief:
        print(f"{data.name}: test accuracy {accuracy:.4f} after {config['epochs']} epochs on "
              f"{kdist.cluster().num_workers} Ray workers", flush=True)


def main(argv):
    sys.path.insert(0, EXAMPLES)
    import mnist_data

    if FLAGS.address is None:  # one node on loopback: Ray's laptop mode
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    source = mnist_data.resolve(FLAGS.data)  # once, on the driver: every worker trains on it
    storage = FLAGS.storage or tempfile.mkdtemp(prefix="kdist-ray-")
    ray.init(address=FLAGS.address, include_dashboard=False)
    try:
        trainer = TensorflowTrainer(
            train_loop_per_worker,
            train_loop_config={"examples": EXAMPLES, "data": source, "epochs": FLAGS.epochs,
                               "per_replica_batch": FLAGS.per_replica_batch,
                               "save_freq": FLAGS.save_freq,
                               "backup_dir": os.path.join(storage, "kdist-backup")},
            scaling_config=ScalingConfig(num_workers=FLAGS.workers),
            run_config=RunConfig(name="kdist-mnist", storage_path=storage,
                                 failure_config=FailureConfig(max_failures=FLAGS.max_failures)))
        result = trainer.fit()
    finally:
        ray.shutdown()
    print(f"Ray: final metrics {result.metrics}; checkpoint {result.checkpoint.path}")
    return 0 if result.error is None else 1


if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
