"""EAGLE-3 head bench: a head trained on a key's own first rows against n-gram lookup and suffix
drafting on that key's held-out rows, with the packaged SmolLM2-135M-Instruct on this CPU.

Per workload (bench/common/workloads.py, chat template applied, greedy, float32):
1. decode the key's first N rows plainly (batch 8; the head's training data) and the next rows
   plainly at batch 1 (held out: plain goodput measured here);
2. record the target's hidden states of every row by one teacher-forced forward (timed apart);
   with `--recorded`, the training rows' states are instead those their batch-8 decode left
   (TorchEngine.recording, what `train_head` does in a run: no forward of their own) and the
   head trains on the target's tokens (hard targets, as `train_head` does);
3. train a head on the N rows for each time budget (eagle3_train.train_head); with `--subsets`,
   also on the first M of them for each M (how acceptance grows with a key's rows);
4. on the held-out rows, the mean accepted length per draft length k of the head's chain drafts,
   of n-gram lookup (the shipped arm's n-gram size) and of suffix drafting (its tree holding the
   N training rows), all counterfactual from the plain rows (exact for greedy);
5. time one target forward at batch 1 for 1..k+1 tokens (the engine's cost profile, at the
   held-out rows' mean context) and the head's work per step (extending its context by the
   committed tokens, k chained drafts), and estimate each arm's goodput at batch 1 from them.

The goodput columns of step 4 are ESTIMATES: counterfactual acceptance times measured step costs.
N-gram and suffix lookups are counted as free (no draft time); the head's measured draft time is
counted. With `--run B1,B2`, each head is then written in the released format and the held-out
rows are decoded for real at each batch size under plain decoding, n-gram lookup, suffix drafting
and the head's eagle3 arm (`--run-ks`), side by side in this process (every arm on each chunk of
one batch in turn, the order rotating: `run_arms`): MEASURED goodput (decode tokens per
decode second), how many rows equal plain decoding's output token for token, and the decode
seconds a head's measured goodput would save on a 2,000-row key at that batch size beside the
seconds its training took.

    python bench/eagle3.py [--workloads prose,code] [--train-rows 64] [--subsets 16,32] [--test-rows 16]
        [--max-tokens 128] [--budgets 60,240] [--ks 1,2,3,4,6] [--run 1,8] [--run-ks 2,4]
        [--recorded] [--threads N] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import peer_prompts, results, workloads  # noqa: E402
from common.measure import choose_threads, command, load_engine, machine, machine_line, ngram_arm, write  # noqa: E402

from batchspec.engine.acceptance import Acceptance, PlainRow  # noqa: E402
from batchspec.engine.base import NO_SPEC, Request, SamplingParams, SpecConfig  # noqa: E402
from batchspec.engine.torch.counterfactual import chain_acceptance, ngram_acceptance, suffix_acceptance  # noqa: E402
from batchspec.engine.torch.eagle3 import aux_layers  # noqa: E402
from batchspec.engine.torch.eagle3_chains import Chain, chains  # noqa: E402
from batchspec.engine.torch.eagle3_states import Recorded, record  # noqa: E402
from batchspec.engine.torch.eagle3_release import save_head  # noqa: E402
from batchspec.engine.torch.eagle3_train import TrainSettings, train_head  # noqa: E402
from batchspec.engine.torch.suffix_tree import SuffixTree  # noqa: E402

MODEL = "smollm2-135m"
MIN_SLICES = 4  # run_arms: each arm's fewest interleaved slices at a batch size
KEY_ROWS = 2000  # the issue's key size: training is priced against this many rows' plain decode at batch 1


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="prose", help="comma-separated, from " + ",".join(workloads.WORKLOADS))
    parser.add_argument("--train-rows", type=int, default=64)
    parser.add_argument("--subsets", default="", help="also train heads on the first M training rows for each M (comma-separated, "
                        "below --train-rows): how acceptance grows with a key's rows, on the same held-out rows")
    parser.add_argument("--test-rows", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--budgets", default="60,240", help="training seconds, comma-separated (one head each)")
    parser.add_argument("--ks", default="1,2,3,4,6")
    parser.add_argument("--depth", type=int, default=4, help="training-time test depth")
    parser.add_argument("--draft-vocab", type=int, default=8192)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--hard", action="store_true", help="train on the target's tokens, not its distributions")
    parser.add_argument("--recorded", action="store_true", help="train on the states the training rows' decode left (train_head's path; hard targets)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run", default="", help="batch sizes at which to run the arms for real (comma-separated); none: estimates only")
    parser.add_argument("--run-ks", default="2,4", help="draft lengths of the arms run for real")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--save-heads", type=Path, help="write each workload's head (all its training rows, the largest budget) "
                        "to DIR/<workload>/head and its held-out prompts to DIR/<workload>/held_out.parquet: bench/sim.py's "
                        "--eagle3 and --input, for calibration with the head among the arms")
    results.add_options(parser)
    args = parser.parse_args(argv)
    threads = choose_threads(args.threads)
    info = machine(threads, "float32")
    engine = load_engine(MODEL, "float32")
    ks = sorted(int(k) for k in args.ks.split(","))
    budgets = [float(b) for b in args.budgets.split(",")]
    data, text = {"machine": info, "command": command("bench/eagle3.py", argv), "workloads": {}}, []
    for workload in args.workloads.split(","):
        result, table = run_workload(engine, workload, args, ks, budgets)
        data["workloads"][workload] = result
        text.append(table)
        print(table, flush=True)
    info["load_avg_end"] = [round(x, 2) for x in __import__("os").getloadavg()]
    header = f"EAGLE-3 head bench, {MODEL} float32 on {machine_line(info)}\n{data['command']}\n"
    write(args.out, "eagle3", data, header + "\n".join(text), header)
    results.record("eagle3", "bench/eagle3.py", args, argv, headline(data["workloads"]))


def headline(by_workload: dict) -> dict:
    """The recorded figures: per workload, the head's mean accepted length on held-out rows (k=2,
    counterfactual), its training seconds and their share of a KEY_ROWS-row key's plain decode at
    batch 1, and per measured batch size the best eagle3 arm's and the best other drafting arm's
    goodput over plain decoding's (side by side), with the best other arm named; with them, each
    head's passes over its rows and its accepted length on them, and n-gram's and suffix drafting's
    on the held-out rows (counterfactual). `@M rows`: a head of --subsets."""
    out: dict = {}
    for workload, r in by_workload.items():
        k = 2 if 2 in r["arms"]["ngram"] else min(r["arms"]["ngram"])
        for arm in ("ngram", "suffix"):
            out[f"{workload} {arm} acc len k={k}"] = round(r["arms"][arm][k]["mean_accepted_len"], 3)
        for label, head in r["heads"].items():
            at = f" @{head['train_rows']} rows" if head["train_rows"] < r["train_rows"] else ""
            out[f"{workload} head acc len k={k}{at}"] = round(r["arms"][label][k]["mean_accepted_len"], 3)
            out[f"{workload} head own rows acc len k={k}{at}"] = round(head["train_rows_mean_accepted_len"][k], 3)
            out[f"{workload} head passes{at}"] = round(head["stats"]["epochs"], 1)
            if at:
                continue
            out[f"{workload} head train s"] = round(head["stats"]["seconds"], 1)
            out[f"{workload} head train share"] = round(head["stats"]["seconds"] / (KEY_ROWS * r["decode_s_per_row_b1"]), 4)
        for b, by_arm in r["measured"].items():
            plain = by_arm["plain"]["goodput"]
            ratio = {label: m["goodput"] / plain for label, m in by_arm.items() if label != "plain" and plain}
            heads = {label: v for label, v in ratio.items() if label.startswith("eagle3")}
            others = {label: v for label, v in ratio.items() if not label.startswith("eagle3")}
            if heads:
                best = max(heads, key=heads.get)
                out[f"{workload} b{b} head/plain"] = round(heads[best], 3)
            if others:
                best = max(others, key=others.get)
                out[f"{workload} b{b} best other/plain"] = round(others[best], 3)
                out[f"{workload} b{b} best other"] = best
            out[f"{workload} b{b} rows = plain"] = f"{min(m['rows_equal_plain'] for m in by_arm.values())}/{by_arm['plain']['rows']}"
    return out


def run_workload(engine, workload: str, args, ks: list[int], budgets: list[float]) -> tuple[dict, str]:
    target = engine.model
    n_train = args.train_rows
    requests, repeats = key_requests(engine.tokenizer, workload, n_train, args.test_rows, args.max_tokens, args.seed)
    started = time.perf_counter()
    if args.recorded:
        with engine.recording(10**9) as decoded:
            train_result = engine.generate(requests[:n_train], NO_SPEC, 8)
    else:
        train_result = engine.generate(requests[:n_train], NO_SPEC, 8)
    train_decode_s = time.perf_counter() - started
    n_test = len(requests) - n_train
    test_result = engine.generate(requests[n_train:], NO_SPEC, 1)
    plain_goodput = test_result.goodput
    decode_s_per_row = test_result.timing.decode_s / n_test
    pairs = [(list(engine.encode(r)), list(c.token_ids)) for r, c in zip(requests, train_result.completions + test_result.completions)]
    plain = [PlainRow(p, o, args.max_tokens) for p, o in pairs]
    started = time.perf_counter()
    recorded = record(target, pairs[n_train:] if args.recorded else pairs, aux_layers(target.config.num_hidden_layers))
    record_s = time.perf_counter() - started
    if args.recorded:  # the rows in request order, as the plain rows are (a row the recording left out: recorded apart)
        by_tokens = {tuple(r.tokens.tolist()): Recorded(r.tokens.clone(), r.prompt_len, r.aux.clone()) for r in decoded}
        missing = [p for p in pairs[:n_train] if tuple(list(p[0]) + list(p[1])) not in by_tokens]
        extra = {tuple(list(p) + list(o)): r for (p, o), r in zip(missing, record(target, missing, aux_layers(target.config.num_hidden_layers)))}
        recorded = [by_tokens.get(t) or extra[t] for t in (tuple(list(p) + list(o)) for p, o in pairs[:n_train])] + recorded
    train_rows, test_rows = recorded[:n_train], recorded[n_train:]
    train_plain, test_plain = plain[:n_train], plain[n_train:]

    context = int(statistics.mean(len(p) + len(o) / 2 for p, o in pairs[n_train:]))
    step_s = monotone({c.tokens: c.seconds for c in engine.profile([(1, context, w) for w in range(1, max(ks) + 2)]).points})
    arms: dict[str, dict[int, Acceptance]] = {
        "ngram": ngram_acceptance(test_plain, ks, ngram_arm(1).ngram_size),
        "suffix": suffix_acceptance(test_plain, ks, trained_tree(train_plain)),
    }
    draft_s: dict[str, dict[int, float]] = {"ngram": {k: 0.0 for k in ks}, "suffix": {k: 0.0 for k in ks}}
    heads, heads_saved = {}, {}
    subsets = sorted(int(m) for m in args.subsets.split(",") if m and int(m) < n_train)
    for m, budget in [(m, b) for m in subsets for b in budgets] + [(n_train, b) for b in budgets]:
        settings = TrainSettings(budget_s=budget, depth=args.depth, draft_vocab_size=args.draft_vocab, lr=args.lr,
                                 soft=not (args.hard or args.recorded), seed=args.seed)
        head, stats = train_head(target, train_rows[:m], settings)
        label = f"eagle3 {budget:.0f}s" if m == n_train else f"eagle3 {m} rows {budget:.0f}s"
        arms[label] = chain_acceptance(test_plain, ks, chains(head, test_rows, max(ks)))
        seen = chain_acceptance(train_plain[:m], ks, chains(head, train_rows[:m], max(ks)))
        costs = head_costs(head, test_rows, ks)
        draft_s[label] = {k: costs["draft"][k] for k in ks}
        heads_saved[label] = str(save_head(head, Path(tempfile.mkdtemp(prefix="bench-eagle3-head-"))))
        heads[label] = {"budget_s": budget, "train_rows": m, "stats": vars(stats), "costs": costs,
                        "train_rows_mean_accepted_len": {k: mean_len(seen[k]) for k in ks}}

    rows = {}
    for label, by_k in arms.items():
        rows[label] = {k: {"mean_accepted_len": mean_len(by_k[k]),
                           "est_goodput": estimated_goodput(by_k[k], step_s, draft_s[label][k], heads.get(label))} for k in ks}
    if args.save_heads:
        save_for_sim(args.save_heads / workload, heads_saved[f"eagle3 {max(budgets):.0f}s"], requests[n_train:], workload)
    measured = run_arms(engine, requests[:n_train], requests[n_train:], pairs[:n_train], heads_saved, args) if args.run else {}
    result = {"workload": workload, "measured": measured, "train_rows": n_train, "test_rows": n_test, "train_prompt_repeats": repeats, "max_tokens": args.max_tokens,
              "train_decode_s_batch8": train_decode_s, "record_s": record_s, "recorded_while_decoding": args.recorded, "plain_goodput_b1": plain_goodput,
              "decode_s_per_row_b1": decode_s_per_row, "context": context, "target_step_s": step_s,
              "arms": rows, "heads": heads}
    return result, table(result, ks)


def save_for_sim(folder: Path, head: str, held_out: Sequence[Request], workload: str) -> None:
    """A trained head and the held-out prompts it never trained on, as bench/sim.py reads them
    (`--eagle3 FOLDER/head --input FOLDER/held_out.parquet --shard-by task`)."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copytree(head, folder / "head", dirs_exist_ok=True)
    pq.write_table(pa.table({"id": [r.id for r in held_out], "task": [workload] * len(held_out),
                             "prompt": [r.messages[0]["content"] for r in held_out]}), folder / "held_out.parquet")


