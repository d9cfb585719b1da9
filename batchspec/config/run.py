"""The run configuration: built-in defaults < pipeline YAML < command-line options, validated once.

A pipeline file (pipelines/*.yaml) is a flat mapping of the RunConfig fields below, with three
nested sections:

    engine: torch                 # torch | trtllm
    model: smollm2-135m           # registry name, local folder or fsspec URL
    spec: auto                    # auto | none | FILE.yaml
    candidates: trt_configs/candidates/torch_default.yaml   # relative to the pipeline file
    shard_by: null
    shard_size: 64
    workers: 1
    batch_size: 8
    max_tokens: 64
    prompt_format: chat           # chat: a prompt is one user message through the model's chat template; raw: as is
    response_format: null         # a JSON file: the default response_format of rows without one
    prior_run: null               # a previous run's OUTPUT: each key's first shard starts under its predicted best arm
    worker: {num_cpus: 1, num_gpus: 0, torch_threads: null, max_attempts: 3, wait_for_workers_s: 0, suffix_tree_mb: 256}
    calibration: {sample_size: 8, max_tokens: 16, ...}   # batchspec.calibrate.CalibrationSettings
    storage_options: {}           # fsspec options for INPUT and OUTPUT (endpoint, credentials)

Every key is checked for type and range at load, by the rules the dataclasses below (and
CalibrationSettings) declare in their field metadata; every error names the file (or the option),
the key, the value and what was expected, in one line. A pipeline file may be a path or an fsspec
URL (`s3://bucket/conf/pipeline.yaml`, read with the ambient fsspec/AWS configuration, since its own
storage_options cannot be read before it). Relative paths inside it (candidates, spec, a model
folder) are taken relative to the file's folder, on the same filesystem, when something is there.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from dataclasses import dataclass, field
from typing import Any

import fsspec

from batchspec.config.kit import check_fields, check_value, exists, field_rules, read_yaml, relative_to
from batchspec.data import DEFAULT_PIPELINE, PIPELINES_DIR  # noqa: F401  (PIPELINES_DIR re-exported for the CLI)
from batchspec.engine.base import DTYPES, PROMPT_FORMATS, SUFFIX_TREE_MB_DEFAULT
from batchspec.engine.factory import ENGINES
from batchspec.engine.response_format import ResponseFormat, parse_json, parse_response_format
from batchspec.errors import ConfigError, one_line
from batchspec.redact import redact, redact_strings


def _date(v: Any) -> dt.date | None:
    if v is None or isinstance(v, dt.date):
        return v
    if isinstance(v, str):
        return dt.date.fromisoformat(v)
    raise ValueError


def _top_p(v: Any) -> float:
    """A nucleus mass in (0, 1] that stays above 0 in float32, where the engines sample (a top_p
    float32 rounds to 0 keeps no token at all)."""
    import numpy as np

    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1 or np.float32(v) == 0:
        raise ValueError
    return float(v)


def _mapping(v: Any) -> tuple[tuple[str, Any], ...]:
    if v is None:
        return ()
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        raise ValueError
    return tuple(sorted(v.items()))


@dataclass(frozen=True)
class WorkerConfig:
    """Resources and fault policy of each shard worker (one Ray actor, one engine)."""

    num_cpus: float = field(default=1.0, metadata={"min": 0})
    num_gpus: float = field(default=0.0, metadata={"min": 0})
    torch_threads: int | None = field(default=None, metadata={"min": 1})  # None: the CPUs Ray gives the actor, at least 1
    max_attempts: int = field(default=3, metadata={"min": 1})  # tries per shard before its rows are written as error rows
    # Hand out no shard until every worker of the pool has loaded its engine, or this many seconds
    # passed (Ray Data's `wait_for_min_actors_s`). 0: a worker starts on shards as soon as it is
    # ready, and on a fast pool the first ready one may take every shard of a short run.
    wait_for_workers_s: float = field(default=0.0, metadata={"min": 0})
    # The suffix arm's trees (finished rows' outputs by shard key), all keys together, in MiB: past
    # it the oldest rows are evicted. About 9 bytes a token (docs/suffix.md): 256 MiB holds ~28M.
    suffix_tree_mb: float = field(default=SUFFIX_TREE_MB_DEFAULT, metadata={"min": 1, "max": 65536})


@dataclass(frozen=True)
class RunConfig:
    """One run's settings. Each field's type and `metadata` (range, choices, or the words for
    what is expected) are the one rule `load_pipeline` and `build_config` check it by."""

    input: str = ""
    output: str = ""
    pipeline: str | None = None
    engine: str = field(default="torch", metadata={"choices": ENGINES})
    model: str = field(default="smollm2-135m", metadata={"expected": "a model name, folder or URL"})
    draft_model: str | None = field(default=None, metadata={"expected": "a model name, folder, URL"})
    dtype: str = field(default="float32", metadata={"choices": DTYPES})
    device: str | None = field(default=None, metadata={"expected": "a torch device string"})
    spec: str = field(default="auto", metadata={"expected": "auto, none or a YAML file"})
    candidates: str | None = field(default=None, metadata={"expected": "a candidates YAML file"})
    shard_by: str | None = field(default=None, metadata={"expected": "a column name"})
    shard_size: int = field(default=64, metadata={"min": 1})
    workers: int = field(default=1, metadata={"min": 1})
    batch_size: int = field(default=8, metadata={"min": 1})
    max_tokens: int = field(default=64, metadata={"min": 1})
    temperature: float = field(default=0.0, metadata={"min": 0})
    top_p: float = field(default=1.0, metadata={"expected": "a number in (0, 1] that float32 does not round to 0", "convert": _top_p})
    seed: int | None = field(default=0, metadata={"min": 0, "max": 2**64 - 1})  # unsigned 64 bits, as the engines take it
    # A JSON file holding an OpenAI `response_format` ({"type": "json_schema", "json_schema": {...}}):
    # structured output for every row whose response_format column is null (or that has none).
    response_format: str | None = field(default=None, metadata={"expected": "a JSON file of an OpenAI response_format"})
    # A previous run's OUTPUT (path or fsspec URL): each shard key's first shard starts under the arm
    # that run predicted best for the key, where it ran this engine, model and batch size (batchspec.prior);
    # with {date} (OUTPUT's template), the newest earlier run it names.
    prior_run: str | None = field(default=None, metadata={"expected": "the OUTPUT of a previous run (path or fsspec URL)"})
    # How a text `prompt` reaches the model (batchspec.parse): "chat", one user message through the
    # model's chat template (an instruct model answers a bare instruction with end-of-turn), or
    # "raw", as is (completion-style prompts for base models). `messages` rows always take the template.
    prompt_format: str = field(default="chat", metadata={"choices": PROMPT_FORMATS})
    resume: bool = True
    # Keep OUTPUT/_shards/ (each shard's input rows) after _SUCCESS, for debugging; by default a
    # finished run removes it (batchspec.pipeline: the decision and why resume stays exact).
    keep_shards: bool = field(default=False, metadata={"expected": "true or false"})
    run_date: dt.date | None = field(default=None, metadata={"expected": "a date YYYY-MM-DD or null", "convert": _date})
    ray_address: str | None = field(default=None, metadata={"expected": "a Ray address"})
    ray_num_cpus: int | None = field(default=None, metadata={"min": 1})  # local Ray only; None: every CPU of the machine
    worker: WorkerConfig = WorkerConfig()
    # batchspec.calibrate.CalibrationSettings overrides, checked against its fields at load
    calibration: tuple[tuple[str, Any], ...] = ()
    storage_options: tuple[tuple[str, Any], ...] = field(
        default=(), metadata={"expected": "a mapping of fsspec options", "convert": _mapping})
    # trtllm: TensorRT-LLM LLM arguments every arm of the run is built with (merged with the arms'
    # option files by batchspec.config.spec.run_llm_options; "none" gets them too).
    llm_options: tuple[tuple[str, Any], ...] = field(
        default=(), metadata={"expected": "a mapping of TensorRT-LLM LLM arguments", "convert": _mapping})
    # Exit non-zero when calibration could not measure any speculative arm in some shard (every
    # arm failed): the outputs are complete, but speculation never ran. True in GPU pipelines.
    strict_speculation: bool = False

    def date(self) -> dt.date:
        """The run date: `run_date`, else today in UTC (what {date} names in INPUT, OUTPUT and
        prior_run)."""
        return self.run_date or dt.datetime.now(dt.timezone.utc).date()

    def to_doc(self) -> dict:
        """The settings as a document to write or show: secrets masked in storage and LLM options at
        any depth, and every URL without its user info or signed query (batchspec.redact)."""
        doc = dataclasses.asdict(self)
        doc["calibration"] = dict(self.calibration)
        doc["llm_options"] = redact(dict(self.llm_options))
        doc["storage_options"] = redact(dict(self.storage_options))
        return redact_strings(doc)


# key -> (what is expected, converter): derived from the dataclasses above, never listed twice.
# `worker` and `calibration` are sections, checked field by field (WORKER_FIELDS, CalibrationSettings).
FIELDS = field_rules(RunConfig, skip=("input", "output", "pipeline", "worker", "calibration"))
WORKER_FIELDS = field_rules(WorkerConfig)
SECTIONS = ("worker", "calibration")
PATH_FIELDS = ("candidates", "spec", "model", "draft_model", "response_format")


def load_pipeline(path: str | os.PathLike) -> dict[str, Any]:
    """A pipeline file's settings as RunConfig keyword values, every key checked for type and
    range (ConfigError naming file, key, value and expectation). `path` may be an fsspec URL."""
    path = str(path)
    data = read_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key == "worker":
            values["worker"] = WorkerConfig(**check_fields(path, "worker", WorkerConfig, value))
        elif key == "calibration":
            values["calibration"] = check_calibration(path, value)
        elif key in FIELDS:
            values[key] = check_value(path, key, value, FIELDS[key])
        else:
            raise ConfigError(f"{path}: unknown key {key!r}; expected one of {', '.join([*FIELDS, *SECTIONS])}")
    for key in PATH_FIELDS:
        if values.get(key) is not None:
            values[key] = _relative(path, values[key])
    return values


def check_calibration(where: str, value: Any) -> tuple[tuple[str, Any], ...]:
    """The `calibration:` section: keys and values checked against CalibrationSettings' fields
    and their declared ranges; returned as sorted (key, value) pairs (RunConfig is hashable)."""
    from batchspec.calibrate import CalibrationSettings  # lazy: calibrate pulls in pyarrow

    return tuple(sorted(check_fields(where, "calibration", CalibrationSettings, value).items()))


def _relative(pipeline: str, value: str) -> str:
    """A relative path that exists next to the pipeline file (or URL) is taken from there;
    anything else (auto, none, a registry model name) is left as written."""
    if value in ("auto", "none"):
        return value
    candidate = relative_to(pipeline, value)
    if candidate == value:
        return value
    if "://" not in candidate:
        candidate = os.path.abspath(candidate)
    return candidate if exists(candidate) else value


def build_config(input: str, output: str, pipeline: str | None = None, **options: Any) -> RunConfig:
    """Defaults < pipeline file (DEFAULT_PIPELINE when none is given) < options that are not None."""
    source = pipeline or str(DEFAULT_PIPELINE)
    values = load_pipeline(source)
    worker = values.pop("worker", WorkerConfig())
    for key, value in options.items():
        if value is None:
            continue
        if key in WORKER_FIELDS:
            worker = dataclasses.replace(worker, **{key: check_value("option", f"--{key.replace('_', '-')}", value, WORKER_FIELDS[key])})
        elif key in FIELDS:
            values[key] = check_value("option", f"--{key.replace('_', '-')}", value, FIELDS[key])
        else:
            raise AssertionError(f"unknown option {key}")
    if not values.get("ray_address") and os.environ.get("RAY_ADDRESS"):
        values["ray_address"] = os.environ["RAY_ADDRESS"]
    config = RunConfig(input=input, output=output, pipeline=source, worker=worker, **values)
    check_engine_options(config, source)
    default_response_format(config, "--response-format" if options.get("response_format") else f"{source}: response_format")
    return config


def default_response_format(config: RunConfig, where: str = "response_format") -> ResponseFormat | None:
    """The run's default response_format, read from its JSON file (a path or fsspec URL) and
    checked (its shape; for the torch engine also its schema, compiled by its grammar library);
    ConfigError naming the file and what is wrong. None when the run sets none."""
    if not config.response_format:
        return None
    path = config.response_format
    try:
        with fsspec.open(path, "r", **dict(config.storage_options)) as f:
            text = f.read()
    except Exception as exc:
        raise ConfigError(f"{where}: cannot read {path}: {one_line(exc)}") from None
    try:
        fmt = parse_response_format(parse_json(text, path))
    except ValueError as exc:
        raise ConfigError(f"{where}: {path}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{where}: {path}: response_format is nested too deeply") from None
    if fmt is not None and config.engine == "torch":  # its grammar library's verdict, before any worker starts
        from batchspec.engine.torch.grammar import schema_problem

        problem = schema_problem(fmt)
        if problem:
            raise ConfigError(f"{where}: {path}: {problem}")
    return fmt


def check_engine_options(config: RunConfig, source: str) -> None:
    """What only one engine takes: llm_options and a GPU for trtllm (one line naming the key)."""
    if config.engine != "trtllm":
        if config.llm_options:
            raise ConfigError(f"{source}: llm_options: TensorRT-LLM arguments need engine trtllm, got engine {config.engine}")
        return
    if config.device not in (None, "cuda"):
        raise ConfigError(f"{source}: device: the trtllm engine runs on the worker's GPU; expected null or cuda, got {config.device!r}")
    if config.llm_options:
        from batchspec.config.spec import check_llm_options

        check_llm_options(f"{source}: llm_options", dict(config.llm_options))


def validate_pipeline_file(path: str | os.PathLike) -> str:
    """Check a pipeline file (for `batchspec validate`); return a one-line summary."""
    values = load_pipeline(path)
    config = RunConfig(**values)
    check_engine_options(config, str(path))
    default_response_format(config, f"{path}: response_format")
    if config.engine == "trtllm" and config.worker.num_gpus < 1:
        raise ConfigError(f"{path}: worker.num_gpus: expected >= 1 for the trtllm engine, got {config.worker.num_gpus}")
    from batchspec.config.candidates import resolve_spec_arg

    choice = resolve_spec_arg(config.spec, config.candidates, config.engine, config.draft_model)  # the files it names
    if config.engine == "trtllm":  # every arm must be buildable with one set of LLM options, on the worker's GPUs
        from batchspec.config.spec import check_world, run_llm_options

        merged = run_llm_options(dict(config.llm_options), choice.arms, where=f"{path}: llm_options")
        check_world(f"{path}: llm_options", merged, config.worker.num_gpus)
    return f"{path}: pipeline, engine {config.engine}, model {config.model}, spec {config.spec}, {config.workers} worker(s)"
