"""kdist's process-wide state in one place, and its reset (as Keras's `global_state` with
`keras.utils.clear_session`).

Two kinds of state live for the life of a process:

- named values (`get`/`set`/`setdefault`): the strategies `kdist.scope()` built, one per
  configuration, and the current one (`kdist.scope`); the cluster read from the environment and
  the Slurm nodes' addresses (`kdist.cluster`), the spec keys already warned about; the counters
  that give every worker the same collective keys in the same order
  (`kdist.fault_tolerance.preemption`, `kdist.exchange.ring`); the step clock's variable and
  whether a watched fit runs (`kdist.steps.clock`);
- what kdist keeps about one `tf.distribute` strategy (`of_strategy`): the cluster and options it
  was built for (`kdist.strategies.registry`), its parameter-server coordinator
  (`kdist.ps.coordinator`), its TCP ring (`kdist.exchange.comm`), its device groups' collective
  launchers (`kdist.keras_seam.tf_internals`). Held beside the strategy and weakly: it goes with
  the strategy, never keyed by an `id()` a later object may reuse.

`clear()` forgets both, as a test does between scenarios of one process; a strategy built later
starts afresh. What stays: Keras's patches (the seam's registry installs and uninstalls them,
`kdist.keras_seam.patches`), the hooks connected and the exception hook chained at `import kdist`.
What a model or an optimizer carries (its training options, its gradient exchange) goes with the
object (`kdist.model_state`); what holds only inside a block or a thread (the active scope
options, a capture of gradients, the replica being clipped) lives with its code, in a context
variable or a thread-local that the block restores.

>>> from kdist import global_state
>>> global_state.set("example", 1)
>>> global_state.get("example")
1
>>> global_state.clear()
>>> global_state.get("example") is None
True
"""

from __future__ import annotations

import weakref

_values: dict = {}
_per_strategy: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def get(name: str, default=None):
    return _values.get(name, default)


def set(name: str, value) -> None:  # noqa: A001 (Keras's own name for it: global_state.set_...)
    _values[name] = value


def setdefault(name: str, make):
    """The value named `name`, created by `make()` when there is none."""
    if name not in _values:
        _values[name] = make()
    return _values[name]


def of_strategy(strategy) -> dict:
    """What kdist keeps about `strategy` (a dict, created empty on first use)."""
    return _per_strategy.setdefault(strategy, {})


def clear() -> None:
    """Forgets every named value and everything kept about every strategy."""
    _values.clear()
    _per_strategy.clear()
