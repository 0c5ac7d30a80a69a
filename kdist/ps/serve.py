"""`kdist.serve()`: run a ps or worker task of parameter-server training, and stop when the chief is done.

In parameter-server training only the chief runs the user's training loop; ps tasks hold variables
and worker tasks execute the steps the chief schedules. Their TensorFlow servers never exit on their
own (the classic stuck job, kubeflow/trainer#774). `serve()` runs the server and watches the
chief's gRPC port: once the chief has been up and then stays unreachable for `chief_grace` seconds,
the process exits with code 0; under `kdist launch`, at once when the launcher sees the chief
succeed (`CHIEF_DONE_SIGNAL`). `kdist.scope()` calls it on ps and worker tasks, so every task can run
the same script.

>>> import kdist
>>> with kdist.scope():          # on ps/worker tasks of a ps cluster: serves, then exits the process
...     pass                      # doctest: +SKIP
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
import time

from kdist import envvars, startup
from kdist.cluster import ClusterSpec, cluster
from kdist.validators import UsageError

logger = logging.getLogger("kdist")

# `kdist launch` sends it once the chief has succeeded (kdist.launch.launcher: CHIEF_DONE_SIGNAL):
# the servers leave at once instead of after `chief_grace` seconds without the chief.
CHIEF_DONE_SIGNAL = signal.SIGUSR2


def serve(spec: ClusterSpec | None = None, chief_grace: float | None = None,
          chief_start_timeout: float | None = None, poll: float = 1.0) -> None:
    """Serves this ps/worker task until the chief has finished, then exits the process (code 0;
    code 69 if the chief never came up within `chief_start_timeout`, saying so every 30 s)."""
    spec = spec or cluster()
    if spec.task_type not in ("ps", "worker") or not spec.has_ps:
        raise RuntimeError(f"task {spec.task}: kdist.serve() runs the ps and worker tasks of a "
                           "parameter-server cluster; the chief trains, other clusters use scope()")
    chief_grace = _seconds(chief_grace, envvars.CHIEF_GRACE, 10.0)
    chief_start_timeout = _seconds(chief_start_timeout, envvars.CHIEF_START_TIMEOUT,
                                   startup.startup_timeout())
    import tensorflow as tf

    # Fail fast on a lost peer and let the coordinator reschedule (TF's advice for ps training).
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    server = tf.distribute.Server(spec.resolver().cluster_spec(), job_name=spec.task_type,
                                  task_index=spec.task_index, protocol=spec.rpc_layer, start=True)
    chief = spec.address("chief", 0)
    done = threading.Event()
    signal.signal(CHIEF_DONE_SIGNAL, lambda *_: done.set())
    logger.info("kdist: task %s serving at %s until the chief (%s) finishes", spec.task,
                server.target, chief)
    try:
        deadline_from = envvars.CHIEF_START_TIMEOUT \
            if os.environ.get(envvars.CHIEF_START_TIMEOUT) else envvars.STARTUP_TIMEOUT
        startup.wait_for_peers(spec, chief_start_timeout, roles=("chief",), what="the chief",
                               hold_own_port=False, deadline_from=deadline_from)
        wait_for_chief_to_end(chief, chief_grace, poll, done)
        code = 0
        logger.info("kdist: the chief finished; task %s exits", spec.task)
    except startup.PeersMissing as missing:
        code = missing.code
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # TF's server threads never join: leave without waiting for them


def wait_for_chief_to_end(address: str, grace: float, poll: float = 1.0,
                          done: threading.Event | None = None) -> None:
    """Blocks until the chief at `address`, up now, has been unreachable for `grace` seconds, or
    until `done` is set (the launcher saw the chief succeed)."""
    done = done or threading.Event()
    last_seen = time.monotonic()
    while time.monotonic() - last_seen < grace and not done.wait(poll):
        if startup.probe(address) is None:
            last_seen = time.monotonic()


def _seconds(value: float | None, variable: str, default: float) -> float:
    """`value`, else the environment variable `variable` (seconds > 0), else `default`."""
    if value is None:
        text = os.environ.get(variable)
        if text is None:
            return default
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        field = f"{variable}={text!r}"
    else:
        field = f"{variable}={value!r}"
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise UsageError(field, "is not a duration", "use a positive number of seconds")
    return float(value)
