"""Calibrate a Parquet input without generating it: what `batchspec calibrate` runs.

Reads the input the way a run does (same reader, same per-row parsing and defaults), groups rows
by the shard-by column, and runs `calibrate.calibrate` on the first shard-size rows of each key
with one engine in this process. Nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby

from batchspec.calibrate import CalibrationSettings, Decision, calibrate
from batchspec.engine.factory import create_engine
from batchspec.errors import InputError
from batchspec.pipeline import check_engine, resolve_arms
from batchspec.pipeline_config import RunConfig
from batchspec.read import RowDefaults, open_input, parse_rows, read_rows, scan_keys


@dataclass
class KeyCalibration:
    shard_key: str | None
    rows: int  # rows of this key in the input
    sampled: int  # rows calibration drew its sample from
    decision: Decision

    def to_doc(self) -> dict:
        d = self.decision
        return {
            "shard_key": self.shard_key, "rows": self.rows, "sampled": self.sampled,
            "chosen": d.chosen.label, "spec_method": d.chosen.method, "draft_len": d.chosen.draft_len,
            "reason": d.reason, "calibration_s": d.calibration_s, "overhead_s": d.overhead_s, "capped": d.capped,
            "baseline_tokens_per_s": d.baseline_tokens_per_s, "arms": [a.to_struct() for a in d.arms],
        }


def calibrate_input(config: RunConfig) -> list[KeyCalibration]:
    check_engine(config.engine)
    arms, _ = resolve_arms(config)
    storage = dict(config.storage_options)
    source = open_input(config.input, storage, config.shard_by)
    keys = scan_keys(source, config.shard_by)
    defaults = RowDefaults(config.max_tokens, config.temperature, config.top_p, config.seed)
    order = sorted(range(len(keys.ids)), key=lambda i: (keys.keys[i] is None, keys.keys[i] or ""))
    groups = [(key, list(rows)) for key, rows in groupby(order, key=lambda i: keys.keys[i])]
    engine = create_engine(config.engine, config.model, config.draft_model, config.dtype, config.device)
    settings = CalibrationSettings(**dict(config.calibration))
    results = []
    try:
        for key, rows in groups:
            picked = rows[: config.shard_size]
            requests = []
            for file_index in sorted({keys.file_index[i] for i in picked}):
                mine = [i for i in picked if keys.file_index[i] == file_index]
                table = read_rows(source, file_index, [keys.row_index[i] for i in mine])
                parsed = parse_rows(table, [keys.ids[i] for i in mine], defaults)
                requests += [p.request for p in parsed if p.error is None]
            if not requests:
                raise InputError(f"shard key {key!r}: none of its first {len(picked)} rows can run (all are error rows)")
            decision = calibrate(engine, requests, [a for a in arms if a.method != "none"], config.batch_size,
                                 settings, shard_id=str(key), expected_rows=len(rows))
            results.append(KeyCalibration(key, len(rows), len(requests), decision))
    finally:
        engine.close()
    return results
