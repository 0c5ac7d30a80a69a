"""`StrategyPlan`: what kdist decided for one strategy it built, frozen at the build.

The cluster and the options a strategy was built for, and the decisions taken from them once: which
strategy (`name`) and who sums the gradients (`gradients_over_tcp`: kdist's TCP ring, or
TensorFlow's collectives). Kept beside the strategy (`kdist.strategies.registry.plan_of`); the
exchange, `Comm`, the fit dispatch and the callbacks read it there instead of deciding again.

>>> from kdist.cluster.spec import ClusterSpec
>>> from kdist.strategies.options import StrategyOptions
>>> spec = ClusterSpec({"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}, "worker", 1)
>>> plan = StrategyPlan("multi_worker", spec, StrategyOptions(), gradients_over_tcp=True)
>>> rank, addresses, names = plan.ring_members()
>>> rank, names
(1, ['worker:0 (127.0.0.1:2222)', 'worker:1 (127.0.0.1:2223)'])
"""

from __future__ import annotations

import dataclasses

from kdist.cluster.spec import ClusterSpec
from kdist.strategies.options import StrategyOptions


@dataclasses.dataclass(frozen=True)
class StrategyPlan:
    """One strategy kdist built: `name` (``"mirrored"``, ...), the cluster `spec`, its
    `options`, and whether kdist's TCP ring sums its gradients (`gradients_over_tcp`, decided by
    `kdist.strategies.multi_worker.sums_over_tcp` at the build)."""

    name: str
    spec: ClusterSpec
    options: StrategyOptions
    gradients_over_tcp: bool = False

    def ring_members(self) -> tuple[int, list[str], list[str]]:
        """This task's rank in the TCP ring, every member's address and name, in ring order (the
        chief, then the workers)."""
        tasks = [(t, i) for t, i in self.spec.tasks() if t in ("chief", "worker")]
        addresses = [self.spec.address(t, i) for t, i in tasks]
        names = [f"{t}:{i} ({address})" for (t, i), address in zip(tasks, addresses)]
        return tasks.index((self.spec.task_type, self.spec.task_index)), addresses, names
