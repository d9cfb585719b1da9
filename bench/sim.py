"""The calibration simulator: per-shard decisions against the exact oracle, in virtual time.

A model's plain greedy outputs over the input are recorded once (cached), then every shard is
replayed on a cost regime (batchspec/sim/regimes.py) by the torch engine's own decode loop
(batchspec/sim/replay.py): real tokens, real acceptance, batching, admission and draining,
every second priced by the regime. So the oracle is exact (every arm run over the whole shard)
and a decision's ratio to it is deterministic. Per shard it reports the arm the pipeline ran
(`shard.run_shard`, the product's own path, one worker's calibration state across a run's
shards), the oracle's arm, both goodputs and their ratio, plain decoding's, the predicted speedup,
calibration's overhead in virtual time, and what the changes of arm in its drain cost it
(`drain_loss`: the shard run again holding the arm its drain began under); per run, the worker's
cost profile (paid once by the job, by no shard), the best single static arm for the whole job
(one option file) and the best batch-size schedule written by hand (one draft length per number of
rows in flight, the same for every key), and what share of the oracle's gain over each the
calibration captured. All figures are SIMULATED, never measurements.

    python bench/sim.py --input examples/prompts.parquet --shard-by task --regime gpu-roofline \\
        --batch-size 8 [--rows 256] [--model smollm2-135m] [--max-tokens 128] [--eagle3 HEAD] --json OUT.json

The tuning grid docs/calibration.md shows runs on `python examples/make_prompts.py --rows-per-task
256 --out grid.parquet` (its command is in docs/performance.md); the held-out protocol on
`python bench/heldout.py --out heldout.parquet`, workloads the rule was not tuned on
(`make bench-sim-heldout`).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import itertools
import json
import pickle
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from common import results as recorded_results  # noqa: E402

from batchspec.calibrate import CalibrationSettings, WorkerState  # noqa: E402
from batchspec.engine.base import NO_SPEC, Request, SamplingParams, SpecConfig  # noqa: E402
from batchspec.sim.regimes import REGIMES, regime as regime_named  # noqa: E402
from batchspec.sim.replay import Recorded, ReplayEngine, record  # noqa: E402
from batchspec.prior import WHY as PRIOR_WHY, best_arms  # noqa: E402
from batchspec.shard import ShardInput, run_shard  # noqa: E402

CACHE = Path.home() / ".cache" / "batchspec" / "sim"
SWITCH = "switch"  # the shard that changes workload half-way (--switch A,B)


@dataclass(frozen=True)
class Shard:
    key: str
    requests: list[Request]


def load_requests(path: str, shard_by: str, rows: int, max_tokens: int, prompt_format: str,
                  switch: tuple[str, str] | None, repeat: int = 1) -> list[Shard]:
    """The input's rows by shard key, at most `rows` each, plus a shard of `rows` rows whose first
    half is key A's and second half key B's (`switch`)."""
    import polars as pl

    frame = pl.read_parquet(path)
    params = SamplingParams(max_tokens=max_tokens)
    by_key: dict[str, list[Request]] = {}
    for i, row in enumerate(frame.iter_rows(named=True)):
        if row[shard_by] in (None, ""):  # a row of another table in the same file (bench/heldout.py)
            continue
        key = str(row[shard_by])
        rid = str(row.get("id", i))
        if row.get("messages"):
            messages = tuple({"role": m["role"], "content": m["content"]} for m in row["messages"])
        elif prompt_format == "chat":
            messages = ({"role": "user", "content": row["prompt"]},)
        else:
            messages = None
        request = Request(rid, messages=messages, params=params) if messages else Request(rid, prompt=row["prompt"], params=params)
        if len(by_key.setdefault(key, [])) < rows:
            by_key[key].append(request)
    if repeat > 1:  # each key's rows again, as a job many times larger would have them (same prompts, same outputs)
        by_key = {k: [replace(r, id=f"{r.id}#{n}") for n in range(repeat) for r in v] for k, v in by_key.items()}
    shards = [Shard(k, v) for k, v in sorted(by_key.items())]
    if switch:
        a, b = switch
        half = rows // 2
        shards.append(Shard(SWITCH, by_key[a][:half * repeat] + by_key[b][:half * repeat]))
    return shards


def recordings(args, shards: Sequence[Shard]):
    """The model's plain greedy outputs for every row (recorded once per input and settings: a run
    over some of an input's rows reads what an earlier run over them recorded), with the settings
    they depend on (`recording_settings`: an `OracleRuns` key holds them)."""
    from batchspec.engine.torch.engine import TorchEngine

    ids = sorted({r.id.split("#")[0] for s in shards for r in s.requests})
    settings = recording_settings(args)
    path = CACHE / f"{hashlib.sha256(json.dumps([*settings, ids]).encode()).hexdigest()[:16]}.pkl"
    every = CACHE / f"{hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:16]}-rows.pkl"  # every row recorded
    known = _Recordings(io.BytesIO(every.read_bytes())).load() if every.exists() else {}
    engine = TorchEngine.load(args.model, draft_model=args.draft_model, dtype=args.dtype, device="cpu")
    if path.exists() or all(i in known for i in ids):
        recorded = _Recordings(io.BytesIO(path.read_bytes())).load() if path.exists() else known
        if not all(i in known for i in recorded):
            every.parent.mkdir(parents=True, exist_ok=True)
            every.write_bytes(pickle.dumps({**known, **recorded}))
        return engine, _repeated(recorded, shards), settings
    by_text: dict = {}  # rows of one prompt have one greedy output: each prompt is decoded once
    for r in (r for s in shards for r in s.requests if "#" not in r.id or r.id.endswith("#0")):
        r = replace(r, id=r.id.split("#")[0])
        by_text.setdefault(json.dumps([r.prompt, r.messages, repr(r.params)]), []).append(r.id)
    first = {r.id.split("#")[0]: replace(r, id=r.id.split("#")[0]) for s in shards for r in s.requests}
    unique = [first[ids[0]] for ids in by_text.values()]
    began = time.perf_counter()
    once, _ = record(engine, unique, batch_size=32, draft_models=[args.draft_model] if args.draft_model else [],
                     heads=[args.eagle3] if args.eagle3 else [], head_k=max(args.eagle3_ks))
    recorded = {rid: once[ids[0]] for ids in by_text.values() if ids[0] in once for rid in ids}
    print(f"recorded {len(once)} prompts ({len(recorded)} rows) in {time.perf_counter() - began:.0f} s -> {path}",
          file=sys.stderr)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(recorded))
    every.write_bytes(pickle.dumps({**known, **recorded}))
    return engine, _repeated(recorded, shards), settings


def recording_settings(args) -> list:
    """What a recording depends on besides its rows."""
    settings = [args.input, args.model, args.draft_model, args.max_tokens, args.prompt_format, args.dtype]
    if args.eagle3:  # its chains, as deep as its deepest arm: another head (or its retrained weights) records anew
        settings += [args.eagle3, folder_digest(args.eagle3), max(args.eagle3_ks)]
    return settings


class OracleRuns:
    """Every arm's run over each shard (`run_arm`), kept in a file (`--oracle-runs`) and read back
    by a later run: the runs depend on the recording, the regime, the batch size, the shard's rows
    and the arm, never on the rule, so a variant of the rule is screened against the same oracles
    without running them again. Not for a recorded figure (`--record` runs its oracles)."""

    def __init__(self, path: str | None, settings: list) -> None:
        self.path = Path(path) if path else None
        self.settings = json.dumps(settings, default=str)  # the recording's (`recording_settings`)
        self.runs: dict = pickle.loads(self.path.read_bytes()) if self.path and self.path.exists() else {}

    def run(self, engine: "ReplayEngine", requests: list[Request], arm: SpecConfig, batch_size: int) -> dict:
        if self.path is None:
            return run_arm(engine, requests, arm, batch_size)
        key = (self.settings, repr(engine.regime), batch_size, tuple(r.id for r in requests), arm.label)
        if key not in self.runs:
            self.runs[key] = run_arm(engine, requests, arm, batch_size)
        return self.runs[key]

    def save(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_bytes(pickle.dumps(self.runs))


def folder_digest(folder: str) -> str:
    """A hash of the files in `folder` (their names and contents): an EAGLE-3 head's identity."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


