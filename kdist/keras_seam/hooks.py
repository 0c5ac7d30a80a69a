"""The named points where kdist's features plug into Keras, and the object that serves them.

The seam's hook patches (`kdist.keras_seam.hook_points`) call the methods of the connected
`Hooks`; `kdist.wiring.KdistHooks` is the one kdist connects (at `import kdist`). The defaults
here do exactly what Keras does, so a hook patch with nothing connected changes nothing.

A feature never patches Keras: it implements one of these methods (or is called from one).

>>> connected().slot_device(optimizer=None, reference_variable=None) is None
True
"""

from __future__ import annotations


class Hooks:
    """What happens at each hook point; subclass and `connect` an instance to change it."""

    def dispatch(self, name: str, original, arguments):
        """`model.fit` / `evaluate` / `predict` (`name`) called with `arguments` (an
        `inspect.BoundArguments` of Keras's method, `self` included)."""
        return original(*arguments.args, **arguments.kwargs)

    def after_compile(self, model) -> None:
        """`model.compile(...)` has just run: bind what the model trains with."""

    def after_symbolic_build(self, model, epoch_iterator) -> None:
        """`fit` (or evaluate/predict) built the model from the first batch of `epoch_iterator`."""

    def optimizer_built(self, optimizer, variables) -> None:
        """`optimizer.build(variables)` has created its slots: create any state of kdist's."""

    def apply_gradients(self, optimizer, grads_and_vars, original, kwargs):
        """`optimizer.apply_gradients(grads_and_vars, **kwargs)` is called."""
        return original(optimizer, grads_and_vars, **kwargs)

    def exchange_gradients(self, optimizer, grads_and_vars, original):
        """The replicas' gradients are summed (Keras: one all-reduce of them all)."""
        return original(optimizer, grads_and_vars)

    def mean_of_logs(self, strategy, scalars: list, one_step_per_call: bool) -> list:
        """Every step's float32 scalar logs (per-replica values, in cross-replica context)
        averaged over the replicas of a multi-worker strategy (Keras: one all-reduce each).
        `one_step_per_call`: the traced function runs one step, so its collectives end before
        the next step's begin (False under ``steps_per_execution > 1``)."""
        return [strategy.reduce("MEAN", value, axis=None) for value in scalars]

    def metric_results(self, model, original) -> dict:
        """`model.get_metrics_result()` called outside a replica's step (an epoch's end in
        `fit`, the end of `evaluate`): each metric's result across the replicas (Keras: each
        metric variable read across them, one reduce each)."""
        return original(model)

    def update_step(self, optimizer, grads, variables, learning_rate, original):
        """The optimizer updates `variables` with `grads` (Keras: exchange, then apply)."""
        return original(optimizer, grads, variables, learning_rate)

    def apply_weight_decay(self, optimizer, variables, original):
        """The optimizer decays `variables` (Keras: once per update step)."""
        return original(optimizer, variables)

    def loss_divided(self) -> None:
        """Keras divided a loss by the replicas in sync (`scale_loss_for_distribution`: a loss
        object, `compute_loss`) in the replica's step being traced."""

    def accumulation_phase(self, optimizer) -> bool | None:
        """Under several replicas, whether this trace of Keras's gradient accumulation
        (`gradient_accumulation_steps`) accumulates (True) or applies (False); None: no phase is
        known (Keras's own cond then cannot run)."""
        return None

    def draw_offset(self, first_dimension):
        """A random draw in one replica's step of several has `first_dimension` (an int or a
        scalar tensor) first: the row (a scalar tensor) where this replica's rows start in the
        draw one device makes for the global batch, when that dimension is the replica's share
        of the batch; None (Keras): every replica draws the same numbers."""
        return None

    def additional_loss_factor(self, model, loss) -> float:
        """`loss`, given to `add_loss` in `model`'s step on one replica of several, is divided by
        the replicas (Keras >= 3.8): by what (a number or a scalar tensor) to multiply it, so
        that its gradient summed over the replicas, and the mean of its values over them that
        fit logs, are one device's (Keras: 1, right for a mean over the batch)."""
        return 1

    def slot_device(self, optimizer, reference_variable) -> str | None:
        """The device a new optimizer slot of `reference_variable` goes to (None: Keras's)."""
        return None

    def cluster_of(self, strategy):
        """The cluster (`kdist.ClusterSpec`) `strategy` runs on, or None: one process. Keras
        knows none; the default reads a multi-worker or parameter-server strategy's resolver."""
        from kdist.keras_seam.strategy_kinds import cluster_from_resolver

        return cluster_from_resolver(strategy)

    def backup_class(self):
        """The class `keras.callbacks.BackupAndRestore(...)` builds (None: Keras's own)."""
        return None


_connected = Hooks()


def connect(hooks: Hooks) -> None:
    """Makes `hooks` serve every hook point."""
    global _connected
    if not isinstance(hooks, Hooks):
        raise TypeError(f"connect({hooks!r}): give an instance of kdist.keras_seam.hooks.Hooks")
    _connected = hooks


def connected() -> Hooks:
    return _connected