def run_arms(engine, train: list[Request], requests: list[Request], pairs: list, heads: dict[str, str], args) -> dict:
    """Decode the held-out rows for real at each batch size of `--run`: plain decoding, n-gram
    lookup, suffix drafting (its tree holding the training rows' outputs, then the held-out rows as
    they finish, as a key's tree grows in a run) and each head's eagle3 arm at each draft length of
    `--run-ks`, side by side: the rows go in chunks of one batch, every arm decodes each chunk
    before the next chunk starts, the arms' order rotating chunk by chunk, and the whole is done
    `passes` times so that every arm has at least MIN_SLICES interleaved slices (machine load then
    falls on every arm alike). Per (batch, arm): measured goodput (decode tokens over decode
    seconds, summed over its slices), mean accepted length, and the rows whose output equals plain
    decoding's at that batch size."""
    out: dict = {}
    ks = [int(x) for x in args.run_ks.split(",")]
    arms = [("plain", NO_SPEC)] + [(f"ngram k={k}", ngram_arm(k)) for k in ks] + [(f"suffix k={k}", SpecConfig("suffix", k)) for k in ks]
    arms += [(f"{label} k={k}", SpecConfig("eagle3", k, draft_model=folder)) for label, folder in heads.items() for k in ks]
    for b in (int(x) for x in args.run.split(",")):
        chunks = [list(range(i, min(i + b, len(requests)))) for i in range(0, len(requests), b)]
        passes = max(1, -(-MIN_SLICES // len(chunks)))
        results: dict[str, list] = {label: [] for label, _ in arms}
        outputs: dict[str, dict[int, list[int]]] = {label: {} for label, _ in arms}
        for label, spec in arms:  # warm-up, discarded: a batch size's first forwards and a head's first load
            engine.generate([dataclasses.replace(requests[i], draft_scope=None) for i in chunks[0]], spec, b)
        turn = 0
        for p in range(passes):
            scope = f"bench-suffix/{b}/{p}"  # a tree per pass: a row never drafts from its own earlier output
            for (_, output), request in zip(pairs, train):
                engine.trees.add(scope, request.id, output)
            for chunk in chunks:
                for label, spec in arms[turn % len(arms):] + arms[: turn % len(arms)]:
                    batch = [dataclasses.replace(requests[i], draft_scope=scope if spec.method == "suffix" else None) for i in chunk]
                    r = engine.generate(batch, spec, b)
                    results[label].append(r)
                    outputs[label].update({i: list(c.token_ids) for i, c in zip(chunk, r.completions)})
                turn += 1
        out[b] = {}
        for label, rs in results.items():
            decode_s, tokens = sum(r.timing.decode_s for r in rs), sum(r.decode_tokens for r in rs)
            steps, accepted = sum(r.target_steps for r in rs), sum(r.accepted_tokens for r in rs)
            out[b][label] = {"goodput": tokens / decode_s if decode_s else 0.0, "decode_s": decode_s,
                             "draft_s": sum(r.timing.draft_s for r in rs), "mean_accepted_len": 1 + accepted / steps if steps else 1.0,
                             "rows_equal_plain": sum(outputs[label][i] == outputs["plain"][i] for i in outputs["plain"]),
                             "rows": len(requests), "slices": len(rs)}
    return out


def key_requests(tokenizer, workload: str, n_train: int, n_test: int, max_tokens: int, seed: int) -> tuple[list[Request], int]:
    """A key's first `n_train` rows, then up to `n_test` held-out rows whose prompts none of those
    rows (nor another held-out row) has: the templated workloads repeat prompts (prose: 36
    distinct of 80), and a repeated prompt's greedy output is the same text. Also how many of the
    training rows repeat an earlier one's prompt. `peer-<task>` takes held-out chat prompts of
    installed packages' READMEs and the standard library (bench/common/peer_prompts.py;
    peer-prose: summarize and rewrite), distinct by construction."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    if workload.startswith("peer-"):
        task = workload.removeprefix("peer-")
        tasks = ("summarize", "rewrite") if task == "prose" else (task,)
        texts = [h.messages[0]["content"] for h in peer_prompts.held_out(tokenizer, n_train + n_test, seed, tasks=tasks)]
    else:
        pool = workloads.prompts(workload, 8 * (n_train + n_test), seed)
        seen = set(pool[:n_train])
        texts = list(pool[:n_train])
        for text in pool[n_train:]:
            if text not in seen and len(texts) < n_train + n_test:
                texts.append(text)
                seen.add(text)
    repeats = n_train - len(set(texts[:n_train]))
    return [Request(f"{workload}-{i:04d}", messages=({"role": "user", "content": t},), params=params)
            for i, t in enumerate(texts)], repeats


def monotone(step_s: dict[int, float]) -> dict[int, float]:
    """Step seconds by tokens, made non-decreasing (a forward of fewer tokens taken as costing at
    most a wider one's: on a loaded machine a single timing can come out above its neighbour's)."""
    out, low = {}, float("inf")
    for w in sorted(step_s, reverse=True):
        low = min(low, step_s[w])
        out[w] = low
    return dict(sorted(out.items()))


def trained_tree(rows: Sequence[PlainRow]) -> SuffixTree:
    """The key's suffix tree as a worker holds it after decoding `rows`."""
    tree = SuffixTree()
    for i, row in enumerate(rows):
        tree.add(f"train-{i}", row.output_ids, serial=i)
    return tree


def head_costs(head, rows, ks: list[int], reps: int = 15) -> dict:
    """The head's seconds per step at batch 1 (fastest of `reps`), from a held-out row's middle:
    `draft[k]` k chained drafts, `extend[n]` adding n committed positions to its context."""
    row = max(rows, key=lambda r: len(r.tokens))
    n = row.prompt_len + row.output_len // 2
    chain = Chain(head)
    chain.extend(row.aux[: n - 1], row.tokens[1:n].tolist())
    draft = {k: min(_timed(lambda: chain.draft(k)) for _ in range(reps)) for k in ks}
    extend = {}
    for m in range(1, max(ks) + 2):
        tries = []
        for _ in range(reps):
            trial = Chain(head)
            trial.k0, trial.v0, trial.length = chain.k0, chain.v0, chain.length
            tries.append(_timed(lambda: trial.extend(row.aux[n - 1 : n - 1 + m], row.tokens[n : n + m].tolist())))
        extend[m] = min(tries)
    return {"draft": draft, "extend": extend, "context": n}


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def mean_len(acceptance: Acceptance) -> float:
    return 1 + acceptance.accepted_tokens / acceptance.target_steps if acceptance.target_steps else 1.0


def estimated_goodput(acceptance: Acceptance, step_s: dict[int, float], draft_s: float, head: dict | None) -> float:
    """Committed tokens per second at batch 1 if each counterfactual step cost one target forward
    of its drafts + 1 tokens, plus the drafter's time (the head: its k drafts and the extension of
    its context by the tokens the step committed)."""
    extend = head["costs"]["extend"] if head else {}
    seconds = tokens = 0.0
    for accepted, proposed in zip(acceptance.steps, acceptance.proposed):
        for a, p in zip(accepted, proposed):
            seconds += step_s[p + 1] + (draft_s if p else 0.0) + extend.get(int(a) + 1, 0.0)
            tokens += a + 1
    return tokens / seconds if seconds else 0.0


def table(result: dict, ks: list[int]) -> str:
    plain = 1.0 / result["target_step_s"][1]
    lines = [
        f"\n## {result['workload']}: {result['train_rows']} training rows ({result['train_prompt_repeats']} repeat an earlier "
        f"row's prompt), {result['test_rows']} held-out rows (no prompt of a training row), max_tokens {result['max_tokens']}",
        f"plain at batch 1 (measured): {result['plain_goodput_b1']:.1f} tok/s goodput, "
        f"{result['decode_s_per_row_b1']:.2f} s decode per row; a {KEY_ROWS}-row key: {KEY_ROWS * result['decode_s_per_row_b1']:.0f} s",
        (f"training rows decoded at batch 8 in {result['train_decode_s_batch8']:.0f} s, their hidden states kept from those forwards "
         f"(hard targets); the held-out rows' recorded by a separate forward in {result['record_s']:.1f} s"
         if result.get("recorded_while_decoding") else
         f"training rows decoded at batch 8 in {result['train_decode_s_batch8']:.0f} s; hidden states recorded by a separate "
         f"forward of every row in {result['record_s']:.1f} s"),
        "target forward at batch 1, context " + str(result["context"]) + ": "
        + ", ".join(f"{w} tok {s * 1e3:.1f} ms" for w, s in sorted(result["target_step_s"].items())),
    ]
    for label, head in result["heads"].items():
        s, c = head["stats"], head["costs"]
        per_token = {k: c["draft"][k] / k for k in ks}
        lines.append(
            f"{label}: {s['steps']} steps, {s['epochs']:.1f} passes over {s['positions']} positions, draft vocab "
            f"{s['draft_vocab_size']} (covers {s['coverage']:.1%}), last-pass accuracy by depth "
            + "/".join(f"{a:.2f}" for a in s["accuracy"])
            + f"; training = {s['seconds'] / (KEY_ROWS * result['decode_s_per_row_b1']):.1%} of a {KEY_ROWS}-row key's decode"
        )
        lines.append(
            f"  head forward per draft token: " + ", ".join(f"k={k} {per_token[k] * 1e3:.2f} ms ({per_token[k] / result['target_step_s'][1]:.2f}x a 1-token target step)" for k in ks)
            + f"; extending its context by 1 token {c['extend'][1] * 1e3:.2f} ms"
        )
        lines.append("  mean accepted length on its training rows: "
                     + ", ".join(f"k={k} {v:.2f}" for k, v in head["train_rows_mean_accepted_len"].items()))
    lines.append("")
    lines.append("| arm (held-out rows) | " + " | ".join(f"k={k} mean acc. len | est. speedup" for k in ks) + " |")
    lines.append("|---|" + "---|---|" * len(ks))
    for label, by_k in result["arms"].items():
        cells = [f"{by_k[k]['mean_accepted_len']:.2f} | {by_k[k]['est_goodput'] / plain:.2f}x" for k in ks]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("(speedup: ESTIMATED goodput from counterfactual acceptance and measured step costs (made non-decreasing in tokens), over plain's "
                 f"{plain:.1f} tok/s at the same context; n-gram and suffix lookups counted free)")
    for b, by_arm in result["measured"].items():
        plain_b = by_arm["plain"]["goodput"]
        lines.append(f"\nMEASURED at batch {b} on the held-out rows (side by side: every arm on each chunk of one batch in turn, "
                     f"{next(iter(by_arm.values()))['slices']} slices an arm):")
        lines.append(f"| arm | goodput tok/s | vs plain | mean acc. len | draft s / decode s | rows = plain | decode s saved on a {KEY_ROWS}-row key (training s) |")
        lines.append("|---|---|---|---|---|---|---|")
        key_decode_s = by_arm["plain"]["decode_s"] * KEY_ROWS / by_arm["plain"]["rows"]  # plain decode of the key at this batch size
        for label, m in by_arm.items():
            saved = key_decode_s * (1 - plain_b / m["goodput"]) if m["goodput"] else float("nan")
            head = result["heads"].get(label.rsplit(" k=", 1)[0])
            trained = f" ({head['stats']['seconds']:.0f})" if head else ""
            lines.append(f"| {label} | {m['goodput']:.1f} | {m['goodput'] / plain_b:.2f}x | {m['mean_accepted_len']:.2f} | "
                         f"{m['draft_s']:.1f} / {m['decode_s']:.1f} | {m['rows_equal_plain']}/{m['rows']} | {saved:.0f}{trained} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
