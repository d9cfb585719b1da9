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
    worker: {num_cpus: 1, num_gpus: 0, torch_threads: null, max_attempts: 3}
    calibration: {sample_size: 8, max_tokens: 16, ...}   # batchspec.calibrate.CalibrationSettings
    storage_options: {}           # fsspec options for INPUT and OUTPUT (endpoint, credentials)

Every error names the file (or the option), the key and what was expected, in one line. Relative
paths inside a pipeline file (candidates, spec, a model folder) are taken relative to that file.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from batchspec.data import DEFAULT_PIPELINE, PIPELINES_DIR  # noqa: F401  (PIPELINES_DIR re-exported for the CLI)
from batchspec.errors import ConfigError

ENGINES = ("torch", "trtllm")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class WorkerConfig:
    """Resources and fault policy of each shard worker (one Ray actor, one engine)."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    torch_threads: int | None = None  # None: the CPUs Ray gives the actor, at least 1
    max_attempts: int = 3  # tries per shard before its rows are written as error rows


@dataclass(frozen=True)
class RunConfig:
    input: str = ""
    output: str = ""
    pipeline: str | None = None
    engine: str = "torch"
    model: str = "smollm2-135m"
    draft_model: str | None = None
    dtype: str = "float32"
    device: str | None = None
    spec: str = "auto"
    candidates: str | None = None
    shard_by: str | None = None
    shard_size: int = 64
    workers: int = 1
    batch_size: int = 8
    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = 0
    resume: bool = True
    run_date: dt.date | None = None
    ray_address: str | None = None
    ray_num_cpus: int | None = None  # local Ray only; None: every CPU of the machine
    worker: WorkerConfig = WorkerConfig()
    calibration: tuple[tuple[str, Any], ...] = ()
    storage_options: tuple[tuple[str, Any], ...] = ()
    # trtllm: TensorRT-LLM LLM arguments every arm of the run is built with (merged with the arms'
    # option files by batchspec.config.spec.run_llm_options; "none" gets them too).
    llm_options: tuple[tuple[str, Any], ...] = ()
    # Exit non-zero when calibration could not measure any speculative arm in some shard (every
    # arm failed): the outputs are complete, but speculation never ran. True in GPU pipelines.
    strict_speculation: bool = False

    def to_doc(self) -> dict:
        doc = dataclasses.asdict(self)
        doc["calibration"] = dict(self.calibration)
        doc["llm_options"] = dict(self.llm_options)
        doc["storage_options"] = {k: "***" if _secret(k) else v for k, v in self.storage_options}
        return doc


def _secret(key: str) -> bool:
    return any(word in key.lower() for word in ("secret", "key", "token", "password"))


# key -> (expected description, checker returning the converted value or raising ValueError)
def _pos_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError
    return v


def _opt_int(v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError
    return v


def _nonneg_float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise ValueError
    return float(v)


def _top_p(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
        raise ValueError
    return float(v)


def _opt_str(v: Any) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str) or not v:
        raise ValueError
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise ValueError
    return v


def _choice(options: tuple[str, ...]):
    def check(v: Any) -> str:
        if v not in options:
            raise ValueError
        return v

    return check


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError
    return v


def _date(v: Any) -> dt.date | None:
    if v is None or isinstance(v, dt.date):
        return v
    if isinstance(v, str):
        return dt.date.fromisoformat(v)
    raise ValueError


def _mapping(v: Any) -> tuple[tuple[str, Any], ...]:
    if v is None:
        return ()
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        raise ValueError
    return tuple(sorted(v.items()))


FIELDS: dict[str, tuple[str, Any]] = {
    "engine": (f"one of {', '.join(ENGINES)}", _choice(ENGINES)),
    "model": ("a model name, folder or URL", _str),
    "draft_model": ("a model name, folder, URL or null", _opt_str),
    "dtype": (f"one of {', '.join(DTYPES)}", _choice(DTYPES)),
    "device": ("a torch device string or null", _opt_str),
    "spec": ("auto, none or a YAML file", _str),
    "candidates": ("a candidates YAML file or null", _opt_str),
    "shard_by": ("a column name or null", _opt_str),
    "shard_size": ("an integer >= 1", _pos_int),
    "workers": ("an integer >= 1", _pos_int),
    "batch_size": ("an integer >= 1", _pos_int),
    "max_tokens": ("an integer >= 1", _pos_int),
    "temperature": ("a number >= 0", _nonneg_float),
    "top_p": ("a number in (0, 1]", _top_p),
    "seed": ("an integer or null", _opt_int),
    "resume": ("true or false", _bool),
    "run_date": ("a date YYYY-MM-DD or null", _date),
    "ray_address": ("a Ray address or null", _opt_str),
    "ray_num_cpus": ("an integer or null", _opt_int),
    "calibration": ("a mapping of calibration settings", _mapping),
    "storage_options": ("a mapping of fsspec options", _mapping),
    "llm_options": ("a mapping of TensorRT-LLM LLM arguments", _mapping),
    "strict_speculation": ("true or false", _bool),
}
WORKER_FIELDS: dict[str, tuple[str, Any]] = {
    "num_cpus": ("a number >= 0", _nonneg_float),
    "num_gpus": ("a number >= 0", _nonneg_float),
    "torch_threads": ("an integer >= 1 or null", lambda v: None if v is None else _pos_int(v)),
    "max_attempts": ("an integer >= 1", _pos_int),
}
PATH_FIELDS = ("candidates", "spec", "model", "draft_model")


def load_pipeline(path: str | os.PathLike) -> dict[str, Any]:
    """A pipeline file's settings as RunConfig keyword values (ConfigError naming file and key)."""
    path = str(path)
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"pipeline file {path} does not exist") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} is not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key == "worker":
            values["worker"] = _worker(path, value)
        elif key in FIELDS:
            values[key] = _check(path, key, value, FIELDS[key])
        else:
            raise ConfigError(f"{path}: unknown key {key!r}; expected one of {', '.join([*FIELDS, 'worker'])}")
    base = Path(path).resolve().parent
    for key in PATH_FIELDS:
        if key in values:
            values[key] = _relative(base, values[key])
    return values


