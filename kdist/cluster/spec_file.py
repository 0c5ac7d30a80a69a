"""Cluster-spec files (`cluster_specs/*.json|yaml`): the roles of a job, without per-process details.

Two forms are accepted:

- roles only, ports picked at launch time on the host (local presets)::

      {"name": "local-2-workers", "roles": {"worker": 2}}

- explicit addresses, exactly TF_CONFIG's ``cluster`` object::

      {"name": "fixed", "cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}}

Keys: ``name`` (optional text; required for Kubernetes), ``roles`` (job -> task count, or
job -> ``{count, resources}``) or ``cluster`` (job -> addresses), ``host`` (roles form only; default
127.0.0.1). Kubernetes only (`kdist k8s render`, ignored by local launches): ``port`` (2222),
``image``, ``command`` (list), ``resources`` (requests/limits for every role), ``restart_policy``
(Never or OnFailure; Never), ``backoff_limit`` (0), ``run_as_user`` (the pods' non-root user,
1000), ``run_as_root`` (false: pods the Pod Security Standards' restricted profile admits;
`kdist.k8s.security`), and the pod keys of `kdist.cluster.pod_keys`: ``volumes``,
``node_selector``, ``tolerations``, ``env``, ``image_pull_secrets``, ``service_account``. Unknown
keys are errors.

>>> from kdist.cluster.spec_file import load_spec
>>> load_spec("cluster_specs/local-2-workers.json").roles      # doctest: +SKIP
{'worker': 2}
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

from kdist import validators
from kdist.cluster import pod_keys
from kdist.cluster.spec import ClusterSpec, ClusterSpecError, _count, validate_roles

KUBERNETES_ONLY = ("port", "image", "command", "resources", "restart_policy", "backoff_limit",
                   "run_as_user", "run_as_root", *pod_keys.KEYS)
_KEYS = ("name", "roles", "cluster", "host", *KUBERNETES_ONLY)


def read_spec(path: str) -> dict[str, Any]:
    """The decoded spec file (JSON, or YAML for .yaml/.yml), checked for known keys."""
    if not os.path.isfile(path):
        raise ClusterSpecError(path, "no such file", "give the path of a cluster-spec file, e.g. "
                               "cluster_specs/local-2-workers.json")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as err:
        raise ClusterSpecError(path, f"cannot be read ({type(err).__name__}: {err})",
                               "give a readable UTF-8 JSON or YAML cluster-spec file") from None
    try:
        if path.endswith((".yaml", ".yml")):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as err:  # json.JSONDecodeError, yaml.YAMLError (not a ValueError)
        raise ClusterSpecError(path, f"cannot be parsed: {_where(err)}", "fix the syntax there "
                               "(JSON for .json, YAML for .yaml/.yml)") from None
    if not isinstance(data, dict):
        raise ClusterSpecError(path, "must hold a mapping", 'write {"roles": {"worker": 2}}')
    unknown = sorted(set(data) - set(_KEYS), key=str)
    if unknown:
        raise ClusterSpecError(f"{path}.{unknown[0]}", "unknown key", f"use only {', '.join(_KEYS)}")
    if ("roles" in data) == ("cluster" in data):
        raise ClusterSpecError(path, "needs exactly one of 'roles' and 'cluster'",
                               'write "roles": {"worker": 2} (ports picked at launch) or "cluster": '
                               '{"worker": ["host:port", ...]}')
    return data


def _where(error: Exception) -> str:
    """A parser's error in one line: what, at which line and column."""
    mark = getattr(error, "problem_mark", None)  # yaml.MarkedYAMLError
    if mark is not None:
        what = getattr(error, "problem", None) or "invalid YAML"
        return f"{what} at line {mark.line + 1}, column {mark.column + 1}"
    if hasattr(error, "lineno"):  # json.JSONDecodeError
        return f"{error.msg} at line {error.lineno}, column {error.colno}"
    return " ".join(str(error).split())[:200]


def load_spec(path: str, host: str | None = None) -> ClusterSpec:
    """The cluster a spec file describes (no task chosen). Roles-only specs get free ports on `host`
    (default: the file's ``host``, else 127.0.0.1)."""
    data = read_spec(path)
    if "cluster" in data:
        if "host" in data:
            raise ClusterSpecError(f"{path}.host", "only applies to the 'roles' form",
                                   "remove it; the addresses in 'cluster' name their hosts")
        if not isinstance(data["cluster"], dict):
            raise ClusterSpecError(f"{path}.cluster", "must be a mapping of job -> addresses",
                                   'write "cluster": {"worker": ["host:port", ...]}')
        return ClusterSpec(data["cluster"], source=path)
    counts = _role_counts(data, path)
    return ClusterSpec.local_layout(counts, host=host or data.get("host", "127.0.0.1"), source=path)


