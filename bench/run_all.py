"""All benchmarks in one run (issue 7, `make bench`): the engine and calibration benchmarks, then
batchspec against its peer, the batch-size sweep, and measured speedup against the limit.

- Peers: Hugging Face transformers `generate()` at batch 1, plain greedy, with `assistant_model`
  (Qwen2.5-Coder-0.5B drafting for 1.5B, on code) and with `prompt_lookup_num_tokens` (on the
  copy-heavy edits), on the same token ids, model objects, dtype and max_tokens as batchspec's
  engine at batch 1 and at its best batch size. Greedy outputs are compared with transformers'
  plain greedy output (match rate per prompt and per token). Targets: >= 1.1x at batch 1,
  >= 2x at the best batch size.
- Sweep: plain vs a fixed n-gram arm vs the calibrated choice at batch 1, 2, 4, 8, 16 (SmolLM2,
  copy-heavy edits): where the gain shrinks, and whether calibration switches to "none". PNG plot.
- Limit: for every speculative run, the speedup Leviathan et al. predict from the measured
  acceptance rate a = accepted / proposed and the measured per-step costs,
      predicted = E(a, k) * t_plain / (t_draft + t_verify),  E(a, k) = (1 - a^(k+1)) / (1 - a)
  (t_* per row-step, from the same run), beside the measured goodput ratio. Target >= 0.85.

Writes OUT/*.json, OUT/README.md (every table) and OUT/sweep.png.

    python bench/run_all.py [--quick] [--out bench/results] [--skip engine,calibrate,peers,sweep]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

import calibrate as bench_calibrate  # noqa: E402
import engine as bench_engine  # noqa: E402
import workloads  # noqa: E402
from engine import (  # noqa: E402
    RESULTS,
    Measured,
    choose_threads,
    fmt,
    interleaved,
    load_engine,
    machine,
    ngram_arm,
    write,
)

from batchspec.calibrate import CalibrationSettings, calibrate  # noqa: E402
from batchspec.engine.base import NO_SPEC, SpecConfig  # noqa: E402
from batchspec.predict import expected_tokens_per_step  # noqa: E402

BATCHES = (1, 2, 4, 8, 16)


# -- the limit ---------------------------------------------------------------------------------


def leviathan(plain: dict, spec: dict) -> dict | None:
    """Predicted vs measured speedup of a speculative run over plain decoding (both summaries
    from `Measured.summary`, same run). Coordination time ("other") is left out of the
    prediction: it is what the model does not account for."""
    k, a = spec["draft_len"], spec["acceptance_rate"]
    if not (k and a is not None and spec["target_steps"] and plain["target_steps"] and plain["goodput"]):
        return None
    t_plain = (plain["draft_s"] + plain["verify_s"] + plain["other_s"]) / plain["target_steps"]
    t_spec = (spec["draft_s"] + spec["verify_s"]) / spec["target_steps"]
    expected = expected_tokens_per_step(a, k)
    predicted = expected * t_plain / t_spec if t_spec > 0 else None
    # the same, with the measured tokens per step in place of the i.i.d. E(a, k): what is left
    # between this and the measured speedup is coordination time and rows finishing unevenly
    from_len = spec["mean_accepted_len"] * t_plain / t_spec if t_spec > 0 and spec["mean_accepted_len"] else None
    measured = spec["goodput"] / plain["goodput"]
    return {"method": spec["method"], "draft_len": k, "batch_size": spec["batch_size"], "acceptance_rate": a,
            "expected_tokens_per_step": expected, "mean_accepted_len": spec["mean_accepted_len"],
            "verify_step_cost": spec["verify_s"] / spec["target_steps"] / t_plain,
            "draft_step_cost": spec["draft_s"] / spec["target_steps"] / t_plain,
            "other_share": spec["other_s"] / max(1e-9, spec["draft_s"] + spec["verify_s"] + spec["other_s"]),
            "predicted_speedup": predicted, "measured_speedup": measured,
            "measured_over_predicted": measured / predicted if predicted else None,
            "predicted_from_mean_len": from_len, "measured_over_predicted_from_mean_len": measured / from_len if from_len else None}


def limit_table(rows: Sequence[dict]) -> str:
    lines = ["| run | batch | k | acceptance a | E(a,k) | measured mean accepted len | verify cost / plain step | draft cost / plain step | predicted | measured | measured / predicted (>= 0.85) | predicted from measured mean len | measured / that |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['run']} | {r['batch_size']} | {r['draft_len']} | {r['acceptance_rate']:.2f} | {r['expected_tokens_per_step']:.2f} "
                     f"| {fmt(r['mean_accepted_len'])} | {r['verify_step_cost']:.2f} | {r['draft_step_cost']:.2f} | {fmt(r['predicted_speedup'])}x "
                     f"| {r['measured_speedup']:.2f}x | {fmt(r['measured_over_predicted'])} "
                     f"| {fmt(r.get('predicted_from_mean_len'))} | {fmt(r.get('measured_over_predicted_from_mean_len'))} |")
    return "\n".join(lines)


# -- the peer: transformers generate() ---------------------------------------------------------


def hf_generate(model, ids: list[int], max_tokens: int, eos: list[int], pad: int, **extra) -> tuple[list[int], float]:
    import torch

    inputs = torch.tensor([ids])
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=max_tokens, do_sample=False,
                             temperature=None, top_p=None, top_k=None, eos_token_id=eos, pad_token_id=pad, **extra)
    wall = time.perf_counter() - started
    tokens = out[0, len(ids):].tolist()
    while tokens and tokens[-1] == pad and pad in eos and len(tokens) > 1 and tokens[-2] in eos:
        tokens.pop()  # trailing padding after eos
    return tokens, wall


def match_rates(reference: list[list[int]], outputs: list[list[int]]) -> tuple[float, float]:
    """(share of prompts with identical output, share of reference tokens matched before the first
    difference)."""
    same = sum(r == o for r, o in zip(reference, outputs))
    prefix = 0
    for r, o in zip(reference, outputs):
        n = 0
        while n < min(len(r), len(o)) and r[n] == o[n]:
            n += 1
        prefix += n
    return same / max(1, len(reference)), prefix / max(1, sum(len(r) for r in reference))


def bench_peer(engine, name: str, workload: str, n: int, max_tokens: int, spec: SpecConfig, hf_extra: dict) -> dict:
    """transformers plain and assisted at batch 1, prompt by prompt (arm order rotating), against
    batchspec at batch 1 (same prompts, interleaved) and at batch n (all prompts at once)."""
    requests = workloads.requests(workload, n, max_tokens)
    eos, pad = sorted(engine.eos_ids), engine.pad_id
    hf = {"transformers plain": ([], 0.0), "transformers assisted": ([], 0.0)}
    ours = {label: Measured(label, s, 1) for label, s in (("batchspec none b1", NO_SPEC), (f"batchspec {spec.label} b1", spec))}
    for i, request in enumerate(requests):
        ids = engine.encode(request)
        arms = [("transformers plain", {}), ("transformers assisted", hf_extra), *ours.items()]
        for label, arm in arms[i % len(arms):] + arms[: i % len(arms)]:
            if isinstance(arm, Measured):
                arm.add(engine.generate([request], arm.spec, 1))
            else:
                tokens, wall = hf_generate(engine.model, ids, max_tokens, eos, pad, **arm)
                done, total = hf[label]
                hf[label] = (done + [tokens], total + wall)
    big = interleaved(engine, requests, [(f"batchspec none b{n}", NO_SPEC, n), (f"batchspec {spec.label} b{n}", spec, n)], chunk=n)
    reference = hf["transformers plain"][0]
    rows = []
    for label, (outs, wall) in hf.items():
        tokens = sum(len(o) for o in outs)
        rows.append({"label": label, "batch_size": 1, "output_tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
                     "match_prompts": match_rates(reference, outs)[0], "match_tokens": match_rates(reference, outs)[1]})
    for m in [*ours.values(), *big.values()]:
        s = m.summary()
        outs = [c.token_ids for c in m.completions]
        rows.append({**s, "match_prompts": match_rates(reference, outs)[0], "match_tokens": match_rates(reference, outs)[1]})
    by = {r["label"]: r for r in rows}
    assisted = by["transformers assisted"]["tokens_per_s"]
    spec_b1 = by[f"batchspec {spec.label} b1"]["tokens_per_s"]
    best = max((r for r in rows if r["label"].startswith("batchspec") and r["batch_size"] == n), key=lambda r: r["tokens_per_s"])
    return {"name": name, "workload": workload, "prompts": n, "max_tokens": max_tokens, "spec": spec.label, "hf_options": hf_extra and {
        k: (v if isinstance(v, (int, float, str)) else type(v).__name__) for k, v in hf_extra.items()}, "rows": rows,
        "b1_vs_assisted": spec_b1 / assisted, "best_batch": best["label"], "best_vs_assisted": best["tokens_per_s"] / assisted,
        "met_b1": spec_b1 / assisted >= 1.1, "met_best": best["tokens_per_s"] / assisted >= 2.0,
        "limit": leviathan(ours["batchspec none b1"].summary(), ours[f"batchspec {spec.label} b1"].summary())}


def peer_table(peers: Sequence[dict]) -> str:
    lines = ["| peer set | arm | batch | tok/s | vs transformers assisted | acceptance | greedy match vs transformers plain (prompts / tokens) |",
             "|---|---|---|---|---|---|---|"]
    for p in peers:
        assisted = next(r for r in p["rows"] if r["label"] == "transformers assisted")["tokens_per_s"]
        for r in p["rows"]:
            lines.append(f"| {p['name']} | {r['label']} | {r['batch_size']} | {r['tokens_per_s']:.1f} | {r['tokens_per_s'] / assisted:.2f}x "
                         f"| {fmt(r.get('acceptance_rate'))} | {r['match_prompts']:.0%} / {r['match_tokens']:.0%} |")
    return "\n".join(lines)


# -- the batch-size sweep ----------------------------------------------------------------------


def bench_sweep(engine, workload: str, n: int, max_tokens: int, fixed: SpecConfig, arms: Sequence[SpecConfig],
                batches: Sequence[int]) -> list[dict]:
    requests = workloads.requests(workload, n, max_tokens)
    points = []
    for b in batches:
        # budgeted as for a 128-row shard of this workload (the sweep runs 16-32 rows to save time)
        decision = calibrate(engine, requests, arms, b, CalibrationSettings(min_rows=1), expected_rows=max(128, len(requests)))
        arms_b = [("none", NO_SPEC, b), (fixed.label, fixed, b)]
        if decision.chosen.label not in ("none", fixed.label):  # else the same greedy work: reuse that arm
            arms_b.append(("calibrated", decision.chosen, b))
        m = interleaved(engine, requests, arms_b, chunk=max(b, 8))
        s = {label: x.summary() for label, x in m.items()}
        s["calibrated"] = s.get("calibrated") or s[decision.chosen.label]
        point = {"batch_size": b, "plain_tokens_per_s": s["none"]["goodput"], "fixed": fixed.label,
                 "fixed_tokens_per_s": s[fixed.label]["goodput"], "chosen": decision.chosen.label,
                 "calibrated_tokens_per_s": s["calibrated"]["goodput"], "calibration_s": decision.calibration_s,
                 "reason": decision.reason, "fixed_acceptance": s[fixed.label]["acceptance_rate"],
                 "fixed_speedup": s[fixed.label]["goodput"] / s["none"]["goodput"],
                 "calibrated_speedup": s["calibrated"]["goodput"] / s["none"]["goodput"],
                 "limit": leviathan(s["none"], s[fixed.label])}
        print(sweep_table([point]), flush=True)
        points.append(point)
    return points


def sweep_table(points: Sequence[dict]) -> str:
    lines = ["| batch | plain tok/s | fixed arm | fixed tok/s | fixed speedup | calibrated choice | calibrated tok/s | calibrated speedup |",
             "|---|---|---|---|---|---|---|---|"]
    for p in points:
        lines.append(f"| {p['batch_size']} | {p['plain_tokens_per_s']:.1f} | {p['fixed']} | {p['fixed_tokens_per_s']:.1f} | {p['fixed_speedup']:.2f}x "
                     f"| {p['chosen']} | {p['calibrated_tokens_per_s']:.1f} | {p['calibrated_speedup']:.2f}x |")
    return "\n".join(lines)


def plot_sweep(points: Sequence[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [p["batch_size"] for p in points]
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=90)
    ax.plot(xs, [p["plain_tokens_per_s"] for p in points], "o-", label="plain")
    ax.plot(xs, [p["fixed_tokens_per_s"] for p in points], "s--", label=points[0]["fixed"])
    ax.plot(xs, [p["calibrated_tokens_per_s"] for p in points], "^-", label="calibrated")
    for p in points:
        ax.annotate(p["chosen"], (p["batch_size"], p["calibrated_tokens_per_s"]), fontsize=7, textcoords="offset points", xytext=(3, 4))
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("batch size")
    ax.set_ylabel("tokens/s (goodput)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# -- everything --------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="small model: plain batching, the sweep, calibration")
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--ngram-model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--prompts", type=int, default=None, help="peer prompts per set (default 3; 2 with --quick)")
    parser.add_argument("--max-tokens", type=int, default=None, help="peer and sweep max_tokens (default 64; 32 with --quick)")
    parser.add_argument("--sweep-rows", type=int, default=None, help="sweep prompts (default 32; 16 with --quick)")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="sweep batch sizes")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: engine,calibrate,peers,sweep")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)

    out, skip = Path(args.out), set(filter(None, args.skip.split(",")))
    threads = choose_threads(args.threads)
    common = ["--dtype", args.dtype, "--threads", str(threads), "--out", str(out)] + (["--quick"] if args.quick else [])
    sections, limits = [], []
    if "engine" not in skip:
        bench_engine.main(["--model", args.model, "--ngram-model", args.ngram_model, "--target", args.target,
                                 "--draft-model", args.draft_model, *common])
    if (out / "engine.json").exists():  # this run's, or the last one's when skipped
        sections.append("## Engine\n\n" + (out / "engine.md").read_text().split("\n", 2)[2])
        eng = json.loads((out / "engine.json").read_text())
        for c in eng["comparisons"]:
            lim = leviathan(c["baseline"], c["candidate"])
            if lim:
                limits.append({"run": f"engine: {c['name']} ({c['model']}, {c['workload']})", **lim})
    if "calibrate" not in skip:
        bench_calibrate.main(["--model", args.model, *common])
    if (out / "calibrate.md").exists():
        sections.append("## Calibration per shard\n\n" + (out / "calibrate.md").read_text().split("\n", 2)[2])

    info = machine(threads, args.dtype)
    n = args.prompts or (2 if args.quick else 3)
    max_tokens = args.max_tokens or (32 if args.quick else 64)
    previous = json.loads((out / "run_all.json").read_text()) if (out / "run_all.json").exists() else {}
    data: dict = {"benchmark": "run_all", "quick": args.quick, "machine": info,
                  "reused_from_previous_run": sorted({"peers", "sweep"} & skip & set(previous))}
    if "peers" not in skip:
        qwen = load_engine(args.target, args.dtype, args.draft_model)
        k = 4
        draft = SpecConfig("draft_target", k, draft_model=args.draft_model)
        peers = [bench_peer(qwen, f"{args.target} <- {args.draft_model}, code", "code", n, max_tokens, draft,
                            {"assistant_model": qwen._draft(args.draft_model)})]
        ngram_engine = qwen if args.ngram_model == args.target else load_engine(args.ngram_model, args.dtype)
        peers.append(bench_peer(ngram_engine, f"{args.ngram_model} n-gram, edit", "edit", n, max_tokens,
                                ngram_arm(k), {"prompt_lookup_num_tokens": k}))
        data["peers"] = peers
        del qwen, ngram_engine
        print(peer_table(peers), flush=True)
    elif "peers" in previous:
        data["peers"] = previous["peers"]
    if data.get("peers"):
        p0 = data["peers"][0]
        limits += [{"run": f"peer set: {p['name']}", **p["limit"]} for p in data["peers"] if p["limit"]]
        sections.append("## Against transformers generate() (batch-1 assisted generation)\n\n"
                        f"{p0['prompts']} prompts per set, max_tokens {p0['max_tokens']}, {args.dtype}, same token ids and model objects. "
                        "tok/s = output tokens / wall seconds (prefill included).\n\n" + peer_table(data["peers"]))
    if "sweep" not in skip:
        small = load_engine(args.model, args.dtype)
        arms = bench_calibrate.candidate_arms(None)
        fixed = ngram_arm(4)
        rows = args.sweep_rows or (16 if args.quick else 32)
        data["sweep"] = bench_sweep(small, "edit", rows, max_tokens, fixed, arms, [int(b) for b in args.batches.split(",")])
        data["sweep_setup"] = {"model": args.model, "workload": "edit", "prompts": rows, "max_tokens": max_tokens}
        plot_sweep(data["sweep"], out / "sweep.png", f"{args.model}, copy-heavy edits, {args.dtype}, {threads} thread(s)")
    elif "sweep" in previous:
        data["sweep"], data["sweep_setup"] = previous["sweep"], previous.get("sweep_setup", {})
    if data.get("sweep"):
        setup = data.get("sweep_setup", {})
        limits += [{"run": f"sweep: {setup.get('model')} {p['fixed']}, edit", **p["limit"]} for p in data["sweep"] if p["limit"]]
        sections.append(f"## Batch-size sweep ({setup.get('model')}, copy-heavy edits, {setup.get('prompts')} prompts, "
                        f"max_tokens {setup.get('max_tokens')}; tok/s = goodput)\n\n![sweep](sweep.png)\n\n" + sweep_table(data["sweep"]))
    data["limit"] = limits
    if limits:
        sections.append("## Measured against the limit (Leviathan et al.)\n\n" + limit_table(limits))
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    write(out, "run_all", data, "")
    (out / "run_all.md").unlink()
    header = (f"# Benchmark results\n\n`python bench/run_all.py{' --quick' if args.quick else ''}` (`make bench`), {info['date_utc']}: "
              f"CPU only, {info['cpus']} cores shared with other jobs, {threads} torch thread(s), load average "
              f"{info['load_avg_start'][0]} at start of the last part / {info['load_avg_end'][0]} at end; {args.dtype}, greedy.\n")
    (out / "README.md").write_text("\n\n".join([header, *sections]) + "\n")
    print("\n\n".join(sections[-2:]))
    print(f"-> {out / 'README.md'}")
    return data


if __name__ == "__main__":
    main()
