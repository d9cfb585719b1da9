"""GPU check for the TensorRT-LLM engine (and, with --engine torch, the torch engine): the one
command for the first GPU node. It writes one JSON (--out, default gpu_check.json) a person with
a GPU sends back; docs/engines/trtllm.md says how to read it.

On a TensorRT-LLM 1.2 node with one GPU it records, within --budget-s (600 s: no phase starts after
80% of it):

1. `import tensorrt_llm`: version and seconds; the device;
2. each shipped TensorRT-LLM option file (trt_configs/*.yaml; those only the torch engine runs, as
   suffix.yaml, are listed as skipped): loaded as `trtllm-serve --config` loads it, then built
   through batchspec's adapter at batch 1, 8 and 32, one LLM at a time: each build's seconds and
   the seconds its wait for the last LLM's GPU memory took (the memory is back before it starts);
3. per arm and batch size: tokens/s, acceptance, whether greedy outputs equal the plain run's
   (required at batch 1; counted at larger batches, where in-flight batching may change greedy
   outputs slightly), and how the iteration stats were read (reads, seconds waited, entries,
   iterations missing, share of iterations that ran a full batch while rows remained);
4. a calibrated 512-row job (every arm a candidate, batch 32, the controller choosing) against the
   same rows under the best static arm of step 3 at batch 32.

On a node of several GPUs (or --gpus N) it then runs a short pipeline on a local Ray cluster whose
one worker holds N GPUs and runs one LLM across them. Exit status: 0 every check passed; 1 one
failed (the JSON's "failures" says which); 2 tensorrt_llm is missing (one line on stderr, and the
JSON says so).

    make gpu-check
    python jobs/gpu_check.py --model meta-llama/Llama-3.1-8B-Instruct --out /tmp/check.json
    python jobs/gpu_check.py --engine torch [--shape 1b --shape 8b]   # see jobs/gpu_torch_check.py

The shipped configs pair with Llama-3.1-8B-Instruct (eagle3.yaml's head and draft_target.yaml's
Llama-3.2-1B draft are made for it). Nothing in batchspec has run on real TensorRT-LLM before this.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "jobs"))

from batchspec.engine.base import NO_SPEC, GenerateResult, Request, SamplingParams  # noqa: E402
from batchspec.errors import BatchspecError, EngineUnavailable, one_line  # noqa: E402

PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Repeat this list exactly, one item per line: apples, pears, plums, cherries, figs.",
    'Extract the fields as JSON: "Order 1182 from Ada Lovelace, 3 items, total 42.50 EUR".',
    "Explain in three sentences why the sky is blue.",
    "Translate to French: The meeting is moved to Thursday at ten.",
    "List the first ten prime numbers, comma separated.",
    "Write a SQL query that counts orders per customer in a table orders(id, customer_id).",
    "Summarize the plot of Hamlet in two sentences.",
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=os.environ.get("BATCHSPEC_GPU_MODEL", "meta-llama/Llama-3.1-8B-Instruct"))
    parser.add_argument("--config", action="append", help="option file(s); default trt_configs/*.yaml")
    parser.add_argument("--base", default=str(ROOT / "trt_configs" / "none.yaml"), help="LLM options for the plain run")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--batch-sizes", default="1,8,32", help="comma separated; the first is where greedy must be equal")
    parser.add_argument("--rows", type=int, default=32, help="rows per arm and batch size")
    parser.add_argument("--calibrated-rows", type=int, default=512)
    parser.add_argument("--dtype", default="bfloat16", choices=("auto", "bfloat16", "float16", "float32"))
    parser.add_argument("--budget-s", type=float, default=600.0, help="no phase starts after 80%% of it")
    parser.add_argument("--out", default="gpu_check.json")
    parser.add_argument("--gpus", type=int, default=None,
                        help="GPUs of the multi-GPU worker check (default: every GPU of the node; 1 skips it)")
    return parser.parse_args(argv)


def rows(n: int, max_tokens: int, prefix: str = "r") -> list[Request]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return [Request(f"{prefix}{i}", prompt=PROMPTS[i % len(PROMPTS)] + ("" if i < len(PROMPTS) else f" (variant {i // len(PROMPTS)})"),
                    params=params) for i in range(n)]


def tokens_per_s(result: GenerateResult) -> float | None:
    return round(result.output_tokens / result.timing.wall_s, 2) if result.timing.wall_s > 0 else None


def full_batch_share(entries: list[dict], total: int, batch: int) -> float | None:
    """Of the iterations that ran while at least a batch of rows was unfinished, the share that
    scheduled a full batch (iteration stats: inflightBatchingStats.numScheduledRequests)."""
    finished, full, counted = 0, 0, 0
    for e in entries:
        if total - finished >= batch:
            counted += 1
            full += int((e.get("inflightBatchingStats") or {}).get("numScheduledRequests") or 0) >= batch
        finished += int(e.get("numCompletedRequests") or 0)
    return round(full / counted, 3) if counted else None


def check_loads(path: str, model: str) -> bool:
    """Load an option file as trtllm-serve --config does (TensorRT-LLM 1.2's llm_args.py
    update_llm_args_with_extra_dict, then TorchLlmArgs); say whether 1.2 also takes the
    DraftTarget spelling, which batchspec refuses (docs/engines/trtllm.md)."""
    import yaml
    from tensorrt_llm.llmapi.llm_args import TorchLlmArgs, update_llm_args_with_extra_dict

    data = yaml.safe_load(Path(path).read_text()) or {}
    try:
        TorchLlmArgs(**update_llm_args_with_extra_dict({"model": model}, data))
    except Exception as exc:
        print(f"{path}: FAIL trtllm-serve --config would refuse it: {' '.join(str(exc).split())[:300]}")
        return False
    print(f"{path}: loads as trtllm-serve --config loads it")
    spec = data.get("speculative_config") or {}
    if spec.get("decoding_type") == "Draft_Target":
        other = {**data, "speculative_config": {**spec, "decoding_type": "DraftTarget"}}
        try:
            TorchLlmArgs(**update_llm_args_with_extra_dict({"model": model}, other))
            print("  note: this TensorRT-LLM also takes decoding_type DraftTarget (batchspec accepts only Draft_Target)")
        except Exception:
            print("  DraftTarget spelling: refused, as batchspec assumes")
    return True


def run_arm(engine, spec, batch: int, requests: list[Request], plain: GenerateResult | None, strict: bool) -> tuple[dict, GenerateResult]:
    """One arm at one batch size: its figures, how the stats were read, and its greedy outputs
    against the plain run's (`strict`: every row must be equal)."""
    result = engine.generate(requests, spec, batch)
    stats, read = engine.last_iteration_stats, engine.last_stats_read
    errors = {c.id: c.error for c in result.completions if c.error}
    differ = [] if plain is None else [c.id for c, ref in zip(result.completions, plain.completions) if c.token_ids != ref.token_ids]
    record = {
        "arm": spec.label, "batch_size": batch, "rows": len(result.completions), "errors": errors,
        "tokens_per_s": tokens_per_s(result),
        "acceptance_rate": stats.acceptance_rate, "mean_accepted_len": stats.mean_accepted_len,
        "greedy_equal": None if plain is None else not differ, "greedy_differing": differ, "greedy_required": strict,
        "stats": {"reads": read.reads, "wait_s": round(read.wait_s, 3), "entries": len(read.entries), "missing_iterations": read.missing,
                  "full_batch_share": full_batch_share(read.entries, len(requests), batch),
                  "decode_steps": len(result.steps), "rows_with_steps": sum(bool(c.accepted_steps) for c in result.completions)},
        "caveats": dict(result.caveats),
    }
    return record, result


