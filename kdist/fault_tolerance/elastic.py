"""Resuming a backup on another number of workers: where the epoch goes on, and with what batch.

A `kdist.callbacks.BackupAndRestore` backup records the position in the interrupted epoch in
*examples* (steps x global batch), with the global batch, replicas and workers that wrote it. A job
restarted on another world size (by hand, by Kubernetes, or by `kdist launch --min-workers`) gets
its position back in its own batches, and one line saying which batch policy the restarted script
applied:

- **keep the global batch** (the script passes the same ``batch_size``): the per-replica batch
  changes, the learning rate does not. The global batch must split into whole per-replica batches.
- **keep the per-replica batch** (the script passes ``kdist.global_batch_size(per_replica)``): the
  global batch changes, and with ``kdist.scale_learning_rate``/``LinearWarmup`` the learning rate.

The policy is the script's, not a kdist setting: kdist reads it from the batch `fit` is given.

>>> saved = {"epoch": 1, "step": 3, "examples": 384, "global_batch": 128, "replicas": 2,
...          "workers": 2}
>>> plan = resume_plan(saved, Shape(global_batch=192, replicas=3, workers=3))
>>> plan.step, plan.partial
(2, None)
>>> print(plan.message)
kdist: resuming on 3 worker(s), 3 replica(s) (the backup was written by 2 worker(s), 2 replica(s)): kept the per-replica batch 64: global batch 128 -> 192; epoch 1 goes on after example 384 = step 2 of 192
"""

from __future__ import annotations

import dataclasses

from kdist.keras_seam import tf_internals


@dataclasses.dataclass(frozen=True)
class Shape:
    """The data-parallel shape of a `fit`: global batch (None when kdist cannot tell), replicas in
    sync and workers."""

    global_batch: int | None
    replicas: int
    workers: int

    def as_metadata(self) -> dict:
        return {"global_batch": self.global_batch, "replicas": self.replicas,
                "workers": self.workers}


@dataclasses.dataclass(frozen=True)
class ResumePlan:
    """Where the restored epoch goes on: `step` whole batches of the new size are skipped; then,
    when the saved position falls inside the next batch, `partial` = (first, end) examples of it
    are trained as one smaller batch, or (when kdist cannot read the input's examples) that whole
    batch is trained and its `retrained` examples before the position see a second step.
    `message` says what changed (None when nothing did)."""

    step: int
    partial: tuple[int, int] | None = None
    retrained: int = 0
    message: str | None = None


def resume_plan(saved: dict, now: Shape, can_split_a_batch: bool = True) -> ResumePlan:
    """The plan for resuming the backup metadata `saved` (epoch, step, examples, global_batch,
    replicas, workers) in a `fit` of shape `now`; `can_split_a_batch`: kdist can read this fit's
    examples by position (`examples_between`)."""
    step = int(saved.get("step", 0))
    before = Shape(saved.get("global_batch"), saved.get("replicas", now.replicas),
                   saved.get("workers", now.workers))
    if before.global_batch is None or (now.replicas, now.global_batch) == (before.replicas,
                                                                           before.global_batch):
        return ResumePlan(step)  # the same shape, or a backup that cannot tell: steps are steps
    if now.global_batch is None:
        raise ValueError(
            f"resuming a backup written with global batch {before.global_batch} on "
            f"{before.replicas} replica(s) on {now.replicas} replica(s), but kdist cannot tell "
            "the global batch of this fit's input: pass arrays with batch_size=, or a "
            "tf.data.Dataset batched with .batch(global_batch)")
    _check_whole_per_replica_batch(before, now)
    header = (f"kdist: resuming on {now.workers} worker(s), {now.replicas} replica(s) (the backup "
              f"was written by {before.workers} worker(s), {before.replicas} replica(s)): "
              f"{_policy(before, now)}")
    if not step:
        return ResumePlan(0, message=header)
    examples = int(saved.get("examples", step * before.global_batch))
    epoch = saved.get("epoch", 0)
    step, inside = divmod(examples, now.global_batch)
    if not inside:
        return ResumePlan(step, message=header + f"; epoch {epoch} goes on after example "
                                                 f"{examples} = step {step} of {now.global_batch}")
    end = (step + 1) * now.global_batch  # the batch holding the position ends here
    if can_split_a_batch:
        return ResumePlan(step, partial=(examples, end), message=header + (
            f"; epoch {epoch} stopped after example {examples}, which no batch of "
            f"{now.global_batch} ends at: it goes on with one batch of the {end - examples} "
            f"examples {examples}-{end - 1}, then batches of {now.global_batch} from step "
            f"{step + 2}"))
    return ResumePlan(step, retrained=inside, message=header + (
        f"; epoch {epoch} stopped after example {examples}, which no batch of {now.global_batch} "
        f"ends at, and kdist cannot read this input by position: it goes on from step "
        f"{step + 1}, and the {inside} examples {examples - inside}-{examples - 1} are trained a "
        f"second time (keep the global batch {before.global_batch}, or pass arrays or a "
        f"tf.data.Dataset, to avoid it)"))


