"""Exact evaluation on the workers under ParameterServerStrategy (`ps_evaluation="workers"`).

The chief cuts the evaluation data into one shard of whole batches per worker
(`dataset.shard(workers, i)`) and schedules one function per shard on whichever worker is free.
Every worker holds its own copy of the dataset; as with any `Dataset.shard` of a batched dataset,
each shard's pipeline produces every batch and keeps its own, so what the workers split is the
model's work, not the input pipeline's. The function runs the model's `test_step` on each
batch of its shard with the metric variables held in a Keras `StatelessScope`, so it changes no
variable: it returns how much each metric variable would have grown over the shard. The chief
adds the shards' increments to the metric variables (on the ps) and reads the results.

Exactly once: the coordinator runs a function again on another worker when its worker fails; as
the first run left no trace, each shard is counted once, whatever failed. Adding increments is
exact for metric variables that aggregate by sum, as every built-in Keras metric's do (Mean's
total and count, confusion matrices, AUC's buckets); a metric with a variable that aggregates
otherwise is refused with the fix (`kdist.scope(ps_evaluation="chief")`).

Batch-level callbacks see one "batch" per shard: `on_test_batch_begin(i)` when shard i is
scheduled, `on_test_batch_end(i)` (no logs) once every shard is done.
"""

from __future__ import annotations

from kdist.ps.coordinator import cached_function, join_scheduled

SHARDS_PER_WORKER = 1  # each shard's pipeline produces every batch: more shards, more input work


def run(model, dataset, callbacks, coordinator, num_workers: int) -> None:
    """Evaluates `model` on `dataset` over the workers into its metric variables (reset first)."""
    import tensorflow as tf

    variables = _summable_metric_variables(model)
    shards = SHARDS_PER_WORKER * num_workers
    per_worker = coordinator.create_per_worker_dataset(dataset).build()
    evaluate_shard = _shard_function(model, variables)
    increments = []
    for index in range(shards):
        callbacks.on_test_batch_begin(index)
        increments.append(coordinator.schedule(evaluate_shard, args=(
            per_worker, tf.constant(index, tf.int64), tf.constant(shards, tf.int64))))
    join_scheduled(model.distribute_strategy)
    for index in range(shards):
        callbacks.on_test_batch_end(index, None)
    totals = [sum(parts) for parts in zip(*(remote.fetch() for remote in increments))]
    for variable, total in zip(variables, totals):
        variable.assign(variable.value + total)


def _shard_function(model, variables):
    """tf.function(dataset, index, shards) -> increments of `variables` over that shard."""
    import keras
    import tensorflow as tf

    strategy = model.distribute_strategy

    def replica_step(state, batch):
        # The scope is entered where test_step runs: strategy.run may run it in a thread of its
        # own, where a scope entered around the call is not seen (Keras keeps it per thread) and
        # the metric updates would go to the ps variables, racing with the other workers'.
        with keras.StatelessScope(state_mapping=list(zip(variables, state))) as scope:
            model.test_step(batch)
        updated = (scope.get_current_value(variable) for variable in variables)
        return tuple(state if new is None else new for state, new in zip(state, updated))

    def step(state, batch):
        return strategy.run(replica_step, args=(state, batch))

    @tf.function
    def evaluate_shard(dataset, index, shards):
        start = tuple(tf.identity(variable.value) for variable in variables)
        state = start
        for batch in dataset.shard(shards, index):
            state = step(state, batch)
        return tuple(end - begin for end, begin in zip(state, start))

    return cached_function(model, "evaluate_shard", lambda: evaluate_shard)


def _summable_metric_variables(model) -> list:
    variables = list(model.metrics_variables)
    for variable in variables:
        aggregation = getattr(variable, "aggregation", "sum")
        if aggregation != "sum":
            raise ValueError(
                f"metric variable {variable.path} aggregates by {aggregation!r}: evaluation on the "
                "workers adds each shard's increments, which is exact only for variables that "
                "aggregate by 'sum' (as every built-in Keras metric's do). Create it with "
                "add_variable(..., aggregation='sum') if it is a running total, or evaluate on "
                "the chief: kdist.scope(ps_evaluation='chief')")
    return variables
