"""The spec keys that place and equip a job's pods on a real cluster, checked like the rest.

::

    volumes:                       # a PersistentVolumeClaim (ReadWriteMany for a backup_dir)
      - {name: backups, claim: shared-backups, mount: /backups}
      - {name: data, claim: imagenet, mount: /data, read_only: true}
    node_selector: {cloud.google.com/gke-accelerator: nvidia-l4}
    tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
    env: {DATA_DIR: /data}
    image_pull_secrets: [registry-credentials]
    service_account: trainer

`kdist.k8s.pod_settings` writes them into every pod template kdist renders.

>>> read_pod_keys({"env": {"DATA_DIR": "/data"}}, "spec.yaml")["env"]
{'DATA_DIR': '/data'}
"""

from __future__ import annotations

import re
from typing import Any

from kdist.cluster.spec import ClusterSpecError

KEYS = ("volumes", "node_selector", "tolerations", "env", "image_pull_secrets", "service_account")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a DNS label
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_VOLUME_KEYS = ("name", "claim", "mount", "read_only")
_TOLERATION_KEYS = ("key", "operator", "value", "effect", "tolerationSeconds")
_RESERVED_ENV = ("TF_CONFIG",)  # kdist exec sets it from the pod's place in the job


def read_pod_keys(data: dict[str, Any], path: str) -> dict[str, Any]:
    """The pod keys of a spec file's `data`, checked; absent keys are left out."""
    readers = {"volumes": _volumes, "node_selector": _node_selector, "tolerations": _tolerations,
               "env": _env, "image_pull_secrets": _pull_secrets,
               "service_account": _service_account}
    return {key: readers[key](data[key], f"{path}.{key}") for key in KEYS if key in data}


def _volumes(value, field: str) -> tuple[dict, ...]:
    if not isinstance(value, list):
        raise ClusterSpecError(field, "must be a list", "write volumes: [{name: backups, claim: "
                               "shared-backups, mount: /backups}]")
    names, mounts = set(), set()
    for i, volume in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(volume, dict):
            raise ClusterSpecError(where, "must be a mapping", "write {name: backups, claim: "
                                   "shared-backups, mount: /backups}")
        unknown = sorted(set(volume) - set(_VOLUME_KEYS), key=str)
        if unknown:
            raise ClusterSpecError(f"{where}.{unknown[0]}", "unknown key",
                                   f"use {', '.join(_VOLUME_KEYS)}")
        for key in ("name", "claim"):
            if not isinstance(volume.get(key), str) or not _NAME.fullmatch(volume[key]):
                raise ClusterSpecError(f"{where}.{key}", f"{volume.get(key)!r} is not a Kubernetes "
                                       "name", "use lower-case letters, digits and '-' (the "
                                       "PersistentVolumeClaim's name for claim)")
        mount = volume.get("mount")
        if not isinstance(mount, str) or not mount.startswith("/") or ":" in mount:
            raise ClusterSpecError(f"{where}.mount", f"{mount!r} is not an absolute path",
                                   "write the folder the pods see it at, e.g. /backups")
        if not isinstance(volume.get("read_only", False), bool):
            raise ClusterSpecError(f"{where}.read_only", f"{volume['read_only']!r} is not true or "
                                   "false", "write read_only: true, or leave it out")
        if volume["name"] in names or mount in mounts:
            raise ClusterSpecError(where, f"a second volume named {volume['name']!r} or mounted "
                                   f"at {mount!r}", "give each volume its own name and mount")
        names.add(volume["name"])
        mounts.add(mount)
    return tuple(dict(v) for v in value)


def _string_map(value, field: str, key_pattern, what: str, example: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ClusterSpecError(field, "must be a mapping", f"write {example}")
    for key, item in value.items():
        if not isinstance(key, str) or not key_pattern.fullmatch(key):
            raise ClusterSpecError(f"{field}.{key}", f"is not {what}", f"write {example}")
        if not isinstance(item, str):
            raise ClusterSpecError(f"{field}.{key}", f"{item!r} is not a string",
                                   f"quote it: {key}: \"{item}\"")
    return dict(value)


def _node_selector(value, field: str) -> dict[str, str]:
    return _string_map(value, field, _LABEL_KEY, "a node label key",
                       "node_selector: {cloud.google.com/gke-accelerator: nvidia-l4}")


def _env(value, field: str) -> dict[str, str]:
    env = _string_map(value, field, _ENV_NAME, "an environment variable name",
                      "env: {DATA_DIR: /data}")
    reserved = [name for name in env if name in _RESERVED_ENV or name.startswith("KDIST_")]
    if reserved:
        raise ClusterSpecError(f"{field}.{reserved[0]}", "is set by kdist in every pod",
                               "remove it (kdist exec computes TF_CONFIG from the pod's place)")
    return env


def _tolerations(value, field: str) -> tuple[dict, ...]:
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise ClusterSpecError(field, "must be a list of mappings",
                               "write tolerations: [{key: nvidia.com/gpu, operator: Exists, "
                               "effect: NoSchedule}]")
    for i, toleration in enumerate(value):
        unknown = sorted(set(toleration) - set(_TOLERATION_KEYS), key=str)
        if unknown:
            raise ClusterSpecError(f"{field}[{i}].{unknown[0]}", "unknown key",
                                   f"a toleration takes {', '.join(_TOLERATION_KEYS)}")
        if toleration.get("operator", "Equal") not in ("Equal", "Exists"):
            raise ClusterSpecError(f"{field}[{i}].operator", f"{toleration['operator']!r}",
                                   "use Equal or Exists")
        if toleration.get("effect") not in (None, "NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise ClusterSpecError(f"{field}[{i}].effect", f"{toleration['effect']!r}",
                                   "use NoSchedule, PreferNoSchedule or NoExecute")
    return tuple(dict(t) for t in value)


def _pull_secrets(value, field: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(n, str) and _SUBDOMAIN.fullmatch(n)
                                              for n in value):
        raise ClusterSpecError(field, "must be a list of Secret names",
                               "write image_pull_secrets: [registry-credentials]")
    return tuple(value)


def _service_account(value, field: str) -> str:
    if not isinstance(value, str) or not _SUBDOMAIN.fullmatch(value):
        raise ClusterSpecError(field, f"{value!r} is not a service account name",
                               "write service_account: trainer")
    return value
