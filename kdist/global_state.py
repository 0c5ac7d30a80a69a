"""kdist's process-wide state in one place, and its reset (as Keras's `global_state` with
`keras.utils.clear_session`).

Two typed records live for the life of a process, each field named with the module that owns it:

- `Process` (`process()`): the strategies `kdist.scope()` built, one per configuration, and the
  current one; the cluster read from the environment, the Slurm nodes' addresses and the spec keys
  already warned about; the counters that give every worker the same collective keys in the same
  order; the step clock's variable and whether a watched fit runs; the fits whose arguments the
  workers compared; whether `kdist verify` recorded this process's first fit;
- `PerStrategy` (`of_strategy`): what kdist keeps about one `tf.distribute` strategy: the plan
  it was built by (its cluster, options and decisions, `kdist.strategies.registry`), its
  parameter-server coordinator
  (`kdist.ps.coordinator`), its TCP ring (`kdist.exchange.comm`), its device groups' collective
  launchers (`kdist.keras_seam.tf_internals`), its all-gathers of host values
  (`kdist.strategies.gather`). Held beside the strategy and weakly: it goes with the strategy,
  never keyed by an `id()` a later object may reuse.

`clear()` forgets both, as a test does between scenarios of one process; a strategy built later
starts afresh. What stays: Keras's patches (the seam's registry installs and uninstalls them,
`kdist.keras_seam.patches`), the hooks connected and the exception hook chained at `import kdist`.
What a model or an optimizer carries (its training options, its gradient exchange) goes with the
object (`kdist.model_state`); what holds only inside a block or a thread (the active scope
options, a capture of gradients, the replica being clipped) lives with its code, in a context
variable or a thread-local that the block restores.

>>> from kdist import global_state
>>> global_state.process().verified = True
>>> global_state.clear()
>>> global_state.process().verified
False
"""

from __future__ import annotations

import dataclasses
import itertools
import weakref
from typing import Any


@dataclasses.dataclass
class Process:
    """kdist's state for the life of this process (until `clear()`)."""

    # kdist.scope: the strategies built, by (name, options, cluster), reused when entered again;
    # the key of the current one; whether MultiWorkerMirrored was built ahead of TensorFlow's
    # first op; whether a strategy is being built right now
    built: dict = dataclasses.field(default_factory=dict)
    current_key: tuple | None = None
    built_ahead: bool = False
    building: bool = False
    # kdist.strategies.registry: the strategy `kdist.scope()` entered last
    current: Any = None
    # kdist.cluster: the cluster read from the environment ({environment key: ClusterSpec}, the
    # newest only), the Slurm nodes' addresses, TF_CONFIG keys already warned about
    environment: dict = dataclasses.field(default_factory=dict)
    slurm_node_addresses: dict = dataclasses.field(default_factory=dict)
    unknown_keys_warned: set = dataclasses.field(default_factory=set)
    # the same collective keys on every worker, in the same order: one per fit
    # (kdist.fault_tolerance.preemption), one per ring (kdist.exchange.ring)
    preemption_fits: Any = dataclasses.field(default_factory=itertools.count)
    rings: Any = dataclasses.field(default_factory=itertools.count)
    # kdist.steps.clock: its variable of step stamps; whether a watched fit runs
    step_stamps: Any = None
    steps_watched: bool = False
    # kdist.keras_seam.fixes: the several-steps function is tracing its steps
    tracing_several_steps: bool = False
    # kdist.wiring.agreement: the fits compared so far; the models already said to be local;
    # whether every worker's Python `random` held the same state at the last fit's start (a
    # PyDataset's batches are then shuffled by it, as one device's are: kdist.keras_seam.inputs),
    # and whether every worker's program set the same TensorFlow seed (in-memory arrays are then
    # shuffled in the order Keras draws on one device)
    agreed_fits: int = 0
    local_models_said: set = dataclasses.field(default_factory=set)
    python_random_agrees: bool = False
    tensorflow_seed_agrees: bool = False
    python_random_said: bool = False
    # kdist.verify_plan: this process's first fit was recorded or replayed
    verified: bool = False


@dataclasses.dataclass
class PerStrategy:
    """What kdist keeps about one `tf.distribute` strategy."""

    plan: Any = None  # the StrategyPlan kdist built it by; None: built by hand
    coordinator: Any = None  # its ClusterCoordinator (kdist.ps.coordinator)
    ring: Any = None  # its TCP ring (kdist.exchange.comm)
    launchers: dict = dataclasses.field(default_factory=dict)  # device -> collective launcher
    host_gathers: dict = dataclasses.field(default_factory=dict)  # (purpose, length) -> its
    # all-gather of host values (kdist.strategies.gather)


_process = Process()
_per_strategy: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def process() -> Process:
    """This process's record."""
    return _process


def of_strategy(strategy) -> PerStrategy:
    """What kdist keeps about `strategy` (created empty on first use)."""
    if strategy not in _per_strategy:
        _per_strategy[strategy] = PerStrategy()
    return _per_strategy[strategy]


def clear() -> None:
    """Forgets this process's record and everything kept about every strategy."""
    global _process
    _process = Process()
    _per_strategy.clear()
