"""Shared by the parameter-server test programs (ps_job.py, ps_sync_job.py), imported from their
own folder: an exact example count and a way to reach another task's process."""

import keras
import psutil


class ExampleCount(keras.metrics.Metric):
    """Examples seen in the epoch: exact only if no metric update is lost."""

    def __init__(self, name="examples", **kwargs):
        super().__init__(name=name, **kwargs)
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.count.assign_add(keras.ops.cast(keras.ops.shape(y_true)[0], "float32"))

    def result(self):
        return self.count


def task_process(spec, task_type, index):
    """The local process of task `task_type:index` of `spec` (found by its TF_CONFIG), or None."""
    wanted = spec.tf_config_json(task_type, index)
    for process in psutil.process_iter():
        try:
            if process.environ().get("TF_CONFIG") == wanted:
                return process
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            pass
    return None
