"""Structured output on an extraction workload, run by `python bench/engine.py --structured`.

Documents describing a person (name, company, age, email, role, city, skills, projects with years),
each to be extracted as a JSON record of one fixed schema (eight fields: strings, an integer, an
enum, a list of strings and a nested list of objects), prompted through the model's chat template.
Side by side in one run, chunk by chunk with the arm order rotating:
- constrained plain vs unconstrained plain, per output token (decode seconds / decode tokens), at
  batch 1 and 8. Target <= 1.15x.
- grammar-forced drafts with n-gram lookup (and forced drafts alone) vs constrained plain at batch 1,
  with the share of output tokens that came as forced drafts. Target >= 1.3x for the best arm.
Every constrained row that stops is checked: its text parses and validates against the schema.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Sequence

from common import results
from common.measure import Measured, command, load_engine, machine_line, ngram_arm, write  # first: puts the checkout on sys.path

from batchspec.engine.base import NO_SPEC, GenerateResult, Request, SamplingParams, SpecConfig
from batchspec.engine.response_format import parse_response_format

# Bounded as an extraction schema is (the documents hold 3 skills and 2 projects): unbounded lists
# and strings let the 135M model repeat one item until max_tokens, which no row would survive.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "company": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 16, "maximum": 99},
        "email": {"type": "string", "maxLength": 60},
        "role": {"enum": ["engineer", "manager", "sales", "support"]},
        "city": {"type": "string", "maxLength": 30},
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3},
        "projects": {"type": "array", "maxItems": 2, "items": {
            "type": "object", "properties": {"title": {"type": "string", "maxLength": 40},
                                             "year": {"type": "integer", "minimum": 1990, "maximum": 2030}},
            "required": ["title", "year"], "additionalProperties": False}},
    },
    "required": ["name", "company", "age", "email", "role", "city", "skills", "projects"],
    "additionalProperties": False,
}
FIRST = ["Maria", "James", "Aiko", "Omar", "Lena", "Carlos", "Priya", "Tom", "Fatima", "Noah", "Ingrid", "Wei"]
LAST = ["Lopez", "Smith", "Tanaka", "Haddad", "Berg", "Silva", "Patel", "Byrne", "Khan", "Keller", "Olsen", "Zhang"]
COMPANIES = ["Northwind Traders", "Acme Robotics", "Blue Harbor Bank", "Greenfield Labs", "Orbit Logistics", "Kite Software"]
CITIES = ["Lisbon", "Toronto", "Osaka", "Nairobi", "Oslo", "Austin", "Pune", "Dublin"]
ROLES = ["engineer", "manager", "sales", "support"]
SKILLS = ["Python", "SQL", "negotiation", "Kubernetes", "customer onboarding", "forecasting", "Rust", "design reviews"]
PROJECTS = ["billing migration", "mobile app launch", "data warehouse", "partner portal", "fraud detection", "support chatbot"]


def document(rng: random.Random) -> str:
    """One short profile in prose: every field of PERSON is in it, in an order of its own."""
    first, last = rng.choice(FIRST), rng.choice(LAST)
    company, city, role = rng.choice(COMPANIES), rng.choice(CITIES), rng.choice(ROLES)
    skills = rng.sample(SKILLS, 3)
    projects = [(p, rng.randint(2015, 2025)) for p in rng.sample(PROJECTS, 2)]
    email = f"{first.lower()}.{last.lower()}@{company.split()[0].lower()}.com"
    return (f"{first} {last} ({rng.randint(24, 61)}) works in {city} as a {role} at {company}. "
            f"Reach them at {email}. Known for {', '.join(skills[:-1])} and {skills[-1]}, "
            f"{first} led the {projects[0][0]} in {projects[0][1]} and the {projects[1][0]} in {projects[1][1]}.")


def extraction_requests(n: int, max_tokens: int, constrained: bool = True, seed: int = 56) -> list[Request]:
    """n extraction rows (chat messages), with PERSON as their response_format or none."""
    rng = random.Random(seed)
    fmt = parse_response_format({"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    out = []
    for i in range(n):
        messages = ({"role": "system", "content": "Extract the person described by the user as one JSON object with the fields "
                                                  "name, company, age, email, role, city, skills and projects (title, year)."},
                    {"role": "user", "content": document(rng)})
        out.append(Request(f"doc-{i}", messages=messages, params=SamplingParams(max_tokens=max_tokens),
                           response_format=fmt if constrained else None))
    return out


def check_json(results: Sequence[GenerateResult], requests: Sequence[Request]) -> dict:
    """Rows that stopped, and how many of them parse and validate against their schema."""
    import jsonschema

    stopped = valid = 0
    for result in results:
        by_id = {r.id: r for r in requests}
        for c in result.completions:
            fmt = by_id[c.id].response_format
            if fmt is None or c.finish_reason != "stop":
                continue
            stopped += 1
            try:
                jsonschema.validate(json.loads(c.text), fmt.schema_dict)
                valid += 1
            except (ValueError, jsonschema.ValidationError):
                pass
    return {"stopped": stopped, "valid": valid}


def run_arms(engine, arms: Sequence[tuple[str, list[Request], SpecConfig, int]], chunk: int):
    """Each arm (label, its requests, spec, batch) over its requests chunk by chunk, the arm order
    rotating each chunk (common.measure.interleaved, for arms whose requests differ)."""
    measured = {label: Measured(label, spec, batch) for label, _, spec, batch in arms}
    rows = {label: reqs for label, reqs, _, _ in arms}
    order = list(measured)
    n = len(arms[0][1])
    for i, begin in enumerate(range(0, n, chunk)):
        for label in order[i % len(order):] + order[: i % len(order)]:
            arm = measured[label]
            arm.add(engine.generate(rows[label][begin : begin + chunk], arm.spec, arm.batch_size))
    return measured


def per_token_s(m) -> float:
    r = m.result
    return m.timing.decode_s / r.decode_tokens if r.decode_tokens else 0.0


def bench_structured(engine, model: str, rows: int, max_tokens: int, ks: Sequence[int]) -> dict:
    """Both comparisons of the module docstring on `rows` documents; a dict of figures."""
    constrained = extraction_requests(rows, max_tokens)
    free = extraction_requests(rows, max_tokens, constrained=False)
    engine.generate(constrained[:2], NO_SPEC, 2)  # warm: the grammar's tokenizer, the schema compiled
    cost = {}
    for batch in (1, 8):
        m = run_arms(engine, [("unconstrained", free, NO_SPEC, batch), ("constrained", constrained, NO_SPEC, batch)], chunk=batch)
        cost[batch] = {"unconstrained_s_per_token": per_token_s(m["unconstrained"]),
                       "constrained_s_per_token": per_token_s(m["constrained"]),
                       "ratio": per_token_s(m["constrained"]) / per_token_s(m["unconstrained"]),
                       "unconstrained": m["unconstrained"].summary(), "constrained": m["constrained"].summary(),
                       "json": check_json(m["constrained"].parts, constrained), "target": 1.15}
    arms = [("constrained plain", constrained, NO_SPEC, 1)]
    arms += [(f"forced+ngram k={k}", constrained, ngram_arm(k), 1) for k in ks]
    arms += [(f"forced alone k={max(ks)}", constrained, SpecConfig("ngram", max(ks), ngram_size=0), 1)]
    m = run_arms(engine, arms, chunk=1)
    base = m["constrained plain"].result
    speed = {}
    for label, arm in m.items():
        r = arm.result
        forced = sum(c.forced_tokens for c in r.completions)
        speed[label] = {**arm.summary(), "speedup": r.goodput / base.goodput if base.goodput else 0.0,
                        "forced_tokens": forced, "forced_share": forced / r.output_tokens if r.output_tokens else 0.0,
                        "json": check_json(arm.parts, constrained)}
        assert [c.token_ids for c in r.completions] == [c.token_ids for c in base.completions], label  # lossless
    best = max((s for label, s in speed.items() if label.startswith("forced+ngram")), key=lambda s: s["speedup"])
    return {"model": model, "rows": rows, "max_tokens": max_tokens, "cost_per_token": cost, "speculation": speed,
            "best": best["label"], "best_speedup": best["speedup"], "speedup_target": 1.3}


def markdown(data: dict) -> str:
    lines = ["| comparison | batch | baseline s/token | candidate s/token | ratio | target | stopped rows valid JSON |", "|---|---|---|---|---|---|---|"]
    for batch, c in data["cost_per_token"].items():
        lines.append(f"| constrained vs unconstrained plain, per output token | {batch} | {c['unconstrained_s_per_token'] * 1e3:.1f} ms "
                     f"| {c['constrained_s_per_token'] * 1e3:.1f} ms | {c['ratio']:.2f}x | <= {c['target']}x | {c['json']['valid']}/{c['json']['stopped']} |")
    lines += ["", "| arm (batch 1) | goodput tok/s | speedup vs constrained plain | acceptance | mean accepted len | forced share of output | stopped rows valid JSON |",
              "|---|---|---|---|---|---|---|"]
    for label, s in data["speculation"].items():
        acc = "-" if s["acceptance_rate"] is None else f"{s['acceptance_rate']:.2f}"
        mal = "-" if s["mean_accepted_len"] is None else f"{s['mean_accepted_len']:.2f}"
        lines.append(f"| {label} | {s['goodput']:.1f} | {s['speedup']:.2f}x | {acc} | {mal} | {s['forced_share']:.0%} | {s['json']['valid']}/{s['json']['stopped']} |")
    return "\n".join(lines)


# The headline figures --record appends (bench "engine", its args saying structured).
def metrics(data: dict) -> dict:
    best = data["speculation"][data["best"]]
    return {"constrained_vs_free_per_token_b1": round(data["cost_per_token"][1]["ratio"], 3),
            "constrained_vs_free_per_token_b8": round(data["cost_per_token"][8]["ratio"], 3),
            "forced_ngram_vs_constrained_b1": round(data["best_speedup"], 3),
            "forced_share": round(best["forced_share"], 3)}


def main(args, argv, info: dict) -> dict:
    """`bench/engine.py --structured`: load --model, run `bench_structured`, print its tables; with
    --out also OUT/engine_structured.*, with --record its figures in bench/results.jsonl."""
    rows, max_tokens = (4, args.max_tokens or 160) if args.quick else (8, args.max_tokens or 160)
    engine = load_engine(args.model, args.dtype)
    data = bench_structured(engine, args.model, rows, max_tokens, (4, 8))
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    data = {"benchmark": "engine_structured", "machine": info, **data}
    table = markdown(data)
    md = (f"# Structured output: extraction\n\n`{command('bench/engine.py', argv)}`, {info['date_utc']}: {machine_line(info)}, "
          f"{args.dtype}, greedy, {rows} documents, max_tokens {max_tokens}, model {args.model}. Ratios within this one run.\n\n{table}")
    write(Path(args.out) if args.out else None, "engine_structured", data, md, table)
    data["record"] = results.record("engine", "bench/engine.py", args, argv, metrics(data))
    return data
