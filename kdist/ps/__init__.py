"""Parameter-server training for Keras 3: `fit` / `evaluate` / `predict` through TF's
ClusterCoordinator on the chief (`training`), evaluation sharded over the workers (`evaluation`),
the synchronisation modes (`sync`, figures from `sync_stats`), and the ps and worker tasks that
serve it and exit when the chief is done (`serve`).

>>> from kdist.ps import ParameterServerFailure
>>> issubclass(ParameterServerFailure, RuntimeError)
True
"""

from kdist.ps.serve import serve
from kdist.ps.sync import stats as sync_stats
from kdist.ps.coordinator import ParameterServerFailure

__all__ = ["ParameterServerFailure", "serve", "sync_stats"]
