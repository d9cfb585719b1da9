"""The run configuration: built-in defaults < pipeline YAML < command-line options, validated once.
A pipeline file is the flat mapping of RunConfig's described fields; its keys, its precedence and
how the paths inside it resolve are docs/spec-settings.md's ("Pipeline files", "Precedence").
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import os
from typing import Annotated, Any, Optional

import fsspec
import numpy as np
from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, PlainValidator, confloat, model_validator
from pydantic_core import ArgsKwargs
from pydantic.dataclasses import dataclass
from pydantic.json_schema import SkipJsonSchema

from batchspec.calibrate import CalibrationSettings
from batchspec.config.kit import (Expect, check, exists, expected, flag, integer, known_keys, model_of, number, one_of, read_yaml,
                                  relative_to, said, text)
from batchspec.config.candidates import resolve_spec_arg
from batchspec.config.spec import LlmOptions, check_llm_options, check_world, run_llm_options
from batchspec.data import DEFAULT_PIPELINE, PIPELINES_DIR  # noqa: F401  (PIPELINES_DIR re-exported for the CLI)
from batchspec.engine.base import DTYPES, PROMPT_FORMATS, SUFFIX_TREE_MB_DEFAULT
from batchspec.engine.factory import ENGINES
from batchspec.engine.response_format import ResponseFormat, parse_json, parse_response_format
from batchspec.errors import ConfigError, one_line
from batchspec.redact import redact, redact_strings


def _float32_positive(v: float) -> float:
    if np.float32(v) == 0:  # the engines sample in float32: a top_p that rounds to 0 keeps no token at all
        raise ValueError
    return v


def _date(v: Any) -> Any:
    if isinstance(v, str):
        return dt.date.fromisoformat(v)
    if v is None or isinstance(v, dt.date):
        return v
    raise ValueError


def pairs(words: str, section: type | None = None, schema: Any = dict[str, Any]) -> PlainValidator:
    """A mapping held as sorted (key, value) pairs (RunConfig is hashable): a `section` of checked
    keys, or any keys (`schema` describes them)."""
    def convert(v: Any) -> tuple[tuple[str, Any], ...]:
        v = dict(v) if isinstance(v, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in v) else v
        if v is None:
            return ()
        if section is not None:
            v = {k: getattr(section.model_validate(v), k) for k in v}
        elif not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
            raise expected(words)
        return tuple(sorted(v.items()))
    return PlainValidator(convert, json_schema_input_type=section or schema)


Pairs = tuple[tuple[str, Any], ...]
CALIBRATION = model_of(CalibrationSettings)


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class WorkerConfig:
    """Resources and fault policy of each shard worker (one Ray actor, one engine): `worker:`."""

    num_cpus: number(ge=0) = Field(1.0, description="CPUs Ray reserves for each worker; fractional is fine (leave Ray room to read).")
    num_gpus: number(ge=0) = Field(0.0, description="GPUs of each worker; a trtllm worker runs one LLM across all of them.")
    torch_threads: integer(ge=1, null=True) = Field(None, description="Torch threads of the worker; null: the CPUs Ray gives the actor, at least 1.")
    max_attempts: integer(ge=1) = Field(3, description="Tries per shard before its rows are written as error rows.")
    wait_for_workers_s: number(ge=0) = Field(0.0, description=(
        "Hand out no shard until every worker has loaded its engine, or this many seconds passed (Ray Data's "
        "wait_for_min_actors_s); 0: a worker starts on shards as soon as it is ready."))
    suffix_tree_mb: number(ge=1, le=65536) = Field(SUFFIX_TREE_MB_DEFAULT, description=(
        "MiB of the suffix arm's trees (finished rows' outputs by shard key), all keys together; past it the "
        "oldest rows are evicted (about 9 bytes a token)."))

    @model_validator(mode="before")
    @classmethod
    def _known(cls, data: Any) -> Any:
        if isinstance(data, (cls, ArgsKwargs)):  # built in Python, not read from a file
            return data
        names = ", ".join(cls.__dataclass_fields__)
        return known_keys({} if data is None else data, tuple(cls.__dataclass_fields__), f"a mapping of {names}",
                          lambda key: said(f"unknown key; expected one of {names}", key))


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class RunConfig:
    """One run's settings: a pipeline file's keys, with the command line's INPUT, OUTPUT and pipeline."""

    input: SkipJsonSchema[Any] = ""
    output: SkipJsonSchema[Any] = ""
    pipeline: SkipJsonSchema[Optional[str]] = None
    engine: one_of(*ENGINES) = Field("torch", description="The engine every worker holds.")
    model: text("a model name, folder or URL") = Field("smollm2-135m", description="Target model: a registry name (batchspec models list), a Hugging Face folder or an fsspec URL to one.")
    draft_model: text("a model name, folder, URL", null=True) = Field(None, description="Draft model of every Draft_Target arm (replaces the option files' own).")
    dtype: one_of(*DTYPES) = Field("float32", description="Weights and compute dtype; float32 keeps greedy speculative output equal to plain output.")
    device: text("a torch device string", null=True) = Field(None, description="A torch device string; null: the worker's GPU if it has one, else CPU.")
    spec: text("auto, none or a YAML file") = Field("auto", description="auto: calibrate per shard over `candidates`; none: never speculate; a file: that option file's one arm, or that candidates file's arms.")
    candidates: text("a candidates YAML file", null=True) = Field(None, description="The candidates file `spec: auto` calibrates over (relative to this file); null: the engine's default.")
    shard_by: text("a column name", null=True) = Field(None, description="Column to group rows by before cutting shards (one calibration per value).")
    shard_size: integer(ge=1) = Field(64, description="Rows per shard at most.")
    workers: integer(ge=1) = Field(1, description="Shard workers (Ray actors), each holding one engine.")
    batch_size: integer(ge=1) = Field(8, description="Sequences generated at once per worker.")
    max_tokens: integer(ge=1) = Field(64, description="Default max new tokens (a max_tokens column overrides per row).")
    temperature: number(ge=0) = Field(0.0, description="Default temperature (a column overrides per row); 0 is greedy.")
    top_p: Annotated[confloat(strict=True, gt=0, le=1), AfterValidator(_float32_positive), Expect("a number in (0, 1] that float32 does not round to 0")] = Field(1.0, description="Default nucleus mass (a column overrides per row).")
    seed: integer(ge=0, le=2**64 - 1, null=True) = Field(0, description="Run seed (unsigned 64 bits, as the engines take it): each row samples with one derived from it and its id.")
    response_format: text("a JSON file of an OpenAI response_format", null=True) = Field(None, description="A JSON file holding an OpenAI response_format: structured output for rows whose response_format column is null.")
    prior_run: text("the OUTPUT of a previous run (path or fsspec URL)", null=True) = Field(None, description=(
        "A previous run's OUTPUT: each shard key's first shard starts under the arm it predicted best (same engine, "
        "model, batch size); with {date}, the newest earlier run that template names."))
    prompt_format: one_of(*PROMPT_FORMATS) = Field("chat", description="chat: a text prompt is one user message through the model's chat template; raw: as is (base models).")
    resume: flag() = Field(True, description="Skip the shards OUTPUT already holds committed.")
    keep_shards: flag() = Field(False, description="Keep OUTPUT/_shards/ (each shard's input rows) after _SUCCESS, for debugging.")
    run_date: Annotated[Optional[dt.date], BeforeValidator(_date), Expect("a date YYYY-MM-DD or null")] = Field(None, description="The run date {date} names in INPUT, OUTPUT and prior_run; null: today in UTC.")
    ray_address: text("a Ray address", null=True) = Field(None, description="Join this Ray cluster (RAY_ADDRESS otherwise); null: start a local Ray.")
    ray_num_cpus: integer(ge=1, null=True) = Field(None, description="Local Ray only: its CPUs; null: every CPU of the machine.")
    worker: WorkerConfig = Field(WorkerConfig(), description="Resources and fault policy of each shard worker.")
    calibration: Annotated[Pairs, pairs("", CALIBRATION)] = Field((), description="Calibration settings overrides (docs/calibration.md).", json_schema_extra={"default": {}})
    storage_options: Annotated[Pairs, pairs("a mapping of fsspec options")] = Field((), description="fsspec options for INPUT and OUTPUT (endpoint, credentials).", json_schema_extra={"default": {}})
    llm_options: Annotated[Pairs, pairs("a mapping of TensorRT-LLM LLM arguments", schema=LlmOptions)] = Field(
        (), description="trtllm: TensorRT-LLM LLM arguments every arm, none included, is built with.", json_schema_extra={"default": {}})
    train_head: flag() = Field(False, description=(
        "spec auto, torch engine: train an EAGLE-3 head for each shard key on its first shard's rows (their hidden states "
        "recorded as they decode), written to OUTPUT/heads/; it joins the key's later shards' arms and calibration "
        "decides whether it pays."))
    train_head_budget: number(gt=0, le=1) = Field(0.05, description="train_head: the training seconds, as a share of the key's expected decode seconds.")
    strict_speculation: flag() = Field(False, description="Exit non-zero when calibration could not measure any speculative arm in some shard.")

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


