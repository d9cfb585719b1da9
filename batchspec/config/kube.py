"""Kubernetes manifests in jobs/ (a CronJob, a KubeRay RayJob or RayCluster), checked for structure
only: apiVersion, kind, metadata.name, and per kind the fields the API server would require (a
CronJob's schedule and pod template, a RayJob's entrypoint and cluster, containers with a name and
an image). Nothing here talks to a Kubernetes cluster."""

from __future__ import annotations

import re
from typing import Any

import yaml

from batchspec.errors import ConfigError

_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_CRON_FIELD = re.compile(r"^[\d*/,\-A-Za-z?]+$")


def check_manifests(path: str, docs: list[dict]) -> str:
    parts = []
    for i, doc in enumerate(docs):
        where = f"{path}" if len(docs) == 1 else f"{path} (document {i + 1})"
        parts.append(_check_manifest(where, doc))
    return f"{path}: Kubernetes {'; '.join(parts)} (structure checked; not applied to a cluster)"


def _check_manifest(where: str, doc: dict) -> str:
    api = _need(where, doc, "apiVersion", str, "an API version such as batch/v1")
    kind = _need(where, doc, "kind", str, "a resource kind such as CronJob")
    meta = _need(where, doc, "metadata", dict, "a mapping with name")
    name = meta.get("name") or meta.get("generateName")
    if not isinstance(name, str) or not _DNS_NAME.match(name.rstrip("-")):
        raise ConfigError(f"{where}: metadata.name: expected a lowercase DNS name, got {name!r}")
    check = KIND_CHECKS.get((api.split("/")[0] if "/" in api else "", kind))
    detail = check(where, doc) if check else ""
    return f"{kind} {name} ({api}){detail}"


def _need(where: str, node: dict, key: str, kind: type, expected: str, prefix: str = ""):
    value = node.get(key) if isinstance(node, dict) else None
    if not isinstance(value, kind) or (kind in (str, list, dict) and not value):
        raise ConfigError(f"{where}: {prefix}{key}: expected {expected}, got {value!r}")
    return value


def _pod_spec(where: str, template: Any, prefix: str, job_pod: bool) -> dict:
    spec = _need(where, template, "spec", dict, "a pod spec", prefix)
    containers = _need(where, spec, "containers", list, "a list of containers", f"{prefix}spec.")
    for i, c in enumerate(containers):
        at = f"{prefix}spec.containers[{i}]."
        if not isinstance(c, dict):
            raise ConfigError(f"{where}: {at[:-1]}: expected a container mapping, got {c!r}")
        _need(where, c, "name", str, "a container name", at)
        _need(where, c, "image", str, "a container image", at)
        for key in ("command", "args"):
            if key in c and (not isinstance(c[key], list) or not all(isinstance(x, str) for x in c[key])):
                raise ConfigError(f"{where}: {at}{key}: expected a list of strings, got {c[key]!r}")
        for j, env in enumerate(c.get("env") or []):
            if not isinstance(env, dict) or not isinstance(env.get("name"), str) or not ("value" in env or "valueFrom" in env):
                raise ConfigError(f"{where}: {at}env[{j}]: expected {{name, value}} or {{name, valueFrom}}, got {env!r}")
            if "value" in env and not isinstance(env["value"], str):
                raise ConfigError(f"{where}: {at}env[{j}].value: expected a string (quote numbers), got {env['value']!r}")
    if job_pod and spec.get("restartPolicy") not in ("OnFailure", "Never"):
        raise ConfigError(f"{where}: {prefix}spec.restartPolicy: expected OnFailure or Never for a Job's pods, got {spec.get('restartPolicy')!r}")
    return spec


def _job_spec(where: str, spec: dict, prefix: str) -> None:
    template = _need(where, spec, "template", dict, "a pod template", prefix)
    _pod_spec(where, template, f"{prefix}template.", job_pod=True)


def _check_job(where: str, doc: dict) -> str:
    _job_spec(where, _need(where, doc, "spec", dict, "a Job spec"), "spec.")
    return ""


def _check_cronjob(where: str, doc: dict) -> str:
    spec = _need(where, doc, "spec", dict, "a CronJob spec")
    schedule = _need(where, spec, "schedule", str, "a cron schedule such as '0 2 * * *'", "spec.")
    fields = schedule.split()
    if not (schedule.startswith("@") or (len(fields) == 5 and all(_CRON_FIELD.match(f) for f in fields))):
        raise ConfigError(f"{where}: spec.schedule: expected five cron fields such as '0 2 * * *', got {schedule!r}")
    policy = spec.get("concurrencyPolicy", "Allow")
    if policy not in ("Allow", "Forbid", "Replace"):
        raise ConfigError(f"{where}: spec.concurrencyPolicy: expected Allow, Forbid or Replace, got {policy!r}")
    job = _need(where, spec, "jobTemplate", dict, "a job template", "spec.")
    _job_spec(where, _need(where, job, "spec", dict, "a Job spec", "spec.jobTemplate."), "spec.jobTemplate.spec.")
    return f", schedule {schedule!r}"


def _check_rayjob(where: str, doc: dict) -> str:
    spec = _need(where, doc, "spec", dict, "a RayJob spec")
    entry = _need(where, spec, "entrypoint", str, "the command the Ray job runs", "spec.")
    if "rayClusterSpec" in spec:
        _check_raycluster_spec(where, spec["rayClusterSpec"], "spec.rayClusterSpec.")
    elif not isinstance(spec.get("clusterSelector"), dict):
        raise ConfigError(f"{where}: spec: expected rayClusterSpec (a new cluster) or clusterSelector (an existing one)")
    if "runtimeEnvYAML" in spec:
        try:
            env = yaml.safe_load(spec["runtimeEnvYAML"])
        except yaml.YAMLError:
            env = None
        if not isinstance(env, dict):
            raise ConfigError(f"{where}: spec.runtimeEnvYAML: expected a YAML mapping in a string, got {spec['runtimeEnvYAML']!r}")
    words = entry.split()
    runs = " ".join(words[words.index("batchspec"):][:2]) if "batchspec" in words else words[0]
    return f", entrypoint runs {runs}"


def _check_raycluster(where: str, doc: dict) -> str:
    _check_raycluster_spec(where, _need(where, doc, "spec", dict, "a RayCluster spec"), "spec.")
    return ""


def _check_raycluster_spec(where: str, spec: Any, prefix: str) -> None:
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: {prefix[:-1]}: expected a RayCluster spec, got {spec!r}")
    head = _need(where, spec, "headGroupSpec", dict, "the head group", prefix)
    _pod_spec(where, _need(where, head, "template", dict, "a pod template", f"{prefix}headGroupSpec."),
              f"{prefix}headGroupSpec.template.", job_pod=False)
    for i, group in enumerate(spec.get("workerGroupSpecs") or []):
        at = f"{prefix}workerGroupSpecs[{i}]."
        _need(where, group, "groupName", str, "a group name", at)
        _pod_spec(where, _need(where, group, "template", dict, "a pod template", at), f"{at}template.", job_pod=False)


KIND_CHECKS = {
    ("batch", "Job"): _check_job,
    ("batch", "CronJob"): _check_cronjob,
    ("ray.io", "RayJob"): _check_rayjob,
    ("ray.io", "RayCluster"): _check_raycluster,
}