def check_calibrated(engine, arms, best, args: argparse.Namespace, batch: int) -> dict:
    """A calibrated job of --calibrated-rows rows (every arm a candidate, the controller choosing)
    against the same rows under the best static arm; greedy outputs must equal the static run's."""
    from batchspec.calibrate import CalibrationSettings, WorkerState
    from batchspec.shard import ShardInput, run_shard

    requests = rows(args.calibrated_rows, args.max_tokens, "c")
    began = time.perf_counter()
    static = engine.generate(requests, best, batch)
    static_s = time.perf_counter() - began
    began = time.perf_counter()
    ran = run_shard(engine, ShardInput("gpu-check", "check", requests), arms, True, batch, CalibrationSettings(),
                    worker=WorkerState(), horizon_rows=len(requests))
    calibrated_s = time.perf_counter() - began
    differ = [c.id for c, ref in zip(ran.completions, static.completions) if c.token_ids != ref.token_ids]
    tokens = sum(c.output_tokens for c in ran.completions)
    return {
        "rows": len(requests), "batch_size": batch, "static_arm": best.label,
        "static_tokens_per_s": round(static.output_tokens / static_s, 2), "static_s": round(static_s, 2),
        "calibrated_tokens_per_s": round(tokens / calibrated_s, 2), "calibrated_s": round(calibrated_s, 2),
        "vs_static": round((tokens / calibrated_s) / (static.output_tokens / static_s), 3) if static.output_tokens else None,
        "chosen": ran.decision.chosen.label, "builds": ran.stats.builds,
        "events": [{"row": e.row, "kind": e.kind, "arm": e.arm, "reason": e.reason} for e in ran.stats.events],
        "errors": sum(bool(c.error) for c in ran.completions), "in_order": [c.id for c in ran.completions] == [r.id for r in requests],
        "greedy_differing_from_static": len(differ),
    }