# The keys of a pipeline file: every field but the command line's; `worker` and `calibration` are sections.
FIELDS = tuple(f.name for f in dataclasses.fields(RunConfig) if f.name not in ("input", "output", "pipeline", "worker", "calibration"))
WORKER_FIELDS = tuple(f.name for f in dataclasses.fields(WorkerConfig))
SECTIONS = ("worker", "calibration")
PATH_FIELDS = ("candidates", "spec", "model", "draft_model", "response_format")


@functools.cache
def field_type(cls: type, name: str) -> Any:
    """The type one field of a config dataclass is checked by (a command-line option's check)."""
    info = cls.__pydantic_fields__[name]
    return Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation


def load_pipeline(path: str | os.PathLike) -> dict[str, Any]:
    """A pipeline file's settings as RunConfig keyword values, every key checked for type and
    range (ConfigError naming file, key, value and expectation). `path` may be an fsspec URL."""
    path = str(path)
    data = read_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    unknown = next((key for key in data if key not in (*FIELDS, *SECTIONS)), None)
    if unknown is not None:
        raise ConfigError(f"{path}: unknown key {unknown!r}; expected one of {', '.join([*FIELDS, *SECTIONS])}")
    config = check(RunConfig, data, path)
    values = {key: getattr(config, key) for key in data}
    for key in PATH_FIELDS:
        if values.get(key) is not None:
            values[key] = _relative(path, values[key])
    return values


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
        option = f"--{key.replace('_', '-')}"
        if key in WORKER_FIELDS:
            worker = dataclasses.replace(worker, **{key: check(field_type(WorkerConfig, key), value, "option", key=option)})
        elif key in FIELDS:
            values[key] = check(field_type(RunConfig, key), value, "option", key=option)
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
    """What only one engine takes: llm_options and a GPU for trtllm, train_head on torch with spec
    auto (one line naming the key)."""
    if config.train_head and (config.engine != "torch" or config.spec != "auto"):
        raise ConfigError(f"{source}: train_head: a trained head needs engine torch and spec auto, got engine "
                          f"{config.engine} and spec {config.spec}")
    if config.engine != "trtllm":
        if config.llm_options:
            raise ConfigError(f"{source}: llm_options: TensorRT-LLM arguments need engine trtllm, got engine {config.engine}")
        return
    if config.device not in (None, "cuda"):
        raise ConfigError(f"{source}: device: the trtllm engine runs on the worker's GPU; expected null or cuda, got {config.device!r}")
    check_llm_options(f"{source}: llm_options", dict(config.llm_options))


def validate_pipeline_file(path: str | os.PathLike) -> str:
    """Check a pipeline file (for `batchspec validate`); return a one-line summary."""
    values = load_pipeline(path)
    config = RunConfig(**values)
    check_engine_options(config, str(path))
    default_response_format(config, f"{path}: response_format")
    if config.engine == "trtllm" and config.worker.num_gpus < 1:
        raise ConfigError(f"{path}: worker.num_gpus: expected >= 1 for the trtllm engine, got {config.worker.num_gpus}")
    choice = resolve_spec_arg(config.spec, config.candidates, config.engine, config.draft_model)  # the files it names
    if config.engine == "trtllm":  # every arm must be buildable with one set of LLM options, on the worker's GPUs
        merged = run_llm_options(dict(config.llm_options), choice.arms, where=f"{path}: llm_options")
        check_world(f"{path}: llm_options", merged, config.worker.num_gpus)
    return f"{path}: pipeline, engine {config.engine}, model {config.model}, spec {config.spec}, {config.workers} worker(s)"
