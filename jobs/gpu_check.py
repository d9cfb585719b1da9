"""GPU smoke check for the TensorRT-LLM engine (and, with --engine torch, the torch engine).

For each TensorRT-LLM option file (default: trt_configs/*.yaml) this first loads it the way
`trtllm-serve --config` does (TensorRT-LLM's own update_llm_args_with_extra_dict and
TorchLlmArgs), then builds the LLM through batchspec's adapter (batchspec/engine/trtllm/),
generates a few prompts greedily with and without that file's speculation, checks that the
outputs are equal, and prints acceptance (from llm.get_stats()), tokens/s, the decode steps and
per-row accepted drafts the adapter read from the iteration stats, and the memory in use per GPU.
Then it runs one calibrated shard as a run does (n-gram k=2 and k=4, each a build, the rows
streamed to the controller) and checks every row's greedy output against the plain run's.
On a node of several GPUs (or --gpus N) it then runs a short batchspec pipeline on a local Ray
cluster whose one worker holds N GPUs and runs one LLM across them (tensor_parallel_size N), and
checks that every row came out. It is the only place batchspec meets real TensorRT-LLM.

    make gpu-check
    python jobs/gpu_check.py --model meta-llama/Llama-3.1-8B-Instruct [--config trt_configs/ngram.yaml ...]
    python jobs/gpu_check.py --engine torch [--shape 1b --shape 8b]   # see jobs/gpu_torch_check.py

Every config's LLM is built with the same non-speculative options (--base plus the configs' own,
merged as a run merges them), one at a time: each is shut down before the next is built.

The shipped configs pair with Llama-3.1-8B-Instruct (eagle3.yaml's head and draft_target.yaml's
Llama-3.2-1B draft are made for it). Batch size 1 by default: TensorRT-LLM's own tests note that
in-flight batching at larger batch sizes may change greedy outputs slightly.

Exit status: 0 all equal; 1 a config failed to load or run, its output differed, or the
multi-GPU worker failed; 2 tensorrt_llm is missing (one line on stderr).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "jobs"))

from batchspec.engine.base import NO_SPEC, GenerateResult, Request, SamplingParams  # noqa: E402
from batchspec.errors import BatchspecError, EngineUnavailable  # noqa: E402

PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Repeat this list exactly, one item per line: apples, pears, plums, cherries, figs.",
    'Extract the fields as JSON: "Order 1182 from Ada Lovelace, 3 items, total 42.50 EUR".',
    "Explain in three sentences why the sky is blue.",
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=os.environ.get("BATCHSPEC_GPU_MODEL", "meta-llama/Llama-3.1-8B-Instruct"))
    parser.add_argument("--config", action="append", help="option file(s); default trt_configs/*.yaml")
    parser.add_argument("--base", default=str(ROOT / "trt_configs" / "none.yaml"), help="LLM options for the plain run")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16", choices=("auto", "bfloat16", "float16", "float32"))
    parser.add_argument("--gpus", type=int, default=None,
                        help="GPUs of the multi-GPU worker check (default: every GPU of the node; 1 skips it)")
    return parser.parse_args(argv)


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


def report_stats(result: GenerateResult, engine) -> None:
    """What calibration reads from the iteration stats: decode steps, per-row steps, memory."""
    steps = result.steps
    mean_ms = 1000 * sum(s.seconds for s in steps) / len(steps) if steps else 0.0
    rows = sum(bool(c.accepted_steps) for c in result.completions)
    gib = (engine.gpu_memory_per_gpu() or 0) / 2**30
    print(f"  steps: {len(steps)} decode iterations, {mean_ms:.1f} ms each; accepted_steps for {rows} of "
          f"{len(result.completions)} rows; memory in use per GPU {gib:.1f} GiB")
    for field, why in result.caveats.items():
        print(f"  {field}: {why}")


def run_arm(engine, spec, batch_size: int, max_tokens: int) -> GenerateResult:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    requests = [Request(f"p{i}", prompt=p, params=params) for i, p in enumerate(PROMPTS)]
    return engine.generate(requests, spec, batch_size)


def tokens_per_s(result: GenerateResult) -> float:
    return result.output_tokens / result.timing.wall_s if result.timing.wall_s > 0 else 0.0


def check_config(engine, path: str, plain: GenerateResult, args: argparse.Namespace) -> bool:
    from batchspec.config.spec import load_spec_file

    spec = load_spec_file(path).spec
    if spec.method == "none":
        print(f"{path}: no speculation (baseline {tokens_per_s(plain):.1f} tok/s)")
        return True
    result = run_arm(engine, spec, args.batch_size, args.max_tokens)
    errors = [c for c in result.completions if c.error]
    differ = [c.id for c, ref in zip(result.completions, plain.completions) if c.token_ids != ref.token_ids]
    stats = engine.last_iteration_stats
    build = engine.build_seconds(spec)
    rate = f"{stats.acceptance_rate:.2f}" if stats.acceptance_rate is not None else "n/a"
    mean = f"{stats.mean_accepted_len:.2f}" if stats.mean_accepted_len is not None else "n/a"
    speed, base = tokens_per_s(result), tokens_per_s(plain)
    verdict = "OK" if not errors and not differ else "FAIL"
    print(f"{path}: {spec.label} {verdict} acceptance={rate} mean_accepted_len={mean} "
          f"tok/s={speed:.1f} (none {base:.1f}, x{speed / base if base else 0:.2f}) build={build:.0f}s")
    for c in errors:
        print(f"  {c.id}: error: {c.error}")
    for rid in differ:
        print(f"  {rid}: greedy output differs from the plain run")
    for record in engine.builds:
        if record.label == spec.label and record.reason:
            print(f"  memory: {record.reason}")
    report_stats(result, engine)
    return verdict == "OK"


def check_calibrated(engine, plain: GenerateResult, args: argparse.Namespace, repeat: int = 4) -> bool:
    """A calibrated shard as a run streams it (`shard.run_shard` over n-gram k=2 and k=4 from
    trt_configs/ngram.yaml, each a build; the rows submitted two batches ahead, the controller
    called after every batch that finishes): every row comes back once, in order, with the plain
    run's greedy output, and the controller's events and the builds are printed."""
    from batchspec.calibrate import CalibrationSettings, WorkerState
    from batchspec.config.spec import load_spec_file
    from batchspec.shard import ShardInput, run_shard

    ngram = load_spec_file(str(ROOT / "trt_configs" / "ngram.yaml")).spec
    arms = [ngram.with_draft_len(2), ngram.with_draft_len(4)]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    requests = [Request(f"c{j}-{i}", prompt=p, params=params) for j in range(repeat) for i, p in enumerate(PROMPTS)]
    builds = len(engine.builds)
    ran = run_shard(engine, ShardInput("gpu-check", "check", requests), arms, True, args.batch_size, CalibrationSettings(),
                    worker=WorkerState(), horizon_rows=len(requests))
    errors = [c for c in ran.completions if c.error]
    differ = [c.id for r, c in zip(requests, ran.completions) if c.token_ids != plain.completions[int(r.id.split("-")[1])].token_ids]
    in_order = [c.id for c in ran.completions] == [r.id for r in requests]
    ok = in_order and not errors and not differ
    print(f"calibrated shard (n-gram k=2, k=4): {'OK' if ok else 'FAIL'} {len(ran.completions)} rows of {len(requests)}, "
          f"{len(engine.builds) - builds} build(s), chose {ran.decision.chosen.label}, {ran.stats.tokens_per_s or 0.0:.1f} tok/s")
    for e in ran.stats.events:
        print(f"  row {e.row}: {e.kind} {e.arm}" + (f" ({e.reason})" if e.reason else ""))
    for c in errors[:3]:
        print(f"  {c.id}: error: {c.error}")
    for rid in differ[:3]:
        print(f"  {rid}: greedy output differs from the plain run")
    return ok


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
    configs = args.config or sorted(glob.glob(str(ROOT / "trt_configs" / "*.yaml")))
    try:
        from batchspec.config.spec import load_spec_file
        from batchspec.engine.trtllm.adapter import TrtllmEngine

        from batchspec.config.spec import run_llm_options

        arms = [load_spec_file(path).spec for path in configs]
        engine = TrtllmEngine(args.model, run_llm_options(load_spec_file(args.base).llm_options, arms, where=args.base),
                              dtype=args.dtype)
    except EngineUnavailable as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    except BatchspecError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 1
    ok = True
    try:
        plain = run_arm(engine, NO_SPEC, args.batch_size, args.max_tokens)
        if any(c.error for c in plain.completions):
            print(f"plain run failed: {[c.error for c in plain.completions if c.error][0]}", file=sys.stderr)
            return 1
        for path in configs:
            try:
                ok = check_loads(path, args.model) and check_config(engine, path, plain, args) and ok
            except Exception as exc:  # report and go on to the next config
                print(f"{path}: FAIL {' '.join(f'{type(exc).__name__}: {exc}'.split())[:300]}")
                ok = False
        try:
            ok = check_calibrated(engine, plain, args) and ok
        except Exception as exc:
            print(f"calibrated shard: FAIL {' '.join(f'{type(exc).__name__}: {exc}'.split())[:300]}")
            ok = False
    finally:
        engine.close()
    gpus = args.gpus if args.gpus is not None else _node_gpus()
    if gpus > 1:
        ok = check_multi_gpu(args, gpus) and ok
    return 0 if ok else 1


def _node_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 1


if __name__ == "__main__":
    sys.exit(main())
