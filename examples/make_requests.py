"""Make examples/requests.jsonl: the prompts of examples/prompts.parquet as a Batch API request file
(one JSON line per request: custom_id, method, url, body), the tasks interleaved as a file written
by an application would have them.

Per task: code alternates chat and completions lines (a completions prompt is text the model
continues), extract asks for JSON under a `response_format` json_schema, edit is chat, prose
alternates chat and completions. Every body names the packaged model and max_tokens 24, greedy.

    python examples/make_requests.py [--prompts examples/prompts.parquet] [--out examples/requests.jsonl]
    batchspec run examples/requests.jsonl out-requests --shard-by url
    batchspec export out-requests results.jsonl --format batch-api
"""

from __future__ import annotations

import argparse
import itertools
import json

import pyarrow.parquet as pq

MODEL = "smollm2-135m"
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
ORDER = {"type": "json_schema", "json_schema": {"name": "order", "strict": True, "schema": {
    "type": "object",
    "properties": {"customer": {"type": "string"}, "city": {"type": "string"}, "product": {"type": "string"},
                   "quantity": {"type": "integer"}, "unit_price_eur": {"type": "number"}, "order_date": {"type": "string"}},
    "required": ["customer", "city", "product", "quantity", "unit_price_eur", "order_date"],
    "additionalProperties": False}}}


def request(custom_id: str, task: str, n: int, prompt: str) -> dict:
    body: dict = {"model": MODEL, "max_tokens": 24, "temperature": 0.0}
    if task in ("code", "prose") and n % 2:
        return {"custom_id": custom_id, "method": "POST", "url": COMPLETIONS, "body": {**body, "prompt": prompt + "\n"}}
    body["messages"] = [{"role": "user", "content": prompt}]
    if task == "extract":
        body["response_format"] = ORDER
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}


def lines(prompts: str) -> list[dict]:
    rows = pq.read_table(prompts).to_pylist()
    by_task: dict[str, list[dict]] = {}
    for r in rows:
        by_task.setdefault(r["task"], []).append(r)
    interleaved = [r for group in itertools.zip_longest(*by_task.values()) for r in group if r is not None]
    counters: dict[str, int] = {}
    out = []
    for i, r in enumerate(interleaved):
        n = counters[r["task"]] = counters.get(r["task"], -1) + 1
        out.append(request(f"request-{i:04d}-{r['id']}", r["task"], n, r["prompt"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default="examples/prompts.parquet")
    parser.add_argument("--out", default="examples/requests.jsonl")
    args = parser.parse_args()
    made = lines(args.prompts)
    with open(args.out, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(line, ensure_ascii=False) + "\n" for line in made)
    print(f"wrote {len(made)} request lines to {args.out}")


if __name__ == "__main__":
    main()
