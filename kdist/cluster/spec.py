"""The cluster model: one validated view of TF_CONFIG for every strategy, the launcher and manifests.

A `ClusterSpec` is what TensorFlow reads from `TF_CONFIG` (jobs with addresses, this process's task),
checked up front so that a bad cluster fails with a message naming the field and the fix instead of a
hang or a gRPC error minutes later. Strategies get TensorFlow's own cluster resolver from it
(`TFConfigClusterResolver` when the spec came from the environment), so kdist never re-implements
what TensorFlow already reads.

Example:

>>> spec = ClusterSpec.from_tf_config(
...     '{"cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]},'
...     ' "task": {"type": "worker", "index": 1}}')
>>> spec.task, spec.num_workers, spec.is_chief
('worker:1', 2, False)
>>> spec.tf_config("worker", 0)["task"]
{'type': 'worker', 'index': 0}
"""

from __future__ import annotations

import json
import logging
from typing import Any, Mapping

from kdist import global_state, validators
from kdist.validators import UsageError

# The job names TensorFlow accepts, in the order kdist lists them.
JOBS = ("chief", "worker", "ps", "evaluator")
_TOP_LEVEL_KEYS = ("cluster", "task", "rpc_layer", "environment")
# Keys platforms add that neither TF's strategies nor kdist read: accepted without a word.
PLATFORM_KEYS = {"job": "Vertex AI / AI Platform Training: the job's own specification"}
# Task keys: TF reads type and index; AI Platform Training adds trial (hyperparameter tuning) and
# cloud (an internal id). Anything else in "task" is a mistake and an error.
_TASK_KEYS = ("type", "index", "trial", "cloud")
logger = logging.getLogger("kdist")
MAX_LOCAL_TASKS = 64  # tasks of one local cluster (each a TF process on this host)
MAX_TASKS = 100_000  # tasks of any cluster a spec describes: checked before anything is expanded


class ClusterSpecError(UsageError):
    """A cluster description that TensorFlow would reject or misread.

    The message names the offending field, what is wrong with it and how to fix it. `rule` names
    the case of `kdist.cluster.strictness.STRICTER` when TensorFlow itself would accept it.
    """

    def __init__(self, field: str, problem: str, fix: str, rule: str | None = None):
        from kdist.cluster.strictness import STRICTER

        if rule is not None and rule not in STRICTER:
            raise ValueError(f"unknown strictness rule {rule!r}")
        super().__init__(field, problem, fix)
        self.rule = rule


