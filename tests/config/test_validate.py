"""`batchspec validate`: every shipped file is recognised by content and passes; each kind of bad
file fails with one line naming the file, the key and what was expected. The Kubernetes checks
are structural: nothing here is applied to a cluster."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest
import yaml

from batchspec.config.validate import validate_files, validate_one
from batchspec.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(
    glob.glob(str(REPO / "jobs" / "*.yaml")) + glob.glob(str(REPO / "pipelines" / "*.yaml"))
    + glob.glob(str(REPO / "pipelines" / "candidates" / "*.yaml")) + glob.glob(str(REPO / "trt_configs" / "*.yaml"))
    + glob.glob(str(REPO / "trt_configs" / "candidates" / "*.yaml"))
)
KINDS = {
    "jobs/local.yaml": "batchspec job local-default",
    "jobs/gpu_trtllm.yaml": "batchspec job nightly-trtllm",
    "jobs/kuberay-rayjob.yaml": "Kubernetes RayJob batchspec-trtllm (ray.io/v1), entrypoint runs batchspec run",
    "jobs/nightly-cronjob.yaml": "Kubernetes CronJob batchspec-nightly (batch/v1), schedule '0 2 * * *'",
    "pipelines/local.yaml": "pipeline, engine torch",
    "trt_configs/ngram.yaml": "TensorRT-LLM option file, NGram",
    "trt_configs/none.yaml": "TensorRT-LLM option file, no speculation",
    "trt_configs/candidates/torch_default.yaml": "candidates file",
}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(Path(p).relative_to(REPO)))
def test_every_shipped_file_is_valid(path):
    (checked,) = validate_files([path])
    assert checked.ok, checked.line
    assert checked.line.startswith(f"OK {path}: ")


@pytest.mark.parametrize("rel,summary", KINDS.items())
def test_files_are_recognised_by_content(rel, summary):
    assert summary in validate_one(str(REPO / rel))


CRON = yaml.safe_load((REPO / "jobs" / "nightly-cronjob.yaml").read_text())
RAYJOB = yaml.safe_load((REPO / "jobs" / "kuberay-rayjob.yaml").read_text())
POD = ("spec", "jobTemplate", "spec", "template", "spec")


def _set(doc: dict, path: tuple, value) -> dict:
    import copy

    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value is None:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


@pytest.mark.parametrize("doc,message", [
    (_set(CRON, ("spec", "schedule"), None), "spec.schedule: expected a cron schedule"),
    (_set(CRON, ("spec", "schedule"), "every night"), "spec.schedule: expected five cron fields"),
    (_set(CRON, ("spec", "concurrencyPolicy"), "Never"), "spec.concurrencyPolicy: expected Allow, Forbid or Replace"),
    (_set(CRON, (*POD, "restartPolicy"), "Always"), "spec.jobTemplate.spec.template.spec.restartPolicy: expected OnFailure or Never"),
    (_set(CRON, (*POD, "containers"), []), "spec.jobTemplate.spec.template.spec.containers: expected a list of containers"),
    (_set(CRON, (*POD, "containers"), [{"name": "x"}]), "spec.jobTemplate.spec.template.spec.containers[0].image: expected a container image"),
    (_set(CRON, (*POD, "containers"), [{"name": "x", "image": "i", "env": [{"name": "N", "value": 1}]}]), "containers[0].env[0].value: expected a string"),
    (_set(CRON, ("metadata", "name"), "Nightly_Job"), "metadata.name: expected a lowercase DNS name"),
    (_set(CRON, ("kind",), None), "kind: expected a resource kind such as CronJob, got None"),
    (_set(RAYJOB, ("spec", "entrypoint"), None), "spec.entrypoint: expected the command the Ray job runs"),
    (_set(RAYJOB, ("spec", "rayClusterSpec", "headGroupSpec"), None), "spec.rayClusterSpec.headGroupSpec: expected the head group"),
    (_set(RAYJOB, ("spec", "rayClusterSpec"), None), "expected rayClusterSpec (a new cluster) or clusterSelector"),
    (_set(RAYJOB, ("spec", "runtimeEnvYAML"), "- a list"), "spec.runtimeEnvYAML: expected a YAML mapping"),
])
def test_bad_kubernetes_manifests_name_the_field(tmp_path, doc, message):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as err:
        validate_one(str(path))
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)


def test_multi_document_manifests_are_checked_document_by_document(tmp_path):
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": {"a": "b"}}
    path = tmp_path / "all.yaml"
    path.write_text(yaml.safe_dump_all([config_map, CRON]))
    summary = validate_one(str(path))
    assert "ConfigMap settings (v1)" in summary and "CronJob batchspec-nightly" in summary
    path.write_text(yaml.safe_dump_all([config_map, _set(CRON, ("spec", "schedule"), "* *")]))
    with pytest.raises(ConfigError, match=r"all\.yaml \(document 2\): spec.schedule"):
        validate_one(str(path))


JOB = {"kind": "batchspec-job", "name": "n", "input": "in.parquet", "output": "s3://b/out/{date}"}


@pytest.mark.parametrize("change,message", [
    ({"extra": 1}, "unknown key 'extra'; expected one of kind, name"),
    ({"name": "Bad Name"}, "name: expected lowercase letters, digits and '-'"),
    ({"output": "out/{date}"}, "output: expected an absolute path or a URL"),
    ({"output": "s3://b/{day}"}, "output: unknown template field in 's3://b/{day}'; expected {date}"),
    ({"input": None}, "input: expected a path or URL"),
    ({"options": {"max_tokens": 0}}, "options.max_tokens: expected an integer >= 1, got 0"),
    ({"options": {"warp": 9}}, "options.warp: unknown option; expected one of"),
    ({"options": {"prior_run": "out/{date}"}}, "options.prior_run: expected an absolute path or a URL"),
    ({"options": {"prior_run": "s3://b/{yesterday}"}}, "options.prior_run: unknown template field in 's3://b/{yesterday}'"),
    ({"options": {"run_date": "yesterday"}}, "options.run_date: expected a date YYYY-MM-DD"),
    ({"resources": {"entrypoint_num_gpus": -1}}, "resources.entrypoint_num_gpus: expected a number >= 0"),
    ({"resources": {"gpus": 1}}, "resources.gpus: unknown key; expected one of entrypoint_num_cpus"),
    ({"runtime_env": {"working_dir": "nowhere"}}, "runtime_env.working_dir: expected a folder (relative to the job file)"),
    ({"runtime_env": {"env_vars": {"N": 1}}}, "runtime_env.env_vars.N: expected a string (quote numbers"),
    ({"runtime_env": {"containers": []}}, "runtime_env.containers: unknown key"),
    ({"runtime_env": {"working_dir": "."}, "pipeline": "nope.yaml"}, "pipeline: expected a pipeline file"),
])
def test_bad_job_files_name_the_key(tmp_path, change, message):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**JOB, **change}))
    (checked,) = validate_files([str(path)])
    assert not checked.ok
    assert checked.line.startswith(f"{path}: ") and message in checked.line
    assert "\n" not in checked.line


@pytest.mark.parametrize("text,message", [
    ("", "empty file"),
    ("engine: torch\nworkers: [1\n", "invalid YAML"),
    ("- a\n- b\n", "expected one YAML mapping"),
    ("engine: rocket\n", "engine: expected one of torch, trtllm"),
    ("speculative_config:\n  decoding_type: Medusa\n", "decoding_type"),
    ("candidates:\n  - config: missing.yaml\n", "missing.yaml"),
])
def test_other_bad_files_are_one_line_naming_the_file(tmp_path, text, message):
    path = tmp_path / "f.yaml"
    path.write_text(text)
    (checked,) = validate_files([str(path)])
    assert not checked.ok and message in checked.line and checked.line.startswith(str(path))


def test_a_missing_file_is_reported_and_others_still_checked(tmp_path):
    results = validate_files([str(tmp_path / "nope.yaml"), str(REPO / "pipelines" / "local.yaml")])
    assert [r.ok for r in results] == [False, True]
    assert "nope.yaml" in results[0].line and "not found" in results[0].line


def test_shipped_manifests_run_commands_the_cli_accepts():
    """The CronJob's command and the RayJob's entrypoint parse with the real click commands, and
    the job file the CronJob names is one that validates."""
    import shlex

    from batchspec.cli.run import command as run_command
    from batchspec.cli.submit import command as submit_command

    container = CRON["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    argv = container["command"]
    assert argv[:2] == ["batchspec", "submit"]
    ctx = submit_command.make_context("submit", list(argv[2:]))
    assert ctx.params["wait"] is True
    assert validate_one(str(REPO / ctx.params["job_file"])).startswith(str(REPO / ctx.params["job_file"]))
    assert "BATCHSPEC_ADDRESS" in [e["name"] for e in container["env"]]
    entry = shlex.split(RAYJOB["spec"]["entrypoint"])
    assert entry[:4] == ["python", "-m", "batchspec", "run"]
    ctx = run_command.make_context("run", entry[4:])
    assert ctx.params["output"].endswith("{date}") and (REPO / ctx.params["pipeline"]).exists()