def _relative(base: Path, value: str | None) -> str | None:
    """A relative path that exists next to the pipeline file is taken from there."""
    if value is None or value in ("auto", "none") or "://" in value or os.path.isabs(value):
        return value
    candidate = base / value
    return str(candidate) if candidate.exists() else value


def _check(where: str, key: str, value: Any, rule: tuple[str, Any]) -> Any:
    expected, convert = rule
    try:
        return convert(value)
    except (ValueError, TypeError):
        raise ConfigError(f"{where}: {key}: expected {expected}, got {value!r}") from None


def _worker(path: str, value: Any) -> WorkerConfig:
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: worker: expected a mapping of {', '.join(WORKER_FIELDS)}, got {value!r}")
    out = {}
    for key, v in value.items():
        if key not in WORKER_FIELDS:
            raise ConfigError(f"{path}: worker.{key}: unknown key; expected one of {', '.join(WORKER_FIELDS)}")
        out[key] = _check(path, f"worker.{key}", v, WORKER_FIELDS[key])
    return WorkerConfig(**out)


def build_config(input: str, output: str, pipeline: str | None = None, **options: Any) -> RunConfig:
    """Defaults < pipeline file (DEFAULT_PIPELINE when none is given) < options that are not None."""
    source = pipeline or str(DEFAULT_PIPELINE)
    values = load_pipeline(source) if Path(source).exists() or pipeline else {}
    worker = values.pop("worker", WorkerConfig())
    for key, value in options.items():
        if value is None:
            continue
        if key in WORKER_FIELDS:
            worker = dataclasses.replace(worker, **{key: _check("option", f"--{key.replace('_', '-')}", value, WORKER_FIELDS[key])})
        elif key in FIELDS:
            values[key] = _check("option", f"--{key.replace('_', '-')}", value, FIELDS[key])
        else:
            raise AssertionError(f"unknown option {key}")
    if not values.get("ray_address") and os.environ.get("RAY_ADDRESS"):
        values["ray_address"] = os.environ["RAY_ADDRESS"]
    config = RunConfig(input=input, output=output, pipeline=source, worker=worker, **values)
    _check_calibration(config, source)
    check_engine_options(config, source)
    return config


def _check_calibration(config: RunConfig, source: str) -> None:
    """Calibration keys must be fields of batchspec.calibrate.CalibrationSettings."""
    if not config.calibration:
        return
    try:
        from batchspec.calibrate import CalibrationSettings
    except ImportError:
        return
    names = {f.name for f in dataclasses.fields(CalibrationSettings)}
    for key, value in config.calibration:
        if key not in names:
            raise ConfigError(f"{source}: calibration.{key}: unknown key; expected one of {', '.join(sorted(names))}")
        if key == "max_builds_per_worker" and (isinstance(value, bool) or not isinstance(value, int) or value < 2):
            raise ConfigError(f"{source}: calibration.max_builds_per_worker: expected an integer >= 2 (none and one arm), got {value!r}")


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
    config = RunConfig(**{k: v for k, v in values.items()})
    _check_calibration(config, str(path))
    check_engine_options(config, str(path))
    if config.engine == "trtllm" and config.worker.num_gpus < 1:
        raise ConfigError(f"{path}: worker.num_gpus: expected >= 1 for the trtllm engine, got {config.worker.num_gpus}")
    from batchspec.config.candidates import resolve_spec_arg

    choice = resolve_spec_arg(config.spec, config.candidates, config.engine, config.draft_model)  # the files it names
    if config.engine == "trtllm":  # every arm must be buildable with one set of LLM options
        from batchspec.config.spec import run_llm_options

        run_llm_options(dict(config.llm_options), choice.arms, where=f"{path}: llm_options")
    return f"{path}: pipeline, engine {config.engine}, model {config.model}, spec {config.spec}, {config.workers} worker(s)"
