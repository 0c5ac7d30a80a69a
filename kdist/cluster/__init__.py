"""The cluster model: one validated view of a job's tasks, with no TensorFlow import.

- `spec`: `ClusterSpec` (jobs, addresses, this task), `ClusterSpecError` (field, problem, fix);
- `environment`: `cluster()`, this process's cluster from TF_CONFIG or Slurm;
- `slurm`: the cluster of an `srun` step;
- `spec_file`: cluster-spec files (`cluster_specs/*.json|yaml`) and their Kubernetes fields;
- `addresses`: a task address's host, and whether it is this machine's loopback.

>>> from kdist.cluster import ClusterSpec
>>> ClusterSpec.local_layout({"worker": 2}, ports=[2222, 2223]).jobs
{'worker': ['127.0.0.1:2222', '127.0.0.1:2223']}
"""

from kdist.cluster.spec import JOBS, ClusterSpec, ClusterSpecError, validate_roles
from kdist.cluster.environment import cluster  # noqa: E402  (after spec: it builds specs)

__all__ = ["JOBS", "ClusterSpec", "ClusterSpecError", "cluster", "validate_roles"]