class ClusterSpec:
    """A validated cluster: jobs with their addresses, plus (optionally) this process's task.

    Build one with `ClusterSpec.from_tf_config(...)`, `kdist.cluster()` (reads the environment) or
    `ClusterSpec.local_layout(...)` (addresses for a local launch). A spec without a task describes
    a whole cluster (what the launcher and manifest renderers need); `with_task()` picks one task.
    """

    def __init__(self, jobs: Mapping[str, list[str]], task_type: str | None = None,
                 task_index: int | None = None, rpc_layer: str = "grpc",
                 environment: str | None = None, source: str = "TF_CONFIG",
                 from_environment: bool = False):
        if not isinstance(jobs, Mapping):
            raise ClusterSpecError(f"{source}.cluster", f"must be an object, got {_kind(jobs)}",
                                   'use {"worker": ["host:port", ...]}')
        # A job with no task is no job (as for TensorFlow); anything else is checked just below.
        self.jobs = {job: list(jobs[job]) if isinstance(jobs[job], (list, tuple)) else jobs[job]
                     for job in JOBS if job in jobs and jobs[job] != []}
        self.task_type = task_type
        self.task_index = task_index
        self.rpc_layer = rpc_layer
        self.environment = environment
        self.source = source
        self.from_environment = from_environment  # TF reads this same TF_CONFIG itself
        _validate_jobs(self.jobs, prefix=f"{source}.cluster")
        if task_type is not None or task_index is not None:
            _validate_task(self.jobs, task_type, task_index, prefix=f"{source}.task")

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_tf_config(cls, config: str | Mapping[str, Any], source: str = "TF_CONFIG",
                       from_environment: bool = False) -> "ClusterSpec":
        """Parses and validates a TF_CONFIG (JSON text or an already decoded dict).

        `from_environment`: the text is this process's own TF_CONFIG variable, so strategies may let
        TensorFlow's `TFConfigClusterResolver` read it.
        """
        if isinstance(config, str):
            config = _parse_json(config, source)
        if not isinstance(config, Mapping):
            raise ClusterSpecError(source, f"must be a JSON object, got {type(config).__name__}",
                                   'use {"cluster": {...}, "task": {...}}', rule="not_an_object")
        _warn_about_unknown_keys(config, source)
        cluster = config.get("cluster", {})
        if not isinstance(cluster, Mapping):
            raise ClusterSpecError(f"{source}.cluster", f"must be an object, got {_kind(cluster)}",
                                   'use {"worker": ["host:port", ...]}')
        _check_jobs_are_known(cluster, prefix=f"{source}.cluster")
        if all(v == [] for v in cluster.values()):  # no job, or only jobs without tasks
            if "task" in config:
                raise ClusterSpecError(f"{source}.cluster", "missing or empty while a task is given",
                                       'add "cluster": {"worker": ["host:port", ...]}',
                                       rule="task_without_cluster")
            return cls({}, source=source)
        task = config.get("task")
        if task is None:
            raise ClusterSpecError(f"{source}.task", "missing",
                                   'add "task": {"type": "worker", "index": 0} naming this process',
                                   rule="cluster_without_task")
        if not isinstance(task, Mapping):
            raise ClusterSpecError(f"{source}.task", f"must be an object, got {_kind(task)}",
                                   'use {"type": "worker", "index": 0}', rule="task_not_object")
        unknown = sorted(set(task) - set(_TASK_KEYS), key=str)
        if unknown:
            raise ClusterSpecError(f"{source}.task.{unknown[0]}", "unknown key",
                                   f"a task takes only {', '.join(_TASK_KEYS)}", rule="task_key")
        if task.get("type") is None and task.get("index") is None:
            raise ClusterSpecError(f"{source}.task", "names no task (no type, no index)",
                                   'add "type": "worker", "index": 0 naming this process',
                                   rule="cluster_without_task")
        _check_jobs_are_known(cluster, prefix=f"{source}.cluster")
        environment = config.get("environment")
        if environment is not None and not isinstance(environment, str):
            raise ClusterSpecError(f"{source}.environment", f"must be a string, got {environment!r}",
                                   'remove it or write e.g. "environment": "cloud"',
                                   rule="environment")
        rpc_layer = config.get("rpc_layer", "grpc")
        if rpc_layer != "grpc":
            raise ClusterSpecError(f"{source}.rpc_layer", f"{rpc_layer!r} is not supported",
                                   'remove it or set it to "grpc"', rule="rpc_layer")
        if task.get("type") == "evaluator" and cluster.get("evaluator") == []:
            raise ClusterSpecError(f"{source}.cluster.evaluator", "an empty list while this task "
                                   "is the evaluator: TensorFlow refuses it (task_id 0 exceeds the "
                                   "maximum id)", "remove the evaluator job from cluster (an "
                                   "evaluator needs no entry there) or give its address")
        return cls(cluster, task.get("type"), task.get("index"), rpc_layer=rpc_layer,
                   environment=environment, source=source,
                   from_environment=from_environment)

    @classmethod
    def local_layout(cls, roles: Mapping[str, int], host: str = "127.0.0.1",
                     ports: list[int] | None = None, source: str = "local") -> "ClusterSpec":
        """A cluster of `roles` (job -> task count) on one host, one port per task.

        With no `ports`, free ports are picked on `host` with portpicker.
        """
        counts = validate_roles(roles, source)
        total = sum(counts.values())
        if total > MAX_LOCAL_TASKS:
            raise ClusterSpecError(f"{source}.roles", f"{total} tasks on one host",
                                   f"a local cluster has at most {MAX_LOCAL_TASKS} tasks; deploy "
                                   "larger jobs on Kubernetes or Slurm")
        if ports is None:
            ports = _free_ports(total)
        if len(ports) != total:
            raise ClusterSpecError(f"{source}.ports", f"{len(ports)} ports for {total} tasks",
                                   "give one port per task")
        return cls(_jobs_on(counts, host, ports), source=source)

    def with_task(self, task_type: str, task_index: int) -> "ClusterSpec":
        """This cluster as seen by one of its tasks."""
        return ClusterSpec(self.jobs, task_type, task_index, self.rpc_layer, self.environment,
                           self.source)  # another task: no longer the environment's own spec

    def without(self, task_type: str, task_index: int) -> "ClusterSpec":
        """This cluster without one task; the tasks after it in its job move up one index (the
        launcher's smaller restart after a lost host). A job left empty disappears."""
        jobs = {job: [a for i, a in enumerate(addresses) if (job, i) != (task_type, task_index)]
                for job, addresses in self.jobs.items()}
        return ClusterSpec({job: addresses for job, addresses in jobs.items() if addresses},
                           rpc_layer=self.rpc_layer, environment=self.environment,
                           source=self.source)

    # ----------------------------------------------------------------- queries
    @property
    def is_distributed(self) -> bool:
        """True when TF_CONFIG describes a cluster (even a 1-task one)."""
        return bool(self.jobs)

    @property
    def task(self) -> str | None:
        """This process's task as ``"type:index"``, or None outside a cluster."""
        return None if self.task_type is None else f"{self.task_type}:{self.task_index}"

    @property
    def roles(self) -> dict[str, int]:
        """Job name -> number of tasks."""
        return {job: len(addresses) for job, addresses in self.jobs.items()}

    @property
    def num_workers(self) -> int:
        """Tasks that compute gradients in synchronous training: chief plus workers (1 outside a cluster)."""
        return max(1, len(self.jobs.get("chief", ())) + len(self.jobs.get("worker", ())))

    @property
    def has_ps(self) -> bool:
        return bool(self.jobs.get("ps"))

    @property
    def leader(self) -> tuple[str, int] | None:
        """The task whose success means the job succeeded: the chief, else worker 0."""
        if "chief" in self.jobs:
            return ("chief", 0)
        if "worker" in self.jobs:
            return ("worker", 0)
        return None

    @property
    def is_chief(self) -> bool:
        """True on the task that writes checkpoints and logs (and outside any cluster)."""
        return self.task_type is None or (self.task_type, self.task_index) == self.leader

    def tasks(self) -> list[tuple[str, int]]:
        """Every (job, index) of the cluster, chief first."""
        return [(job, i) for job, addresses in self.jobs.items() for i in range(len(addresses))]

    def address(self, task_type: str, task_index: int) -> str:
        return self.jobs[task_type][task_index]

    def tf_config(self, task_type: str | None = None, task_index: int | None = None) -> dict:
        """The TF_CONFIG dict for a task (default: this spec's own task)."""
        task_type = self.task_type if task_type is None else task_type
        task_index = self.task_index if task_index is None else task_index
        _validate_task(self.jobs, task_type, task_index, prefix="task")
        config = {"cluster": {job: list(a) for job, a in self.jobs.items()},
                  "task": {"type": task_type, "index": task_index}}
        if self.rpc_layer != "grpc":
            config["rpc_layer"] = self.rpc_layer
        if self.environment:
            config["environment"] = self.environment
        return config

    def tf_config_json(self, task_type: str | None = None, task_index: int | None = None) -> str:
        return json.dumps(self.tf_config(task_type, task_index), separators=(",", ":"))

    def resolver(self, num_gpus: int | None = None):
        """TensorFlow's cluster resolver for this spec.

        From the environment this is `TFConfigClusterResolver` itself (TF reads TF_CONFIG as it always
        does); for a spec built in code, or with `num_gpus` (the GPUs each task replicates over,
        instead of every local one), a `SimpleClusterResolver` over the same jobs and task.
        """
        import tensorflow as tf

        if self.from_environment and num_gpus is None:
            return tf.distribute.cluster_resolver.TFConfigClusterResolver()
        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(self.jobs), task_type=self.task_type, task_id=self.task_index,
            rpc_layer=self.rpc_layer,
            num_accelerators=None if num_gpus is None else {"GPU": num_gpus})

    def __eq__(self, other):
        return isinstance(other, ClusterSpec) and self.identity() == other.identity()

    def __hash__(self):
        return hash(self.identity())

    def identity(self) -> tuple:
        """What makes two specs equal: jobs, task and RPC layer."""
        return (tuple((j, tuple(a)) for j, a in self.jobs.items()), self.task_type, self.task_index,
                self.rpc_layer)

    def __repr__(self):
        roles = ", ".join(f"{job}={n}" for job, n in self.roles.items()) or "single process"
        return f"ClusterSpec({roles}, task={self.task})"


