"""`kdist.scope()`: pick, build and enter the right `tf.distribute` strategy for this process.

>>> import kdist, keras
>>> with kdist.scope() as strategy:            # TF_CONFIG + devices decide the strategy
...     model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
...     model.compile(optimizer="sgd", loss="mse")
>>> strategy.num_replicas_in_sync
1
"""

from __future__ import annotations

import contextlib
import logging
import os

from kdist import envvars, global_state, strategies
from kdist.cluster import cluster
from kdist.keras_seam import inputs, patches, tf_internals
from kdist.ps.serve import serve
from kdist.validators import UsageError

# Imported inside functions: the training options and the exchange, which `import kdist` must not
# load (their engines import TensorFlow).

logger = logging.getLogger("kdist")



def strategy(strategy: str = "auto", **options):
    """The strategy `kdist.scope()` would enter, built once per configuration and then reused.

    Args:
        strategy: ``"auto"`` (default), ``"default"``, ``"mirrored"``, ``"multi_worker"`` or
            ``"parameter_server"``. The ``KDIST_STRATEGY`` environment variable overrides ``"auto"``.
        **options: see `kdist.strategies.StrategyOptions` (devices, all_reduce, bytes_per_pack,
            collective_timeout, variable_partitioner).
    """
    return _build_or_reuse(strategy, options)


def build_multi_worker_before_first_op() -> None:
    """The tutorials' order, where datasets and tensors come before `kdist.scope()`.

    MultiWorkerMirroredStrategy must be built before TensorFlow initialises its runtime (TF
    configures its collectives once). `import kdist` calls this when TF_CONFIG names several
    workers: TensorFlow's first op (whatever runs it: a dataset, a tensor, a model) first builds the
    strategy with the default options, after any device configuration the script made
    (`split_cpu`, memory growth), and a later `kdist.scope()` enters it. A script that calls
    `kdist.strategy(...)` / `kdist.scope(...)` before any op builds it itself, options included.
    """
    def build():
        state = global_state.process()
        if state.current_key is None and not state.building:
            _build_or_reuse("auto", {})
            state.built_ahead = True

    # Already initialised: nothing to do, kdist.scope() will explain the ordering rule.
    tf_internals.run_before_first_op(build)


def _build_or_reuse(requested: str, options: dict):
    name = _requested_name(requested)
    opts = strategies.StrategyOptions.from_kwargs(options)
    spec = cluster()
    state = global_state.process()
    current_key = state.current_key
    if name == "auto" and not options and current_key is not None and current_key[2] == spec:
        return strategies.registry.current()  # a bare scope() after kdist.strategy(...)
    if spec.has_ps and spec.task_type in ("ps", "worker"):
        serve(spec)  # a ps/worker task of parameter-server training: serves, then exits the process
    if name == "auto":
        name = strategies.choose(spec, opts, num_gpus=_num_gpus(), num_cpus=_num_logical_cpus())
    key = (name, opts, spec)
    built = state.built
    if key not in built:
        if state.built_ahead and name == "multi_worker":
            raise RuntimeError(_rebuild_refused(options, spec))
        state.building = True  # TF's first op may run in here: no second strategy
        try:
            patches.ensure()
            built[key] = strategies.build(name, spec, opts)
            seed = inputs.seed_unseeded_shuffles() if name == "multi_worker" else None
        finally:
            state.building = False
        _log_choice(name, built[key], spec, opts, seed)
    state.current_key = key
    strategies.registry.make_current(built[key])
    return built[key]


def _rebuild_refused(options: dict, spec) -> str:
    given = ", ".join(f"{k}={v!r}" for k, v in options.items())
    return (f"kdist.scope({given}): kdist built MultiWorkerMirroredStrategy with the default "
            f"options before TensorFlow's first op (TF_CONFIG names {spec.num_workers} workers), "
            "so that your script may build datasets before kdist.scope(); TensorFlow cannot "
            "configure its collectives twice. To pass options, call kdist.strategy(**options) "
            "before the first TensorFlow op (dataset, tensor or model)")


# The scope's own options (training options), beside the strategy's (`StrategyOptions`).
SCOPE_OPTIONS = ("strategy", "compression", "aggregate_every", "ps_sync", "balance", "bucket_bytes",
                 "check_replicas", "watch_steps", "hang_timeout", "hang_action")


