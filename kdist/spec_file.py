"""Cluster-spec files (`cluster_specs/*.json|yaml`): the roles of a job, without per-process details.

Two forms are accepted:

- roles only, ports picked at launch time on the host (local presets)::

      {"name": "local-2-workers", "roles": {"worker": 2}}

- explicit addresses, exactly TF_CONFIG's ``cluster`` object::

      {"name": "fixed", "cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}}

Keys: ``name`` (optional text), ``roles`` (job -> task count) or ``cluster`` (job -> addresses),
``host`` (roles form only; default 127.0.0.1). Unknown keys are errors.

>>> from kdist.spec_file import load_spec
>>> load_spec("cluster_specs/local-2-workers.json").roles      # doctest: +SKIP
{'worker': 2}
"""

from __future__ import annotations

import json
import os
from typing import Any

from kdist.cluster import ClusterSpec, ClusterSpecError

_KEYS = ("name", "roles", "cluster", "host")


def read_spec(path: str) -> dict[str, Any]:
    """The decoded spec file (JSON, or YAML for .yaml/.yml), checked for known keys."""
    if not os.path.isfile(path):
        raise ClusterSpecError(path, "no such file", "give the path of a cluster-spec file, e.g. "
                               "cluster_specs/local-2-workers.json")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        if path.endswith((".yaml", ".yml")):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as err:  # json.JSONDecodeError, yaml.YAMLError (not a ValueError)
        raise ClusterSpecError(path, f"cannot be parsed ({err})", "fix the syntax") from None
    if not isinstance(data, dict):
        raise ClusterSpecError(path, "must hold a mapping", 'write {"roles": {"worker": 2}}')
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise ClusterSpecError(f"{path}.{unknown[0]}", "unknown key", f"use only {', '.join(_KEYS)}")
    if ("roles" in data) == ("cluster" in data):
        raise ClusterSpecError(path, "needs exactly one of 'roles' and 'cluster'",
                               'write "roles": {"worker": 2} (ports picked at launch) or "cluster": '
                               '{"worker": ["host:port", ...]}')
    return data


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
    roles = data["roles"]
    if not isinstance(roles, dict) or not roles:
        raise ClusterSpecError(f"{path}.roles", "must be a non-empty mapping of job -> task count",
                               'write "roles": {"worker": 2}')
    return ClusterSpec.local_layout(roles, host=host or data.get("host", "127.0.0.1"), source=path)
