"""`batchspec calibrate` as a library call (`calibrate_only`): each shard key's first shard of the
input, as `batchspec run` plans it, run under the calibration controller on one engine in this
process; every arm's estimate comes back, nothing is written."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from batchspec import preflight
from batchspec.calibrate import CalibrationSettings, Decision, WorkerState
from batchspec.config.run import RunConfig
from batchspec.engine.factory import create_engine
from batchspec.group import read_shards, shard_ids
from batchspec.models import loading
from batchspec.parse import ParsedRow, RowDefaults, parse_rows
from batchspec.pipeline import ensure_ray
from batchspec.plan import make_plan, plan_locally
from batchspec.prior import WHY as PRIOR_WHY
from batchspec.read import open_input
from batchspec.shard import ShardInput, run_shard
from batchspec.stats import to_columns


@dataclass
class KeyCalibration:
    shard_key: str | None
    rows: int  # rows of this key in the input
    sampled: int  # rows calibration ran: its first shard's rows that can run
    decision: Decision | None  # None: none of the sampled rows can run
    failing_rows: int = 0  # sampled rows that will be error rows (batchspec.parse)
    first_failure: str | None = None  # "<id>: <error>" of the first

    def to_doc(self) -> dict:
        head = {"shard_key": self.shard_key, "rows": self.rows, "sampled": self.sampled,
                "failing_rows": self.failing_rows, "first_failure": self.first_failure}
        d = self.decision
        if d is None:
            return {**head, "chosen": None, "arms": [], "events": []}
        return {
            **head,
            "chosen": d.chosen.label, "spec_method": d.chosen.method, "draft_len": d.chosen.draft_len,
            "ended": d.ended.label, "reason": d.reason, "calibration_s": d.calibration_s, "overhead_s": d.profile_s,
            "predicted_speedup": d.predicted_speedup, "speedup": d.speedup,
            "baseline_tokens_per_s": d.baseline_tokens_per_s, "arms": [to_columns(a) for a in d.arms],
            "events": [dataclasses.asdict(e) for e in d.events],
        }


@dataclass(frozen=True)
class KeySample:
    shard_key: str | None
    rows: int  # rows of this key in the input
    parsed: list[ParsedRow]  # its first shard's rows: the key's first --shard-size rows, in input order


def calibration_samples(config: RunConfig, defaults: RowDefaults | None = None) -> list[KeySample]:
    """Per shard key, in plan order, its row count and its first shard's rows. The plan is
    `batchspec run`'s (with Ray Data for large inputs: per-shard records, never keys or rows, on
    the driver); each key's first shard is read from the input, stopping once it is complete."""
    source = open_input(config.input, dict(config.storage_options), config.shard_by)
    if not plan_locally(source):
        ensure_ray(config)
    plan = make_plan(source, config.shard_by, config.shard_size)
    first: dict[str | None, int] = {}  # key -> ordinal of its first shard
    rows: dict[str | None, int] = {}
    for n, s in enumerate(plan.shards):
        first.setdefault(s.shard_key, n)
        rows[s.shard_key] = rows.get(s.shard_key, 0) + s.rows
    tables = read_shards(source, plan, list(first.values()))
    defaults = defaults or preflight.row_defaults(config)
    return [KeySample(key, rows[key], parse_rows(tables[n], shard_ids(tables[n]), defaults)) for key, n in first.items()]


def calibrate_only(config: RunConfig) -> list[KeyCalibration]:
    """Each key's first shard under the controller: over a fixed `--spec FILE` arm too (it against none)."""
    job = dataclasses.replace(preflight.prepare(config), calibrate=True)
    config, arms = job.config, job.arms
    seeds = job.prior().seeds
    samples = calibration_samples(config, job.defaults)
    with loading(config.model):
        engine = create_engine(config.engine, config.model, config.draft_model, config.dtype, config.device,
                               llm_options=job.llm_options)
    settings = CalibrationSettings(**dict(config.calibration))
    worker = WorkerState()  # one engine: one cost table for every key
    results = []
    try:
        for sample in samples:
            key = sample.shard_key
            requests = [p.request for p in sample.parsed if p.error is None]
            failing = [p for p in sample.parsed if p.error is not None]
            first = f"{failing[0].request.id}: {failing[0].error}" if failing else None
            decision = None
            if requests:  # a key none of whose sampled rows can run is reported, and the others calibrate
                decision = run_shard(engine, ShardInput(str(key), key, requests), arms, True, config.batch_size, settings,
                                     seeds.get(key), worker=worker, prior_why=PRIOR_WHY).decision
            results.append(KeyCalibration(key, sample.rows, len(requests), decision, len(failing), first))
    finally:
        engine.close()
    return results