@contextlib.contextmanager
def scope(strategy: str = "auto", compression=None, aggregate_every: int = 1, ps_sync="async",
          balance=None, bucket_bytes=None, check_replicas="error", watch_steps=True,
          hang_timeout=None, hang_action=None, **options):
    """Context manager: enters the chosen strategy's scope and yields the strategy.

    The training options (`kdist.wiring.options.TrainingOptions`) apply to the models compiled
    inside the block, checked once against the strategy:

    - `compression`: a name of `kdist.compression.registry` (``"powersgd:4"``) or a
      `kdist.compression.Compressor`; `aggregate_every`: all-reduce every k steps, accumulating
      locally; `bucket_bytes`: all-reduce in buckets of about that many bytes, last layer first,
      each as soon as its gradients exist (`kdist.exchange.buckets`). Mirrored and
      MultiWorkerMirrored.
    - `balance`: ``"measure"`` or one share per replica (`kdist.balance`): each global batch split
      over the replicas in proportion to their speed, the update unchanged.
    - `ps_sync`: ``"async"``, ``"ksync:K"``, ``"kbatch:K"`` or ``"stale:S"`` (`kdist.ps.sync`): how
      parameter-server updates synchronise.
    - `check_replicas`: ``"error"`` (default), ``"warn"`` or ``"off"``: at the end of every epoch
      `fit` checks that every replica and worker holds the same variables (`kdist.replicas`).
    - `watch_steps` (default True), `hang_timeout`, `hang_action` (``"report"`` or ``"exit"``):
      under MultiWorkerMirrored, every step is timed (input wait, compute, communication), the
      chief names the slowest worker at each epoch's end, and a hang (no step completed for
      `hang_timeout` seconds, default 20 median steps and at least 60) dumps every thread's stack
      and says where each worker is (`kdist.steps`).

    `**options` build the strategy (`kdist.strategies.StrategyOptions`).

    On the ps and worker tasks of a parameter-server cluster it never returns: the process serves
    the chief (`kdist.serve()`) and exits when the chief is done.

    Auto-selection: a ps job in TF_CONFIG -> ParameterServer; more than one chief/worker ->
    MultiWorkerMirrored; more than one local GPU, several `devices=` or a CPU split with
    `kdist.split_cpu(n)` -> Mirrored over them; else the
    default strategy. A bare `scope()` (no strategy, no options) after `kdist.strategy(...)` or
    `kdist.scope(...)` enters that same strategy. Create models and call `compile()` inside.
    """
    from kdist.compression import one_host
    from kdist.exchange import buckets
    from kdist.wiring import options as training_options

    strategies.StrategyOptions.from_kwargs(options, also=SCOPE_OPTIONS)  # a typo: the one meant
    requested = training_options.TrainingOptions.parse(
        compression=compression, aggregate_every=aggregate_every, bucket_bytes=bucket_bytes,
        balance=balance, ps_sync=ps_sync, check_replicas=check_replicas, watch_steps=watch_steps,
        hang_timeout=hang_timeout, hang_action=hang_action)
    chosen = _build_or_reuse(strategy, options)
    requested.checked_for(chosen)
    one_host.warn_if_one_host(requested.compression, chosen, strategies.cluster_of(chosen))
    if requested.bucket_bytes is not None:
        buckets.warn_if_serial()
    with chosen.scope(), training_options.activated(requested):
        yield chosen


def current_strategy():
    """The strategy of the most recent `kdist.scope()`, else TensorFlow's current strategy."""
    return strategies.registry.current()


def _requested_name(argument: str) -> str:
    from_env = os.environ.get(envvars.STRATEGY, "").strip()
    if from_env and argument != "auto" and from_env != argument:
        raise UsageError("strategy", f"kdist.scope(strategy={argument!r}) conflicts with "
                         f"{envvars.STRATEGY}={from_env!r}",
                         "unset the variable or drop the argument")
    name = argument if argument != "auto" else (from_env or "auto")
    if name != "auto" and name not in strategies.NAMES:
        source = "strategy" if argument != "auto" else envvars.STRATEGY
        raise UsageError(source, f"{name!r} is not a strategy",
                         f"use 'auto' or one of {', '.join(strategies.NAMES)}")
    return name


def _num_gpus() -> int:
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


def _num_logical_cpus() -> int:
    """Logical CPU devices: more than one only where the script split the CPU (`split_cpu`).
    Read from the configuration, so that TensorFlow is not initialised (MultiWorkerMirrored must
    still be buildable after this)."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    return len(tf.config.get_logical_device_configuration(cpu) or [cpu])


def _log_choice(name, built, spec, opts, seed) -> None:
    unused = strategies.inapplicable_options(name, opts)
    note = f"; options not used by this strategy: {', '.join(unused)}" if unused else ""
    if seed is not None:
        note += (f"; TensorFlow's random seed set to {seed} on every worker, so unseeded "
                 "tf.data shuffles take one order (tf.random.set_seed for your own)")
    plan = strategies.plan_of(built)
    if plan is not None and plan.gradients_over_tcp:
        how = "all_reduce='tcp'" if opts.all_reduce == "tcp" else \
            "the default on CPU workers; all_reduce='ring' for TensorFlow's collectives"
        note = f"; gradients summed by kdist's TCP ring ({how}){note}"
    logger.info("kdist: strategy %s (%s), %d replica(s) in sync, task %s%s", name,
                type(built).__name__, built.num_replicas_in_sync, spec.task or "local", note)