def validate_roles(roles: Mapping[str, Any], source: str) -> dict[str, int]:
    """Checks job -> task count as TF would check the cluster; returns the counts in kdist's order.
    Counts are bounded before any task is expanded (`MAX_TASKS`, one chief, one evaluator)."""
    _check_jobs_are_known(roles, prefix=f"{source}.roles")
    counts = {job: _count(roles[job], f"{source}.roles.{job}") for job in JOBS if job in roles}
    for job in ("chief", "evaluator"):
        if counts.get(job, 0) > 1:
            raise ClusterSpecError(f"{source}.roles.{job}", f"{counts[job]} tasks, TF allows at "
                                   "most one", f"keep one {job} and make the others workers")
    if sum(counts.values()) > MAX_TASKS:
        raise ClusterSpecError(f"{source}.roles", f"{sum(counts.values())} tasks in all",
                               f"describe at most {MAX_TASKS:,} tasks (a TensorFlow cluster of "
                               "more is untested: split the job)")
    ClusterSpec({job: [f"task{i}.{job}:1" for i in range(n)] for job, n in counts.items() if n},
                source=source)
    return counts


# --------------------------------------------------------------------- validation helpers
def _warn_about_unknown_keys(config: Mapping[str, Any], source: str) -> None:
    """Top-level keys TF ignores are ignored here too (never stricter than TF), with one warning
    per key and process; the keys platforms document (`PLATFORM_KEYS`) are accepted silently."""
    for key in sorted(set(config) - set(_TOP_LEVEL_KEYS) - set(PLATFORM_KEYS), key=str):
        warned = global_state.process().unknown_keys_warned  # once per process
        if key not in warned:
            warned.add(key)
            logger.warning("kdist: %s.%s: unknown key, ignored (TensorFlow ignores it too; kdist "
                           "reads %s)", source, key, ", ".join(_TOP_LEVEL_KEYS))


