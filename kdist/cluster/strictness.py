"""Where kdist's TF_CONFIG check is stricter than TensorFlow's own resolver, and why.

kdist accepts every TF_CONFIG that TensorFlow's `TFConfigClusterResolver` and its strategies
accept, except in the cases below: each is a configuration TensorFlow takes without a word and then
trains wrongly, alone, or fails minutes later at the first connection. A `ClusterSpecError` raised
for one of them names its rule (`error.rule`); `tests/test_fuzz.py` checks, over thousands of
generated TF_CONFIGs, that every refusal of something TensorFlow accepts is one of these.

>>> print(table().splitlines()[2])
| TF_CONFIG is not a JSON object (a list, a string, a number) | reads it as no cluster: the process trains alone | refused | a platform that writes something else has lost the cluster |
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Stricter:
    """One case kdist refuses and TensorFlow accepts."""

    rule: str
    case: str
    tensorflow: str
    kdist: str
    reason: str


STRICTER = {rule.rule: rule for rule in [
    Stricter("not_an_object", "TF_CONFIG is not a JSON object (a list, a string, a number)",
             "reads it as no cluster: the process trains alone", "refused",
             "a platform that writes something else has lost the cluster"),
    Stricter("task_without_cluster", 'a "task" with no (or an empty) "cluster"',
             "trains alone, as if there were no cluster", "refused",
             "every task of the job would train alone on its own data"),
    Stricter("cluster_without_task", 'a "cluster" with no "task", or an empty one',
             "runs with no task type: a local strategy", "refused",
             "the process cannot tell which task it is; it trains alone"),
    Stricter("task_not_object", 'a "task" that is not an object',
             "reads a list as no task; a string fails deep inside TensorFlow", "refused",
             "the process cannot tell which task it is"),
    Stricter("task_key", 'a key in "task" other than type and index (and AI Platform\'s trial '
                         "and cloud)", "ignores it", "refused",
             "no platform writes another key: it is a template mistake (a rank, a misspelt "
             "field) whose intent TensorFlow drops"),
    Stricter("index_not_integer", "an index that is not a whole number (1.5, true, \"1\")",
             "converts it with int(): 1.5 and true become 1", "refused",
             "1.5 is a mistake that int() hides; a quoted number is one a template got wrong"),
    Stricter("negative_index", "a negative index", "accepts it: -1 addresses the last task",
             "refused", "two processes then claim the same task"),
    Stricter("evaluator_index", "an evaluator index other than 0 with no evaluator job",
             "accepts any index", "refused", "TensorFlow has at most one evaluator"),
    Stricter("job_as_mapping", 'a job given as {"0": "host:port", ...} instead of a list',
             "accepts it, gaps in the numbering included", "refused",
             "kdist's launcher, manifests and restarts address tasks by position"),
    Stricter("address", "an address that is not host:port with a port from 1 to 65535",
             "accepts any string", "refused", "TensorFlow fails at the first connection, minutes "
             "later, or waits for a peer that cannot exist"),
    Stricter("duplicate_address", "two tasks with the same address", "accepts it", "refused",
             "the second server cannot bind; the job hangs or fails late"),
    Stricter("ps_without_workers", "a ps job without a chief or without workers",
             "accepts the cluster", "refused",
             "parameter-server training needs a chief to coordinate and workers to compute"),
    Stricter("rpc_layer", 'an "rpc_layer" other than grpc', "passes it to its server", "refused",
             "kdist's servers, launcher and manifests speak gRPC only"),
    Stricter("environment", 'an "environment" that is not a string', "ignores it", "refused",
             "platforms write a string (\"cloud\"); anything else is a template error"),
]}


def table() -> str:
    """The cases as a markdown table (docs/cluster.md, "Stricter than TensorFlow")."""
    rows = ["| case | TensorFlow | kdist | why |", "|---|---|---|---|"]
    rows += [f"| {r.case} | {r.tensorflow} | {r.kdist} | {r.reason} |" for r in STRICTER.values()]
    return "\n".join(rows)
