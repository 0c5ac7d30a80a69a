"""What Kubernetes restarts, and what it does not, in every rendered format.

A pod evicted or preempted (condition ``DisruptionTarget``), or one that saved its backup on
SIGTERM and exited with 75 (`exit_codes.PREEMPTED`), is replaced in place without counting as a
failure: it resumes from its backup. An exit no restart can fix (2: a usage error naming the field
and the fix; 126/127: the program cannot run) fails the Job at once, and under JobSet the whole
JobSet. Every other failure counts against the Job's ``backoffLimit`` (Indexed Jobs) or, under
JobSet, recreates the whole set up to ``maxRestarts`` times.

Kubernetes accepts a ``podFailurePolicy`` only with ``restartPolicy: Never``.

>>> [rule["action"] for rule in pod_failure_policy("tensorflow")["rules"]]
['Ignore', 'Ignore', 'FailJob']
"""

from kdist import exit_codes

NOT_RESTARTABLE = [exit_codes.USAGE, exit_codes.NOT_EXECUTABLE, exit_codes.NOT_FOUND]
# A Job failed by the FailJob rule below (reason PodFailurePolicy) ends the JobSet; JobSet's rule
# names must match ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$.
JOBSET_FAILURE_RULES = [{"name": "NotRestartable", "action": "FailJobSet",
                         "onJobFailureReasons": ["PodFailurePolicy"]}]


def pod_failure_policy(container: str) -> dict:
    """The podFailurePolicy of a Job whose training container is named `container`."""
    return {"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "Ignore", "onExitCodes": {"containerName": container, "operator": "In",
                                             "values": [exit_codes.PREEMPTED]}},
        {"action": "FailJob", "onExitCodes": {"containerName": container, "operator": "In",
                                              "values": NOT_RESTARTABLE}}]}