def _role_counts(data: dict, path: str) -> dict[str, int]:
    roles = data["roles"]
    if not isinstance(roles, dict) or not roles:
        raise ClusterSpecError(f"{path}.roles", "must be a non-empty mapping of job -> task count",
                               'write "roles": {"worker": 2}')
    counts = {}
    for role, value in roles.items():
        if isinstance(value, dict):
            unknown = sorted(set(value) - {"count", "resources"}, key=str)
            if unknown:
                raise ClusterSpecError(f"{path}.roles.{role}.{unknown[0]}", "unknown key",
                                       "use count and resources")
            value = value.get("count")
        counts[role] = _count(value, f"{path}.roles.{role}")
    return counts


@dataclasses.dataclass(frozen=True)
class KubernetesSpec:
    """A roles-form spec file with its Kubernetes fields checked and defaulted (`read_k8s_spec`)."""

    path: str  # the file, used to name fields in errors
    name: str  # a Kubernetes name: the job, its Service and its labels
    roles: dict  # job -> task count (> 0), in kdist's order
    port: int = 2222
    image: str | None = None
    command: tuple[str, ...] | None = None
    resources: dict = dataclasses.field(default_factory=dict)  # role -> requests/limits
    restart_policy: str = "Never"
    backoff_limit: int = 0
    run_as_user: int = 1000
    run_as_root: bool = False
    pod_keys: dict = dataclasses.field(default_factory=dict)  # kdist.cluster.pod_keys, checked


def read_k8s_spec(path: str, local_host_allowed: bool = False) -> KubernetesSpec:
    """A roles-form spec with its Kubernetes fields checked and defaulted; its ``host`` (a local
    launch's) is an error unless `local_host_allowed`: pods get their own DNS names."""
    data = read_spec(path)
    if "roles" not in data:
        raise ClusterSpecError(f"{path}.cluster", "fixed addresses cannot be rendered for "
                               "Kubernetes", 'describe the job with "roles": {"worker": 2} (for '
                               "fixed addresses: kdist tf-config or kdist launch on each machine)")
    if "host" in data and not local_host_allowed:
        raise ClusterSpecError(f"{path}.host", "is a local launch's host, but Kubernetes gives "
                               "each pod its own DNS name", "remove host from the spec")
    name = data.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[a-z]([-a-z0-9]{0,40}[a-z0-9])?", name):
        raise ClusterSpecError(f"{path}.name", f"{name!r} is not a Kubernetes name",
                               "use lower-case letters, digits and '-', starting with a letter "
                               "(at most 42 characters)")
    counts = validate_roles(_role_counts(data, path), path)
    port = data.get("port", 2222)
    if not validators.port(port) or port == 65535:
        raise ClusterSpecError(f"{path}.port", f"bad port {port!r}", "use 1 to 65534, e.g. 2222 "
                               "(kdist's TCP ring takes the next one)")
    restart = data.get("restart_policy", "Never")
    if restart not in ("Never", "OnFailure"):
        raise ClusterSpecError(f"{path}.restart_policy", f"{restart!r} is not a Job restart policy",
                               "use Never or OnFailure")
    backoff = data.get("backoff_limit", 0)
    if not validators.is_count(backoff):
        raise ClusterSpecError(f"{path}.backoff_limit", f"{backoff!r}", "use a count >= 0")
    command = data.get("command")
    if command is not None and (not isinstance(command, list) or not all(
            isinstance(c, str) for c in command)):
        raise ClusterSpecError(f"{path}.command", "must be a list of strings",
                               "write command: [python, train.py]")
    resources = {role: (value.get("resources") if isinstance(value, dict) else None)
                 or data.get("resources") for role, value in data["roles"].items()}
    user = data.get("run_as_user", 1000)
    if not validators.is_count(user) or user == 0 or user > 2**31 - 1:
        raise ClusterSpecError(f"{path}.run_as_user", f"{user!r} is not a non-root user id",
                               "use a user id from 1 to 2147483647 (default 1000), or "
                               "run_as_root: true for an image that must run as root")
    root = data.get("run_as_root", False)
    if not isinstance(root, bool):
        raise ClusterSpecError(f"{path}.run_as_root", f"{root!r} is not true or false",
                               "write run_as_root: true (the image runs as root) or leave it out")
    return KubernetesSpec(path=path, name=name, roles={r: n for r, n in counts.items() if n},
                          port=port, image=data.get("image"),
                          command=None if command is None else tuple(command),
                          resources={r: v for r, v in resources.items() if v},
                          restart_policy=restart, backoff_limit=backoff, run_as_user=user,
                          run_as_root=root, pod_keys=pod_keys.read_pod_keys(data, path))
