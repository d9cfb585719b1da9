"""Make examples/prompts.parquet: a few hundred prompts over four workloads, generated here from
templates and a seeded random generator (nothing downloaded).

Workloads (column `task`, for `--shard-by task`):
- code: small Python functions to write or complete;
- extract: pull fields out of a short record into JSON;
- edit: copy-heavy rewrites of a given paragraph (where n-gram prompt lookup pays best);
- prose: free-form short writing (where speculation pays least).

    python examples/make_prompts.py [--rows-per-task 64] [--out examples/prompts.parquet]
"""

from __future__ import annotations

import argparse
import random

import pyarrow as pa
import pyarrow.parquet as pq

NAMES = ["Ada", "Bruno", "Chen", "Dalia", "Emeka", "Farah", "Goran", "Hana", "Ivan", "Jun", "Kemal", "Lena"]
CITIES = ["Lisbon", "Nairobi", "Osaka", "Quito", "Tallinn", "Lyon", "Pune", "Perth", "Bergen", "Accra"]
PRODUCTS = ["standing desk", "espresso grinder", "trail backpack", "noise-cancelling headphones", "e-reader", "cast-iron pan"]
TOPICS = ["a lighthouse keeper", "the first snow of winter", "a city at dawn", "an old library", "a long train journey", "a garden after rain"]
FUNCTIONS = [
    ("is_palindrome", "s: str", "bool", "returns True when s reads the same backwards, ignoring case and spaces"),
    ("chunk", "items: list, size: int", "list[list]", "splits items into consecutive lists of at most size elements"),
    ("word_counts", "text: str", "dict[str, int]", "counts how often each lower-cased word occurs in text"),
    ("flatten", "nested: list", "list", "flattens arbitrarily nested lists into one list"),
    ("median", "values: list[float]", "float", "returns the median of a non-empty list of numbers"),
    ("dedupe", "items: list", "list", "removes duplicates while keeping the first occurrence order"),
    ("clamp", "x: float, lo: float, hi: float", "float", "limits x to the closed range [lo, hi]"),
    ("rle", "s: str", "str", "run-length encodes s, e.g. 'aaab' -> 'a3b1'"),
]
PARAGRAPHS = [
    "The meeting is moved from Tuesday to Thursday at 10am in room 4B. Please bring the quarterly report, "
    "the updated budget sheet and your notes on the supplier review. Lunch will be provided for everyone attending.",
    "Our store opens at 9am on weekdays and 10am on weekends. Returns are accepted within 30 days with a receipt. "
    "Gift cards cannot be exchanged for cash and are valid for two years from the date of purchase.",
    "To reset your password, open the settings page, choose Security, then select Reset password. "
    "A link will be sent to your email address. The link expires after 24 hours, so use it promptly.",
    "The library will be closed on Monday for maintenance. Books due that day may be returned on Tuesday "
    "without a late fee. The reading room reopens on Wednesday with new opening hours from 8am to 8pm.",
]
EDITS = [
    "Rewrite the paragraph below, changing every weekday name to the following day and keeping everything else identical.",
    "Copy the paragraph below exactly, but replace every number written with digits by the same number in words.",
    "Repeat the paragraph below word for word, then add one sentence at the end thanking the reader.",
    "Rewrite the paragraph below in British spelling, keeping the wording otherwise unchanged.",
]


def code_prompt(rng: random.Random) -> str:
    name, args, ret, doc = rng.choice(FUNCTIONS)
    style = rng.choice(["with a docstring and type hints", "in idiomatic Python", "with one doctest example"])
    return f"Write a Python function `{name}({args}) -> {ret}` that {doc}, {style}. Reply with code only."


def extract_prompt(rng: random.Random) -> str:
    name, city, product = rng.choice(NAMES), rng.choice(CITIES), rng.choice(PRODUCTS)
    qty, price, day = rng.randint(1, 9), rng.randint(20, 900), rng.randint(1, 28)
    record = (
        f"Order note: {name} from {city} ordered {qty} x {product} on 2025-03-{day:02d} "
        f"for {price} EUR each, paid by card, delivery to the {city} branch."
    )
    return (
        f"{record}\nExtract the fields as JSON with keys customer, city, product, quantity, unit_price_eur, "
        "order_date. Reply with the JSON object only."
    )


def edit_prompt(rng: random.Random) -> str:
    return f"{rng.choice(EDITS)}\n\n{rng.choice(PARAGRAPHS)}"


def prose_prompt(rng: random.Random) -> str:
    form = rng.choice(["a short poem", "a four-sentence story", "a brief diary entry", "a product-free haiku sequence"])
    return f"Write {form} about {rng.choice(TOPICS)}."


MAKERS = {"code": code_prompt, "extract": extract_prompt, "edit": edit_prompt, "prose": prose_prompt}


def make_table(rows_per_task: int, seed: int = 0) -> pa.Table:
    rng = random.Random(seed)
    ids, tasks, prompts = [], [], []
    # Grouped by task, so even without --shard-by the default shard size (32) cuts task-pure shards
    # and each workload gets its own calibration under `make run`.
    for task, make in MAKERS.items():
        for i in range(rows_per_task):
            ids.append(f"{task}-{i:04d}")
            tasks.append(task)
            prompts.append(make(rng))
    return pa.table({"id": ids, "task": tasks, "prompt": prompts})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows-per-task", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="examples/prompts.parquet")
    args = parser.parse_args()
    table = make_table(args.rows_per_task, args.seed)
    pq.write_table(table, args.out)
    print(f"wrote {table.num_rows} prompts to {args.out}")


if __name__ == "__main__":
    main()