def _parse_json(text: str, source: str):
    """TF_CONFIG's JSON; an empty text is no cluster."""
    if not text.strip():
        return {}
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ClusterSpecError(source, f"not valid JSON ({err.msg} at line {err.lineno} "
                               f"column {err.colno})",
                               'write it as a JSON object such as {"cluster": {"worker": '
                               '["host:port"]}, "task": {"type": "worker", "index": 0}}') from None
    except RecursionError:
        raise ClusterSpecError(source, "nested too deeply to be a TF_CONFIG",
                               'write it as {"cluster": {...}, "task": {...}}') from None


def _kind(value: Any) -> str:
    """What a JSON value is, for a message: its type, or a short repr."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _check_jobs_are_known(jobs: Mapping[str, Any], prefix: str) -> None:
    for job in jobs:
        _check_job_name(job, f"{prefix}.{job}")


def _check_job_name(job: Any, field: str) -> None:
    if job == "master":
        raise ClusterSpecError(field, "'master' is the TF1 name of the coordinator and TF 2 rejects "
                               "it", "rename the job to 'chief'")
    if job not in JOBS:
        raise ClusterSpecError(field, f"unknown job {job!r}", f"use one of {', '.join(JOBS)}")


def _validate_jobs(jobs: Mapping[str, list[str]], prefix: str) -> None:
    _check_jobs_are_known(jobs, prefix)
    seen: dict[str, str] = {}
    for job, addresses in jobs.items():
        if isinstance(addresses, Mapping):
            raise ClusterSpecError(f"{prefix}.{job}", "is a mapping of task indices to addresses",
                                   f'write "{job}": ["host:port", ...] in task order',
                                   rule="job_as_mapping")
        if not isinstance(addresses, (list, tuple)) or not addresses:
            raise ClusterSpecError(f"{prefix}.{job}", "must be a non-empty list of 'host:port' strings",
                                   f'write "{job}": ["host:port", ...] or remove the job')
        for i, address in enumerate(addresses):
            field = f"{prefix}.{job}[{i}]"
            _validate_address(address, field)
            if address in seen:
                raise ClusterSpecError(field, f"address {address} is also used by {seen[address]}",
                                       "give every task its own host:port",
                                       rule="duplicate_address")
            seen[address] = field
    for job in ("chief", "evaluator"):
        if len(jobs.get(job, ())) > 1:
            raise ClusterSpecError(f"{prefix}.{job}", f"{len(jobs[job])} tasks, TF allows at most one",
                                   f"keep one {job} and make the others workers")
    if jobs.get("ps"):
        for needed in ("worker", "chief"):
            if not jobs.get(needed):
                raise ClusterSpecError(f"{prefix}.{needed}", f"parameter-server training needs a "
                                       f"{needed} and there is none",
                                       f'add "{needed}": ["host:port"] (chief coordinates, workers '
                                       "compute, ps hold variables)", rule="ps_without_workers")


def _validate_address(address: Any, field: str) -> None:
    if not isinstance(address, str):
        raise ClusterSpecError(field, f"address {_kind(address)} is not a string",
                               "write it as 'host:port', e.g. '127.0.0.1:2222'")
    if not address.strip():
        raise ClusterSpecError(field, "empty address",
                               "write it as 'host:port', e.g. '127.0.0.1:2222'", rule="address")
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ClusterSpecError(field, f"address {address!r} has no host or no port",
                               "write it as 'host:port', e.g. '127.0.0.1:2222'", rule="address")
    if not validators.is_digits(port) or not validators.port(int(port)):
        raise ClusterSpecError(field, f"bad port {port!r} in {address!r}",
                               "use a port number from 1 to 65535", rule="address")


def _validate_task(jobs: Mapping[str, list[str]], task_type: Any, task_index: Any, prefix: str) -> None:
    if not isinstance(task_type, str) or not task_type:
        raise ClusterSpecError(f"{prefix}.type", f"missing or not a string ({_kind(task_type)})",
                               f"set it to one of {', '.join(JOBS)}")
    _check_job_name(task_type, f"{prefix}.type")
    if not validators.is_count(task_index):
        negative = isinstance(task_index, int) and not isinstance(task_index, bool)
        raise ClusterSpecError(f"{prefix}.index", f"must be a non-negative integer, got "
                               f"{_kind(task_index)}", 'write e.g. "index": 0',
                               rule="negative_index" if negative else "index_not_integer")
    count = len(jobs.get(task_type, ()))
    if task_type == "evaluator" and count == 0:
        if task_index != 0:
            raise ClusterSpecError(f"{prefix}.index", f"evaluator index {task_index} out of range",
                                   "there is one evaluator: use index 0", rule="evaluator_index")
        return
    if count == 0:
        raise ClusterSpecError(f"{prefix}.type", f"job {task_type!r} is not in the cluster",
                               f'add "{task_type}" to "cluster" or pick one of '
                               f"{', '.join(jobs) or 'its jobs'}")
    if task_index >= count:
        raise ClusterSpecError(f"{prefix}.index", f"index {task_index} out of range: job "
                               f"{task_type!r} has {count} task(s)",
                               f"use an index from 0 to {count - 1}")


def _count(value: Any, field: str) -> int:
    if not validators.is_count(value):
        raise ClusterSpecError(field, f"task count must be a non-negative integer, got {value!r}",
                               "write e.g. 2")
    return value


def _jobs_on(counts: Mapping[str, int], host: str, ports) -> dict[str, list[str]]:
    it = iter(ports)
    return {job: [f"{host}:{next(it)}" for _ in range(n)] for job, n in counts.items() if n}


def _free_ports(count: int) -> list[int]:
    import portpicker

    ports: list[int] = []
    while len(ports) < count:
        port = portpicker.pick_unused_port()
        if port not in ports:
            ports.append(port)
    return ports
