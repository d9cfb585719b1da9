"""`batchspec validate`: recognise a YAML file by its content and check it with its own validator.

Kinds, in the order they are recognised:

    batchspec job        `kind: batchspec-job`                    -> batchspec.submit.load_job
    Kubernetes manifest  `apiVersion` and `kind` (any documents)  -> a structural check here
    candidates file      `candidates:` holding a list              -> batchspec.spec_config.validate_file
    pipeline file        keys of a pipeline (engine, spec, ...)    -> batchspec.pipeline_config
    TensorRT-LLM options anything else that is a mapping           -> batchspec.spec_config.validate_file

The Kubernetes check is structural only (apiVersion, kind, metadata.name, and per kind the fields
the API server would require: a CronJob's schedule and pod template, a RayJob's entrypoint and
cluster, containers with a name and an image). Nothing here talks to a Kubernetes cluster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

from batchspec.errors import BatchspecError, ConfigError

# Keys only a pipeline file has (a TensorRT-LLM option file may also carry `model` or `dtype`).
PIPELINE_ONLY = ("engine", "spec", "candidates", "shard_by", "shard_size", "workers", "batch_size", "worker",
                 "calibration", "storage_options", "ray_address", "ray_num_cpus", "draft_model", "resume", "run_date")
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_CRON_FIELD = re.compile(r"^[\d*/,\-A-Za-z?]+$")


@dataclass(frozen=True)
class Checked:
    path: str
    ok: bool
    line: str  # "OK <summary>" or the one-line error


def validate_files(paths: list[str]) -> list[Checked]:
    out = []
    for path in paths:
        try:
            out.append(Checked(path, True, "OK " + _with_path(path, validate_one(path))))
        except BatchspecError as exc:
            out.append(Checked(path, False, _with_path(path, " ".join(str(exc).split()))))
    return out


def validate_one(path: str) -> str:
    """Validate one file; return its one-line summary or raise ConfigError."""
    docs = _read_docs(path)
    if len(docs) == 1 and _is_job(docs[0]):
        from batchspec.submit import load_job

        return load_job(path).summary()
    if docs and all(isinstance(d, dict) and "apiVersion" in d for d in docs):
        return check_manifests(path, docs)
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise ConfigError(f"{path}: expected one YAML mapping (a pipeline, trt_configs, candidates or batchspec job file) "
                          f"or Kubernetes manifests with apiVersion and kind")
    data = docs[0]
    from batchspec.spec_config import validate_file

    if isinstance(data.get("candidates"), list) or "speculative_config" in data:
        return validate_file(path)
    if any(key in data for key in PIPELINE_ONLY):
        from batchspec.pipeline_config import validate_pipeline_file

        return validate_pipeline_file(path)
    return validate_file(path)


def _is_job(doc: Any) -> bool:
    from batchspec.submit import is_job_doc

    return is_job_doc(doc)


def _read_docs(path: str) -> list[Any]:
    """The file's YAML documents; missing files and bad YAML are reported by spec_config.read_yaml."""
    from batchspec.spec_config import read_yaml

    try:
        docs = [read_yaml(path)]
    except ConfigError as exc:
        if "single document" not in str(exc):
            raise
        import fsspec  # several documents: Kubernetes manifests

        try:
            with fsspec.open(path, "r", encoding="utf-8") as f:
                docs = list(yaml.safe_load_all(f))
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: invalid YAML: {' '.join(str(err).split())}") from None
    docs = [d for d in docs if d is not None]
    if not docs:
        raise ConfigError(f"{path}: empty file; expected a pipeline, trt_configs, candidates or batchspec job file, or Kubernetes manifests")
    return docs


def _with_path(path: str, line: str) -> str:
    return line if line.startswith(path) else f"{path}: {line}"


# ---------------------------------------------------------------------------------------------
# Kubernetes manifests: structure only


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
