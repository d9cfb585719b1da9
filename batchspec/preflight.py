"""The one preparation of a job, before any worker starts: `batchspec run` (and `--plan-only`),
`batchspec calibrate` and the Ray Data stage all call `prepare`.

What it checks, in this order, so a bad job stops with one line and nothing started: the engine is
available here, its options (`llm_options`, a GPU for trtllm), the prompt format against the model,
the spec and candidates files (the arms, valid for the engine), and the LLM options every arm is
built with. What it hands on (`Prepared`): the config with its run date fixed, the arms and whether
they are calibrated, the rows' defaults (the default response_format read and checked), and on
demand the run's identity, the prior run's starting arms and the worker job. It knows nothing of
OUTPUT, the input or Ray.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from batchspec.config.candidates import SpecChoice, resolve_spec_arg
from batchspec.config.run import RunConfig, check_engine_options, default_response_format
from batchspec.engine.base import NO_SPEC, SpecConfig
from batchspec.identity import run_identity
from batchspec.models import local_folder, require_chat_template
from batchspec.parse import RowDefaults
from batchspec.plan import RunIdentity
from batchspec.prior import Prior, prior_of
from batchspec.workers import WorkerJob


@dataclass(frozen=True)
class Prepared:
    """A job checked and ready: what every worker of it gets."""

    config: RunConfig  # its run_date fixed: one date for INPUT, OUTPUT and prior_run
    choice: SpecChoice  # what --spec resolved to (the arms left out, and why)
    arms: tuple[SpecConfig, ...]
    calibrate: bool
    llm_options: dict[str, Any]  # trtllm: what every arm, none included, is built with
    defaults: RowDefaults

    def identity(self) -> RunIdentity:
        return run_identity(self.config, self.arms, self.calibrate, self.llm_options)

    def prior(self) -> Prior:
        """Each key's starting arm from `prior_run` (read now, before any worker starts)."""
        return prior_of(self.config, self.arms, self.calibrate)

    def worker_job(self, output=None, passthrough: pa.Schema = pa.schema([]), out_schema: pa.Schema = pa.schema([]),
                   lease=None, heads_from: str | None = None) -> WorkerJob:
        """The job every worker holds; without `output` (the Ray Data stage) workers write nothing
        (and train no head). `heads_from`: the prior run's OUTPUT, whose heads train_head reuses."""
        c = self.config
        return WorkerJob(
            output=output, passthrough=passthrough, out_schema=out_schema, engine=c.engine, model=c.model,
            draft_model=c.draft_model, dtype=c.dtype, device=c.device, arms=self.arms, calibrate=self.calibrate,
            batch_size=c.batch_size, calibration=c.calibration, defaults=self.defaults, worker=c.worker,
            llm_options=tuple(self.llm_options.items()), storage_options=tuple(c.storage_options), lease=lease,
            train_head=c.train_head, train_head_budget=c.train_head_budget, heads_from=heads_from,
        )


def prepare(config: RunConfig, where: str = "run") -> Prepared:
    """Check `config` before any work (module docstring); `where` names a config without a pipeline file."""
    config = dataclasses.replace(config, run_date=config.date())
    check_engine(config.engine)
    check_engine_options(config, config.pipeline or where)
    check_prompt_format(config)
    choice = resolve_spec(config)
    arms, calibrate = run_arms(choice)
    return Prepared(config, choice, arms, calibrate, run_llm_options(config, arms), row_defaults(config))


def check_engine(engine: str) -> None:
    """Stop before any work when the engine cannot run here (one line from the adapter)."""
    if engine == "trtllm":
        from batchspec.engine.trtllm.install import require_trtllm_installed

        require_trtllm_installed()


def check_prompt_format(config: RunConfig) -> None:
    """prompt_format chat needs a model with a chat template: one found on this machine without one
    stops the run here; a model not here yet (a URL) is checked by each worker once it has it."""
    if config.prompt_format == "chat":
        require_chat_template(config.model, local_folder(config.model))


def row_defaults(config: RunConfig) -> RowDefaults:
    """How the run's rows become requests unless a row says otherwise (batchspec.parse): the sampling
    values, the prompt format, the default response_format (its file read and checked here) and the
    model a Batch API request line may name."""
    return RowDefaults(config.max_tokens, config.temperature, config.top_p, config.seed, config.prompt_format,
                       default_response_format(config), config.model)


def run_llm_options(config: RunConfig, arms) -> dict:
    """trtllm: the LLM options every arm is built with, "none" included (like for like), checked to
    span exactly the GPUs each worker holds."""
    if config.engine != "trtllm":
        return {}
    from batchspec.config.spec import check_world, run_llm_options as merge

    where = f"{config.pipeline or 'run'}: llm_options"
    merged = merge(dict(config.llm_options), [a for a in arms if a.method != "none"], where=where)
    check_world(where, merged, config.worker.num_gpus)
    return merged


def resolve_spec(config: RunConfig) -> SpecChoice:
    """`--spec` as a `SpecChoice` (the arms, whether to calibrate, and any arm left out and why)."""
    return resolve_spec_arg(config.spec, config.candidates, config.engine, config.draft_model)


def run_arms(choice: SpecChoice) -> tuple[tuple, bool]:
    """The arms workers get, and whether they calibrate over them."""
    if choice.calibrate:
        return tuple(choice.arms), True
    return ((choice.fixed or NO_SPEC),), False