def _policy(before: Shape, now: Shape) -> str:
    per_replica_before = before.global_batch / before.replicas
    per_replica_now = now.global_batch // now.replicas
    if now.global_batch == before.global_batch:
        return (f"kept the global batch {now.global_batch}: per-replica batch "
                f"{per_replica_before:g} -> {per_replica_now}, learning rate unchanged")
    if per_replica_now == per_replica_before:
        return (f"kept the per-replica batch {per_replica_now}: global batch "
                f"{before.global_batch} -> {now.global_batch}")
    return (f"kept neither: global batch {before.global_batch} -> {now.global_batch}, per-replica "
            f"batch {per_replica_before:g} -> {per_replica_now}")


def _check_whole_per_replica_batch(before: Shape, now: Shape) -> None:
    if now.global_batch % now.replicas == 0:
        return
    per_replica = before.global_batch // before.replicas
    lower = now.global_batch - now.global_batch % now.replicas
    raise ValueError(
        f"batch_size: the global batch {now.global_batch} does not split into whole per-replica "
        f"batches over the {now.replicas} replicas of this restart (the backup was written by "
        f"{before.replicas}). Keep the global batch with a multiple of {now.replicas} (e.g. "
        f"{lower or now.replicas}), or keep the per-replica batch with "
        f"batch_size=kdist.global_batch_size({per_replica})")


def readable_by_position(x, y, sample_weight, global_batch: int | None) -> bool:
    """True for the inputs `examples_between` can read: those whose `global_batch_of` is known
    (a batched `tf.data.Dataset`, or arrays), arrays with `sample_weight` only next to `y`."""
    return global_batch is not None and (y is not None or sample_weight is None)


def examples_between(x, y, sample_weight, first: int, end: int):
    """The examples [first, end) of `fit`'s input (`readable_by_position`) as one batch, packed as
    Keras packs them, in a `tf.data.Dataset`. A dataset is read again from its start: its order
    must not change between passes (no reshuffling)."""
    import tensorflow as tf

    if isinstance(x, tf.data.Dataset):
        return x.unbatch().skip(first).take(end - first).batch(end - first)
    packed = (x,) if y is None else (x, y) if sample_weight is None else (x, y, sample_weight)
    return tf.data.Dataset.from_tensor_slices(
        tf.nest.map_structure(lambda a: a[first:end], packed)).batch(end - first)


def _is_arrays(x) -> bool:
    import numpy as np
    import tensorflow as tf

    leaves = tf.nest.flatten(x)
    return bool(leaves) and all(isinstance(leaf, (np.ndarray, tf.Tensor)) for leaf in leaves)


def global_batch_of(x, batch_size) -> int | None:
    """The global batch of `fit(x, batch_size=...)`: `batch_size` (Keras's default 32) for arrays,
    the batch of a batched `tf.data.Dataset`; None for inputs whose batch kdist cannot read
    (generators, `PyDataset`, distributed datasets)."""
    import tensorflow as tf

    if isinstance(x, tf.data.Dataset):
        return _dataset_batch(x)
    return (batch_size or 32) if _is_arrays(x) else None


def _dataset_batch(dataset) -> int | None:
    import tensorflow as tf

    leaves = tf.nest.flatten(dataset.element_spec)
    if leaves and leaves[0].shape.rank and leaves[0].shape[0] is not None:
        return int(leaves[0].shape[0])  # batched with drop_remainder=True
    return tf_internals.batch_size_upstream(dataset)  # .batch(n).map(...): the batch step's
