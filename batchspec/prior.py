"""A previous run's choices as this run's starting points (`prior_run`: a run's OUTPUT).

A scheduled job meets the same shard keys night after night. Its first shard of a key otherwise
starts under whatever its worker last ran (or, where an arm is an engine build, the longest n-gram
draft whose verify at the batch stays memory-bound, else plain decoding), and learns from there. With a prior run, each key's first shard starts under the arm that
run predicted best for the key: the highest predicted speedup over plain decoding, weighted by the
rows of the key's calibrated shards (`ArmResult.predicted_speedup`), plain decoding where none is
predicted above 1. Only shards of the same engine, model and batch size count (an arm's speedup
depends on all three), and only arms this run calibrates over. It is a start, not a decision: the
rule goes on from it as from any other (docs/calibration.md, concept 7), and where an arm is a
build it picks only a worker's first engine, which runs every key the worker meets: there every
key's arm is the job's, weighted by the rows of all its keys.

A nightly job names its prior run with the template of its OUTPUT (`prior_run:
s3://bucket/runs/{date}`): a templated `prior_run` is the newest earlier run it names, the run
date's day before first, back LOOKBACK_DAYS days (a night that failed or did not run is skipped).
None found (a job's first night) is a cold start, said in the run's summary, not an error; an
untemplated path without a run's stats is refused in one line.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Sequence

from batchspec.engine.base import NO_SPEC, SpecConfig, spec_label
from batchspec.engine.factory import arms_are_builds
from batchspec.errors import ConfigError, OutputError, one_line
from batchspec.stats import ShardStats
from batchspec.write import Output, resolve_template

if TYPE_CHECKING:
    from batchspec.config.run import RunConfig

WHY = "the prior run's best for the key (for the job, where an arm is a build)"  # an event's reason
LOOKBACK_DAYS = 31  # how far back a templated prior_run looks for an earlier run
JOB = object()  # best_arms' score of every key at once (one_engine)


@dataclass(frozen=True)
class Prior:
    """What a run starts from: each shard key's starting arm, and one line for the run's summary
    (the run read, or why none was); empty without `prior_run` or calibration."""

    seeds: dict[str | None, SpecConfig] = field(default_factory=dict)
    note: str | None = None
    url: str | None = None  # the run read (its trained heads are this run's too: batchspec.heads)


def prior_of(config: "RunConfig", arms: Sequence[SpecConfig], calibrate: bool) -> Prior:
    """The prior of `config.prior_run`, read and checked before any worker starts (`batchspec
    run`, `batchspec calibrate`, the Ray Data stage)."""
    if not (config.prior_run and calibrate):
        return Prior()
    options = dict(config.storage_options)
    url = find_prior(config.prior_run, options, config.date())
    if url is None:
        return Prior(note=f"none: no run of {config.prior_run} in the {LOOKBACK_DAYS} days before this one (a cold start)")
    return Prior(prior_seeds(url, options, config.engine, config.model, config.batch_size, arms), url, url)


def find_prior(prior_run: str, storage_options: dict, run_date: dt.date) -> str | None:
    """`prior_run` itself where it has no template field; else the newest run it names before
    `run_date` (a path with committed shards), None where there is none within LOOKBACK_DAYS."""
    try:
        own = resolve_template(prior_run, run_date)
    except ConfigError as exc:
        raise ConfigError(f"prior_run: {exc}") from None
    if own == prior_run:
        return prior_run
    seen = {own}
    for back in range(1, LOOKBACK_DAYS + 1):
        url = resolve_template(prior_run, run_date - dt.timedelta(days=back))
        if url in seen:
            continue
        seen.add(url)
        try:
            if Output(url, tuple(storage_options.items())).committed():
                return url
        except OutputError as exc:
            raise ConfigError(f"prior_run: {one_line(exc)}") from None
        except Exception as exc:
            raise ConfigError(f"prior_run: cannot list {url}: {one_line(exc)}") from None
    return None


def prior_seeds(url: str, storage_options: dict, engine: str, model: str, batch_size: int,
                arms: Sequence[SpecConfig]) -> dict[str | None, SpecConfig]:
    """Each shard key's starting arm from the run at `url` (`best_arms` over its committed shards'
    stats, read as the run wrote them: `write.Output`); ConfigError (one line) where `url` holds no
    run's stats."""
    output = Output(url, tuple(storage_options.items()))
    try:
        stats = output.read_stats(sorted(output.committed()))
    except Exception as exc:
        raise ConfigError(f"prior_run: cannot read the stats of {url}: {one_line(exc)}") from None
    if not stats:
        raise ConfigError(f"prior_run: {url} has no stats/*.parquet (expected the OUTPUT of a batchspec run)")
    return best_arms(stats, engine, model, batch_size, arms, one_engine=arms_are_builds(engine))


def best_arms(stats: Iterable[ShardStats], engine: str, model: str, batch_size: int,
              arms: Sequence[SpecConfig], one_engine: bool = False) -> dict[str | None, SpecConfig]:
    """Per shard key, the arm among `arms` (or plain decoding) with the highest rows-weighted
    predicted speedup over the key's calibrated shards of this engine, model and batch size.
    With `one_engine` (an engine whose arm switch is a build: the prior picks only a worker's
    first engine, and that engine runs every key the worker meets), every key's arm is the job's:
    weighted by the rows of all its keys, not by whichever key a worker happens to meet first."""
    by_label = {a.label: a for a in arms if a.method != "none"}
    score: dict[str | None, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    keys = []
    for s in stats:
        if s.decision_source != "calibrated" or (s.engine, s.model, s.batch_size) != (engine, model, batch_size):
            continue
        rows = max(s.rows - s.error_rows, 0)
        keys.append(s.shard_key)
        for arm in s.candidates:
            label = spec_label(arm.method, arm.draft_len)
            if arm.predicted_speedup is not None and label in by_label and rows:
                held = score[JOB if one_engine else s.shard_key][label]
                held[0] += rows * arm.predicted_speedup
                held[1] += rows
    out: dict[str | None, SpecConfig] = {}
    for key, arms_score in score.items():
        label, (total, rows) = max(arms_score.items(), key=lambda item: item[1][0] / item[1][1])
        out[key] = by_label[label] if total / rows > 1.0 else NO_SPEC
    return {key: out[JOB] for key in keys} if one_engine and JOB in out else out