def trtllm_configs(paths: list[str]) -> tuple[list, list[dict]]:
    """The option files' arms TensorRT-LLM runs, and a record per file (torch-only ones skipped)."""
    from batchspec.config.candidates import check_engine_supports
    from batchspec.config.spec import load_spec_file

    arms, records = [], []
    for path in paths:
        spec = load_spec_file(path).spec
        try:
            check_engine_supports(spec, "trtllm")
        except BatchspecError as exc:
            records.append({"file": path, "arm": spec.label, "skipped": one_line(exc)})
            continue
        arms.append(spec)
        records.append({"file": path, "arm": spec.label})
    return arms, records


def check_multi_gpu(args: argparse.Namespace, gpus: int) -> bool:
    """A short batchspec run on a local Ray cluster of this node's GPUs: one worker holding `gpus`
    GPUs, its LLM across them (tensor_parallel_size), n-gram speculation fixed. Every row must
    come out without an error, and the stats must say the worker's GPUs."""
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray
    import yaml

    from batchspec import pipeline
    from batchspec.config.run import build_config
    from batchspec.stats import ShardStats

    with tempfile.TemporaryDirectory() as tmp:
        rows = [p for p in PROMPTS for _ in range(3)]
        pq.write_table(pa.table({"id": [f"r{i}" for i in range(len(rows))], "prompt": rows}), f"{tmp}/in.parquet")
        base = dict(yaml.safe_load(Path(args.base).read_text()) or {})
        settings = {"engine": "trtllm", "model": args.model, "dtype": args.dtype, "spec": str(ROOT / "trt_configs" / "ngram.yaml"),
                    "shard_size": 6, "workers": 1, "batch_size": 4, "max_tokens": 48, "ray_address": None,
                    "worker": {"num_gpus": gpus, "num_cpus": 1}, "llm_options": {**base, "tensor_parallel_size": gpus}}
        Path(f"{tmp}/p.yaml").write_text(yaml.safe_dump(settings))
        env = {"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}} if os.environ.get("PYTHONPATH") else None
        ray.init(address="local", num_gpus=gpus, include_dashboard=False, log_to_driver=False, runtime_env=env)
        try:
            summary = pipeline.run(build_config(f"{tmp}/in.parquet", f"{tmp}/out", f"{tmp}/p.yaml"))
            stats = [ShardStats.from_row(r) for r in pq.read_table(f"{tmp}/out/stats").to_pylist()]
        except Exception as exc:
            print(f"multi-GPU worker ({gpus} GPUs): FAIL {' '.join(f'{type(exc).__name__}: {exc}'.split())[:300]}")
            return False
        finally:
            ray.shutdown()
    peak = max((s.gpu_memory_per_gpu or 0 for s in stats), default=0) / 2**30
    ok = summary.complete and summary.rows == len(rows) and summary.error_rows == 0 and {s.gpus for s in stats} == {gpus}
    print(f"multi-GPU worker ({gpus} GPUs, tensor_parallel_size {gpus}): {'OK' if ok else 'FAIL'} {summary.rows} rows, "
          f"{summary.error_rows} errors, {summary.tokens_per_s:.1f} tok/s, memory in use per GPU {peak:.1f} GiB")
    return ok


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--engine" in argv:  # --engine torch: the torch engine's check (needs no TensorRT-LLM)
        at = argv.index("--engine")
        engine_name = argv[at + 1] if at + 1 < len(argv) else ""
        rest = argv[:at] + argv[at + 2:]
        if engine_name == "torch":
            import gpu_torch_check

            return gpu_torch_check.main(rest)
        if engine_name != "trtllm":
            print(f"gpu_check: --engine: expected torch or trtllm, got {engine_name!r}", file=sys.stderr)
            return 2
        argv = rest
    args = parse_args(argv)
    started = time.perf_counter()
    report: dict = {"check": "batchspec gpu-check (TensorRT-LLM)", "model": args.model, "max_tokens": args.max_tokens,
                    "rows_per_call": args.rows, "failures": []}

    def write() -> None:
        report["elapsed_s"] = round(time.perf_counter() - started, 1)
        report["ok"] = not report["failures"]
        Path(args.out).write_text(json.dumps(report, indent=1, default=str) + "\n")

    def within_budget(phase: str) -> bool:
        if time.perf_counter() - started < 0.8 * args.budget_s:
            return True
        report.setdefault("skipped_for_time", []).append(phase)
        return False

    began = time.perf_counter()
    try:
        from batchspec.config.spec import load_spec_file, run_llm_options
        from batchspec.engine.trtllm.adapter import TrtllmEngine
        from batchspec.engine.trtllm.install import import_trtllm

        trtllm = import_trtllm()
        report["tensorrt_llm"] = {"version": getattr(trtllm, "__version__", None), "import_s": round(time.perf_counter() - began, 2)}
        report["device"] = _device()
        paths = args.config or sorted(glob.glob(str(ROOT / "trt_configs" / "*.yaml")))
        arms, report["configs"] = trtllm_configs(paths)
        engine = TrtllmEngine(args.model, run_llm_options(load_spec_file(args.base).llm_options, arms, where=args.base),
                              dtype=args.dtype)
    except EngineUnavailable as exc:
        report["tensorrt_llm"] = {"error": str(exc)}
        report["failures"].append("tensorrt_llm: not importable")
        write()
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    except BatchspecError as exc:
        report["failures"].append(f"setup: {exc}")
        write()
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 1
    for record in report["configs"]:
        if "skipped" not in record:
            record["loads"] = check_loads(record["file"], args.model)
            if not record["loads"]:
                report["failures"].append(f"{record['file']}: trtllm-serve --config refuses it")
    batches = [int(b) for b in args.batch_sizes.split(",")]
    report["runs"], report["builds"] = [], []
    best: tuple[float, object] | None = None
    try:
        for batch in batches:
            if not within_budget(f"batch {batch}"):
                break
            requests = rows(args.rows, args.max_tokens)
            plain = None
            for spec in sorted(arms, key=lambda a: a.method != "none") if any(a.method == "none" for a in arms) else [NO_SPEC, *arms]:
                try:
                    record, result = run_arm(engine, spec, batch, requests, plain, strict=batch == batches[0])
                except Exception as exc:  # an arm that cannot build or run: recorded, the others go on
                    report["failures"].append(f"{spec.label} at batch {batch}: {one_line(exc)}")
                    continue
                report["runs"].append(record)
                if spec.method == "none":
                    plain = result
                if record["errors"]:
                    report["failures"].append(f"{spec.label} at batch {batch}: {len(record['errors'])} row error(s)")
                if record["greedy_required"] and record["greedy_differing"]:
                    report["failures"].append(f"{spec.label} at batch {batch}: greedy output differs from the plain run "
                                              f"({', '.join(record['greedy_differing'][:5])})")
                if record["stats"]["missing_iterations"]:
                    report["failures"].append(f"{spec.label} at batch {batch}: {record['stats']['missing_iterations']} iteration(s) unread")
                if batch == batches[-1] and record["tokens_per_s"] and (best is None or record["tokens_per_s"] > best[0]):
                    best = (record["tokens_per_s"], spec)
        report["builds"] = [{"arm": b.label, "seconds": round(b.seconds, 2), "memory_wait_s": round(b.released_s, 2),
                             "ran_as": b.ran_as, "reason": b.reason} for b in engine.builds]
        spec_arms = [a for a in arms if a.method != "none"]
        if best is not None and spec_arms and within_budget("calibrated job"):
            try:
                report["calibrated"] = calibrated = check_calibrated(engine, spec_arms, best[1], args, batches[-1])
                if calibrated["errors"] or not calibrated["in_order"]:
                    report["failures"].append(f"calibrated job: {calibrated['errors']} row error(s), in order {calibrated['in_order']}")
            except Exception as exc:
                report["failures"].append(f"calibrated job: {one_line(exc)}")
        report["builds"] = [{"arm": b.label, "seconds": round(b.seconds, 2), "memory_wait_s": round(b.released_s, 2),
                             "ran_as": b.ran_as, "reason": b.reason} for b in engine.builds]
    finally:
        engine.close()
    gpus = args.gpus if args.gpus is not None else _node_gpus()
    if gpus > 1 and within_budget("multi-GPU worker"):
        report["multi_gpu"] = {"gpus": gpus, "ok": check_multi_gpu(args, gpus)}
        if not report["multi_gpu"]["ok"]:
            report["failures"].append(f"multi-GPU worker of {gpus} GPUs failed")
    write()
    print(f"gpu_check: {'OK' if report['ok'] else 'FAIL'}: {len(report['runs'])} runs, {len(report['builds'])} builds, "
          f"{report['elapsed_s']} s; wrote {args.out}")
    for failure in report["failures"]:
        print(f"  {failure}")
    return 0 if report["ok"] else 1


def _device() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"cuda": False}
    free, total = torch.cuda.mem_get_info()
    return {"cuda": True, "name": torch.cuda.get_device_name(0), "count": torch.cuda.device_count(),
            "memory_gib": round(total / 2**30, 1), "free_gib": round(free / 2**30, 1)}


def _node_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 1


if __name__ == "__main__":
    sys.exit(main())