class _Recordings(pickle.Unpickler):
    """A cached recording, its `Recorded` rows where the simulator keeps them now (recordings cached
    before the simulator had a package of its own name the engine's)."""

    MOVED = {"batchspec.engine.replay": "batchspec.sim.replay"}

    def find_class(self, module: str, name: str):
        return super().find_class(self.MOVED.get(module, module), name)


def _repeated(recorded: dict[str, Recorded], shards: Sequence[Shard]) -> dict[str, Recorded]:
    """Every request id's recording, a repeated row (`id#n`) its original's."""
    return {r.id: recorded[r.id.split("#")[0]] for s in shards for r in s.requests if r.id.split("#")[0] in recorded}


def arms_of(args) -> list[SpecConfig]:
    arms = [SpecConfig("ngram", k) for k in args.ngram] + [SpecConfig("suffix", k) for k in args.suffix]
    if args.draft_model:
        arms += [SpecConfig("draft_target", k, draft_model=args.draft_model) for k in args.draft]
    if args.eagle3:
        arms += [SpecConfig("eagle3", k, draft_model=args.eagle3) for k in args.eagle3_ks]
    return arms


_SCOPES = itertools.count()


def goodput(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


def decode_tokens(completions) -> int:
    return sum(max(c.output_tokens - 1, 0) for c in completions)


def run_arm(engine: ReplayEngine, requests: list[Request], arm: SpecConfig, batch_size: int) -> dict:
    if arm.method == "suffix":  # the oracle's suffix run drafts from a tree of its own, empty at the start
        scope = f"oracle:{arm.label}:{next(_SCOPES)}"
        requests = [replace(r, draft_scope=scope) for r in requests]
    result = engine.generate(requests, arm, batch_size)
    return {"tokens": result.decode_tokens, "decode_s": result.timing.decode_s}


def simulate(args, engine, recorded: dict[str, Recorded], shards: Sequence[Shard], regime_name: str,
             batch_size: int, oracle_runs: OracleRuns, seeds: dict | None = None) -> dict:
    """One pass of the job on one fresh worker; `oracle_runs` runs (or reads back) every arm over
    each shard; `seeds`: each key's starting arm from a prior pass (batchspec.prior, as
    `--prior-run` gives the driver). The shards' stats come back under "_stats", and whether the
    replay's arm switch is a build under "_builds" (not JSON: the caller takes them out)."""
    replay = Traced(engine, recorded, regime_named(regime_name))
    # a schedule drafts by the rows in flight within one engine: its changes of arm build nothing
    one_engine = ReplayEngine(engine, recorded, replace(replay.regime, build_s=0.0))
    arms = arms_of(args)
    by_label = {a.label: a for a in [NO_SPEC, *arms]}
    settings = CalibrationSettings()
    worker = WorkerState()
    out, runs, shard_requests, stats_of = [], [], [], []
    for shard in shards:
        requests = [r for r in shard.requests if r.id in recorded]
        for part in range(args.shards_per_key):
            rows = requests[part * len(requests) // args.shards_per_key: (part + 1) * len(requests) // args.shards_per_key]
            horizon = len(requests) - (part + 1) * len(requests) // args.shards_per_key
            ran = run_shard(replay, ShardInput(f"{shard.key}-{part}", shard.key, rows), arms, True, batch_size,
                            settings, (seeds or {}).get(shard.key), worker=worker, horizon_rows=horizon, prior_why=PRIOR_WHY)
            stats_of.append(ran.stats)
            drain = drain_loss(replay, rows, by_label[ran.stats.events[0].arm], batch_size, ran.stats.decode_s)
            # every arm over the same shard, one generate call as the pipeline runs it: the job's static
            # arms and schedules run shard by shard too (each drains its batch at the shard's end)
            whole = {a.label: oracle_runs.run(replay, rows, a, batch_size) for a in [NO_SPEC, *arms]}
            runs.append(whole)
            shard_requests.append(rows)
            oracle = {label: goodput(**_tokens_s(r)) for label, r in whole.items()}
            best = max(oracle, key=oracle.get)
            # the worker's cost profile is the worker's (stats.profile_s): the job pays it once, no shard does
            stats, overhead_s = ran.stats, ran.stats.build_s
            tokens = decode_tokens(ran.completions)
            got = goodput(tokens, stats.decode_s + overhead_s)
            out.append({
                "shard": stats.shard_id, "key": shard.key, "rows": len(rows), "benched": part == args.shards_per_key - 1 or not args.bench_last,
                "ran": ran_arms(ran), "oracle": best, "goodput": got, "oracle_goodput": oracle[best],
                "plain_goodput": oracle["none"], "vs_oracle": got / oracle[best], "vs_plain": got / oracle["none"],
                "predicted_speedup": stats.predicted_speedup,
                "oracle_speedups": {a: g / oracle["none"] for a, g in oracle.items()},
                "overhead": overhead_s / (stats.decode_s + stats.prefill_s + overhead_s),
                "tokens": tokens, "seconds": stats.decode_s + overhead_s,
                "arm_s": {label: r["decode_s"] for label, r in whole.items()},
                "drain_loss": drain,
                "switches": sum(e.kind in ("switch", "measure") or (e.kind == "measured" and "back to" in e.reason)
                                for e in stats.events),
                "events": [f"{e.row}:{e.kind}:{e.arm}" for e in stats.events if e.kind != "profile"],
            })
    return {"regime": regime_name, "batch_size": batch_size, "shards": out, "_stats": stats_of,
            "_builds": replay.arms_are_builds,
            "job": job_summary(out, runs, arms, batch_size, replay.regime.build_s, worker.profile_s,
                               None if args.no_schedule else lambda schedule: sum(scheduled_s(one_engine, requests, {n: by_label[a] for n, a in schedule.items()},
                                                                batch_size) for requests in shard_requests))}


class Traced(ReplayEngine):
    """The replay engine, keeping what its last generate call's control returned at each call
    (`calls`: whether the batch was full or rows queued then, and the arm returned), so the call can
    be run again holding the arm its drain began under (`drain_loss`)."""

    def generate(self, requests, spec, batch_size, control=None):
        self.calls: list[tuple[bool, SpecConfig | None]] = []
        if control is None:
            return super().generate(requests, spec, batch_size)
        calls = self.calls

        def traced(progress):
            arm = control(progress)
            calls.append((bool(progress.queued) or len(progress.in_flight) >= batch_size, arm))
            return arm

        return super().generate(requests, spec, batch_size, control=traced)


@dataclass
class Following:
    """A control that returns what a traced call's control returned, call by call, until call
    `cut` (the drain's first change of arm), and holds the arm from there on."""

    calls: list
    cut: int
    at: int = 0

    def __call__(self, progress) -> SpecConfig | None:
        self.at += 1
        return self.calls[self.at - 1][1] if self.at - 1 < self.cut else None


def drain_loss(engine: "Traced", requests: list[Request], start: SpecConfig, batch_size: int, decode_s: float) -> float:
    """What the changes of arm a shard's drain made (switches and measurements once no row is
    queued and the batch is no longer full) cost it: its decode seconds over those of the same call
    holding the arm the drain began under, less 1 (negative: they paid). 0 where the drain changed
    nothing, or the shard never filled its batch (it is all drain)."""
    calls = engine.calls
    full = [i for i, (steady, _) in enumerate(calls) if steady]
    cut = next((i for i, (steady, arm) in enumerate(calls) if not steady and arm is not None and full and i > full[-1]), None)
    if cut is None:
        return 0.0
    held = ReplayEngine.generate(engine, requests, start, batch_size, control=Following(calls, cut))
    return decode_s / held.timing.decode_s - 1


def scheduled_s(engine: ReplayEngine, requests: list[Request], schedule: dict[int, SpecConfig], batch_size: int) -> float:
    """Decode seconds of a shard under a batch-size schedule, replayed (`Scheduled`)."""
    control = Scheduled(schedule, batch_size)
    return engine.generate(requests, control.arm_at(min(batch_size, len(requests))), batch_size, control=control).timing.decode_s


@dataclass
class Scheduled:
    """A generate call's control (engine.base.Control) that runs each step under the arm at the
    largest threshold <= the rows it runs (the rows in flight and queued, at most a batch),
    switched between steps as TensorRT-LLM's draft_len_schedule switches within one engine."""

    schedule: dict[int, SpecConfig]
    batch_size: int

    def arm_at(self, rows: int) -> SpecConfig:
        return self.schedule[max((k for k in self.schedule if k <= rows), default=min(self.schedule))]

    def __call__(self, progress) -> SpecConfig | None:
        rows = min(self.batch_size, len(progress.in_flight) + progress.queued)
        return self.arm_at(rows) if rows else None


def predictions(shards: Sequence[dict], share: float = 0.95, tolerance: float = 0.05) -> tuple[int, int]:
    """(shards judged, of them predicted within `tolerance`): a shard is judged where one speculative
    arm ran at least `share` of its rows, its predicted speedup set beside that arm's simulated
    speedup over the same shard (the recordings are greedy: acceptance is exact)."""
    judged = within = 0
    for s in shards:
        arm = max(s["ran"], key=s["ran"].get)
        if arm != "none" and s["ran"][arm] >= share * s["rows"] and s["predicted_speedup"]:
            judged += 1
            within += abs(s["predicted_speedup"] / s["oracle_speedups"][arm] - 1) <= tolerance
    return judged, within


def held_out_metrics(shards: Sequence[dict], batch_size: int) -> dict:
    """The held-out protocol's figures beyond the grid's (docs/simulator.md's table): the worst and
    the mean of the shards of two batches or more, the held-out target's (a smaller shard is all
    drain; None: there is none), the shards and their rows, and the worst shard, of those where
    there is one, else of all, as `ID VS_ORACLE (ARM ROWS, ...; ORACLE)`; and over the same shards
    the best worst shard any one arm gets, chosen in hindsight (`one_arm`): where no shard repays
    a build, a worker runs one engine, and no rule does better than that arm; and the longest any
    shard decodes under any arm (`longest_shard_s`, virtual seconds): under the regime's build
    seconds, no shard repays one."""
    large = [s for s in shards if s["rows"] >= 2 * batch_size]
    worst = min(large or shards, key=lambda s: s["vs_oracle"])
    ran = ", ".join(f"{a} {n}" for a, n in worst["ran"].items())
    one_arm = {a: min(s["oracle_speedups"][a] / max(s["oracle_speedups"].values()) for s in large or shards)
               for a in worst["oracle_speedups"]}
    best = max(one_arm, key=one_arm.get)
    return {"min_vs_oracle_2_batches": round(worst["vs_oracle"], 3) if large else None,
            "one_arm": best, "one_arm_min_vs_oracle": round(one_arm[best], 3),
            "longest_shard_s": round(max(max(s["arm_s"].values()) for s in shards), 1),
            "shards": len(shards), "min_rows": min(s["rows"] for s in shards), "max_rows": max(s["rows"] for s in shards),
            "mean_vs_oracle_2_batches": round(sum(s["vs_oracle"] for s in large) / len(large), 3) if large else None,
            "worst_shard": f"{worst['shard']} {worst['vs_oracle']:.3f} ({ran}; {worst['oracle']})"}


def _tokens_s(run: dict) -> dict:
    return {"tokens": run["tokens"], "seconds": run["decode_s"]}


def ran_arms(ran) -> dict[str, int]:
    counts: dict[str, int] = {}
    for spec in ran.row_specs:
        counts[spec.label] = counts.get(spec.label, 0) + 1
    return counts


def build_oracle_s(shards: Sequence[dict], build_s: float) -> float:
    """The job's seconds under the best sequence of engines in hindsight where an arm is a build:
    one worker runs the shards in order, its first engine free (it builds one either way), each
    other change of arm `build_s`, changes between shards only (the per-shard oracle pays no build)."""
    best: dict[str, float] = {}
    for shard in shards:
        arm_s = shard["arm_s"]
        best = {a: s + (min([best[a]] + [b + build_s for b in best.values()]) if best else 0.0) for a, s in arm_s.items()}
    return min(best.values()) if best else 0.0


def job_summary(shards: list[dict], runs: list[dict], arms: Sequence[SpecConfig], batch_size: int,
                build_s: float, profile_s: float, replayed_s) -> dict:
    """The job against what a user configures by hand: one static arm for every shard, and a
    batch-size schedule (rows in flight -> arm, the same for every key), each the best of its kind
    in hindsight; where an arm is a build, also against the job's oracle that pays its builds
    (`build_oracle_s`). Without `replayed_s` (--no-schedule) no schedule is searched. The calibrated job pays the worker's cost profile (`profile_s`) once. `runs` holds every arm's run over each shard (label -> tokens and decode
    seconds), shard by shard as the pipeline runs them; `replayed_s(schedule)` is the job's decode
    seconds under a schedule, replayed shard by shard (`Scheduled`). The schedule is searched from the best static arm one bucket at a time,
    smallest first: every arm at the bucket replayed, the fastest kept. (Pricing each arm at each
    number of rows from its own whole-shard run was tried first and ranked schedules falsely, by
    up to 3%: the rows an arm holds in its drain are not plain decoding's.)"""

    labels = ["none", *[a.label for a in arms]]
    tokens = sum(r["none"]["tokens"] for r in runs)
    static = {a: goodput(tokens, sum(r[a]["decode_s"] for r in runs)) for a in labels}
    best_static = max(static, key=static.get)
    oracle = goodput(tokens, sum(min(r[a]["decode_s"] for a in labels) for r in runs))
    calibrated = goodput(sum(s["tokens"] for s in shards), sum(s["seconds"] for s in shards) + profile_s)
    buckets = sorted({1, max(1, batch_size // 4), max(1, batch_size // 2), batch_size})
    schedules = {(a,) * len(buckets): g for a, g in static.items()}  # one arm everywhere: its own run
    best = (best_static,) * len(buckets)
    for i in range(len(buckets) if replayed_s else 0):
        for label in labels:
            choice = best[:i] + (label,) + best[i + 1:]
            if choice not in schedules:
                schedules[choice] = goodput(tokens, replayed_s(dict(zip(buckets, choice))))
        best = max((best[:i] + (label,) + best[i + 1:] for label in labels), key=schedules.get)
    best_schedule = max(schedules, key=schedules.get)
    gain = oracle - static[best_static]
    return {
        "static_best": best_static, "static_goodput": static[best_static], "oracle_goodput": oracle,
        "schedule_best": dict(zip(buckets, best_schedule)), "schedule_goodput": schedules[best_schedule],
        "calibrated_goodput": calibrated, "vs_oracle": calibrated / oracle, "worker_profile_s": profile_s,
        "captured_of_oracle_gain_over_static": (calibrated - static[best_static]) / gain if gain > 0 else None,
        "vs_static": calibrated / static[best_static], "vs_schedule": calibrated / schedules[best_schedule],
        **({"vs_oracle_with_builds": calibrated / goodput(tokens, build_oracle_s(shards, build_s)),
            "build_share": build_s * sum(s["switches"] for s in shards) / sum(s["seconds"] for s in shards)} if build_s else {}),
    }


def table(results: Sequence[dict]) -> str:
    lines = ["| regime | batch | shard | ran (rows) | oracle | vs oracle | vs plain | predicted | overhead | drain loss | events |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for s in (x for x in r["shards"] if x["benched"]):
            ran = ", ".join(f"{a} {n}" for a, n in s["ran"].items())
            pred = f"{s['predicted_speedup']:.2f}x" if s["predicted_speedup"] else "-"
            lines.append(f"| {r['regime']} | {r['batch_size']} | {s['shard']} | {ran} | {s['oracle']} | "
                         f"{s['vs_oracle']:.3f} | {s['vs_plain']:.3f} | {pred} | {s['overhead']:.1%} | {s['drain_loss']:+.1%} | "
                         f"{' '.join(s['events'][:6])} |")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True, help="prompt Parquet (a `prompt` column)")
    p.add_argument("--shard-by", required=True, help="the column whose values are shard keys")
    p.add_argument("--regime", default="gpu-roofline", help=f"comma-separated: {', '.join(REGIMES)}")
    p.add_argument("--batch-size", default="8", help="comma-separated batch sizes")
    p.add_argument("--rows", type=int, default=256, help="rows per shard key")
    p.add_argument("--shards-per-key", type=int, default=1, help="a key's rows split into this many shards, run in order")
    p.add_argument("--repeat", type=int, default=1, help="each key's rows this many times (a larger job of the same prompts)")
    p.add_argument("--bench-last", action="store_true", help="report only each key's last shard")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--draft-model", default=None)
    p.add_argument("--ngram", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4, 6, 8], help="n-gram draft lengths")
    p.add_argument("--draft", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4], help="draft-model draft lengths")
    p.add_argument("--eagle3", default=None, metavar="FOLDER",
                   help="an EAGLE-3 head in the released format: its chains are recorded and it joins the arms")
    p.add_argument("--eagle3-ks", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4], help="EAGLE-3 draft lengths")
    p.add_argument("--suffix", type=lambda s: [int(x) for x in s.split(",") if x], default=[],
                   help="suffix-drafting draft-length caps (the arm drafts from the key's earlier rows)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompt-format", choices=("chat", "raw"), default="chat")
    p.add_argument("--dtype", default="float32",
                   help="the recording's dtype (tokens only; time is the regime's): float32, as a bfloat16 recording's "
                        "tokens depend on the CPU's kernels (docs/simulator.md)")
    p.add_argument("--switch", default="prose,edit", help="KEY_A,KEY_B: add a shard that changes from A to B half-way ('' for none)")
    p.add_argument("--prior-pass", action="store_true",
                   help="run each job again on a fresh worker, each key's first shard starting where the first pass "
                        "predicted best (as --prior-run does); reported as regime NAME+prior")
    p.add_argument("--no-schedule", action="store_true", help="search no batch-size schedule (its replays take most of a "
                   "large job's time): vs_schedule is then the best static arm's")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--oracle-runs", default=None, metavar="FILE",
                   help="keep every arm's run over each shard in FILE and read it back on a later run: screens a "
                   "change to the rule against the same oracles (not with --record)")
    recorded_results.add_options(p)
    return p


def main(argv: Sequence[str] | None = None) -> list[dict]:
    p = parser()
    args = p.parse_args(argv)
    if args.oracle_runs and args.record:
        p.error("--oracle-runs screens a change; a recorded figure runs its oracles (drop one of them)")
    switch = tuple(args.switch.split(",")) if args.switch else None
    shards = load_requests(args.input, args.shard_by, args.rows, args.max_tokens, args.prompt_format, switch, args.repeat)
    engine, recorded, settings = recordings(args, shards)
    oracle = OracleRuns(args.oracle_runs, settings)
    results = []
    for name in args.regime.split(","):
        for batch in (int(b) for b in args.batch_size.split(",")):
            first = simulate(args, engine, recorded, shards, name, batch, oracle)
            stats, builds = first.pop("_stats"), first.pop("_builds")
            results.append(first)
            if args.prior_pass:  # the job again, as the next night's run with --prior-run of this one
                seeds = best_arms(stats, stats[0].engine, stats[0].model, batch, arms_of(args), one_engine=builds)
                second = simulate(args, engine, recorded, shards, name, batch, oracle, seeds)
                second.pop("_stats"), second.pop("_builds")
                results.append({**second, "regime": f"{name}+prior"})
    oracle.save()
    print("SIMULATED (virtual time on cost regimes; not measurements)")
    print(table(results))
    for r in results:
        print(f"{r['regime']} b{r['batch_size']} job: {json.dumps(r['job'])}")
    if args.json:
        Path(args.json).write_text(json.dumps({"simulated": True, "args": vars(args), "results": results}, indent=1))
    for r in results:
        shards = r["shards"]
        judged, within = predictions(shards)
        metrics = {"simulated": True, "min_vs_oracle": round(min(s["vs_oracle"] for s in shards), 3),
                   "mean_vs_oracle": round(sum(s["vs_oracle"] for s in shards) / len(shards), 3),
                   "max_overhead": round(max(s["overhead"] for s in shards), 4),
                   "max_drain_loss": round(max(s["drain_loss"] for s in shards), 4),
                   **held_out_metrics(shards, r["batch_size"]),
                   "predictions_judged": judged, "predictions_within_5pct": within,
                   **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r["job"].items() if k != "schedule_best"}}
        one = argparse.Namespace(**{**vars(args), "regime": r["regime"], "batch_size": r["batch_size"]})
        recorded_results.record("sim", "bench/sim.py", one, argv, metrics)
    return results


if __name__ == "__main__":
    main()
