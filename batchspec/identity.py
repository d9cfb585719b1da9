"""A run's identity: everything that changes what a row's text can be, as one record.

What it holds: the engine, the model and the draft model (each as configured and with its
fingerprint: `batchspec.models.fingerprint`), dtype, the prompt format, every generation default
(max_tokens, temperature, top_p, seed), the default response format (its content, not its file
name), the arms (the spec and candidates files' content as resolved, and whether they are
calibrated) and the engine's LLM options. What it leaves out cannot change a greedy row's text:
calibration settings, batch size, workers and their resources, the device, storage options,
keep_shards, prior_run; and the plan options (shard_by, shard_size), which the plan's own
fingerprint covers.

The record is stored in OUTPUT/_plan.json and the manifest (secrets redacted: a URL's user info
and signed query are never part of it); a resume or rerun with another identity into an OUTPUT that
holds committed shards is refused, naming each option that differs (`plan.check_identity`).
"""

from __future__ import annotations

import dataclasses

from batchspec.config.run import RunConfig, default_response_format
from batchspec.engine.base import SpecConfig
from batchspec.models import fingerprint
from batchspec.plan import RunIdentity
from batchspec.redact import redact, redact_strings


def run_identity(config: RunConfig, arms: tuple[SpecConfig, ...], calibrate: bool, llm_options: dict) -> RunIdentity:
    """The identity of a run of `config` over `arms` (pipeline.run_arms) with `llm_options`
    (pipeline.run_llm_options): computed on the driver before anything is written."""
    storage = dict(config.storage_options)
    fmt = default_response_format(config)
    options = {
        "engine": config.engine,
        "model": config.model,
        "model_fingerprint": fingerprint(config.model, storage),
        "draft_model": config.draft_model,
        "draft_model_fingerprint": fingerprint(config.draft_model, storage) if config.draft_model else None,
        "dtype": config.dtype,
        "prompt_format": config.prompt_format,
        "max_tokens": config.max_tokens,
        "temperature": config.temperature,
        "top_p": config.top_p,
        "seed": config.seed,
        "response_format": dataclasses.asdict(fmt) if fmt is not None else None,
        "arms": [a.label for a in arms],
        "arm_settings": {a.label: _arm(a) for a in arms},
        "calibrate": calibrate,
    }
    return RunIdentity.of({**redact_strings(options), "llm_options": redact(llm_options)})


def _arm(arm: SpecConfig) -> dict:
    doc = dataclasses.asdict(arm)
    doc.pop("source")  # where it was read from: its content is what counts
    doc["options"] = dict(arm.options)
    return doc
