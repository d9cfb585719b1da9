"""Make the held-out prompts of the calibration simulator: workloads nobody tuned the rule on.

The tuning grid (docs/calibration.md) runs examples/make_prompts.py's four workloads (code, edit,
extract, prose). These are other templates, drawn from another seed, so that a rule tuned there
is judged where it was not:

- sql: a query to write over a named table (code-like, short);
- rename: a given function returned whole with one identifier renamed (copy-heavy code);
- yaml: a record re-written as YAML (structured, copies its values);
- reply: a short reply to a customer message (prose);
- outline: a numbered outline of a talk (list-like prose).

Two tables, one per column to shard by:

- `workload`: each workload's rows (`--rows-per-workload`, 2048 by default, so shards of 40, 256
  and 2048 rows are the first rows of one pool: `bench/sim.py --rows N`);
- `key`: a job of many small keys (`--keys`, 50 by default), each key one template variant of one
  workload with 40-200 rows, as `--shard-by` on a column of high cardinality makes it.

Every row's prompt is drawn from a small set per variant (rows of one prompt share one greedy
output, recorded once), so a large job costs few recordings.

    python bench/heldout.py [--seed 7] [--rows-per-workload 2048] [--keys 50] --out heldout.parquet
"""

from __future__ import annotations

import argparse
import random

import pyarrow as pa
import pyarrow.parquet as pq

TABLES = [
    ("orders", "id, customer_id, total, placed_at"), ("users", "id, email, country, created_at"),
    ("flights", "id, origin, destination, departs_at, seats"), ("invoices", "id, account, amount, due_date, paid"),
    ("sensors", "id, site, reading, taken_at"), ("books", "id, title, author, year, copies"),
]
QUERIES = [
    "counts the rows per {col} and keeps the five largest counts", "returns the rows of the last 7 days, newest first",
    "computes the average of {col} per month", "finds duplicate values of {col}",
]
FUNCTIONS = [
    "def total(xs):\n    acc = 0\n    for x in xs:\n        acc = acc + x\n    return acc\n",
    "def longest(words):\n    best = ''\n    for w in words:\n        if len(w) > len(best):\n            best = w\n    return best\n",
    "def evens(nums):\n    out = []\n    for n in nums:\n        if n % 2 == 0:\n            out.append(n)\n    return out\n",
    "def count_vowels(text):\n    seen = 0\n    for ch in text.lower():\n        if ch in 'aeiou':\n            seen += 1\n    return seen\n",
]
RENAMES = [("acc", "running"), ("best", "winner"), ("out", "result"), ("seen", "tally"), ("xs", "values"), ("w", "word")]
PEOPLE = ["Amara Okafor", "Bjorn Lind", "Carmen Ruiz", "Deepa Nair", "Elif Kaya", "Felix Braun", "Grace Mwangi"]
ROLES = ["data engineer", "nurse", "pilot", "teacher", "chef", "architect"]
COMPLAINTS = [
    "my parcel arrived two days late and the box was damaged", "I was charged twice for the same subscription",
    "the app logs me out every time I switch screens", "the replacement part you sent does not fit my model",
    "nobody answered my last two emails about the refund",
]
TALKS = ["caching for web services", "growing tomatoes on a balcony", "the history of the bicycle",
         "writing good unit tests", "saving money on groceries", "how tides work"]


def sql_prompt(rng: random.Random, variant: int) -> str:
    table, cols = TABLES[variant % len(TABLES)]
    col = rng.choice(cols.split(", ")[1:])
    return (f"Table `{table}` has columns {cols}. Write one SQL query that "
            f"{rng.choice(QUERIES).format(col=col)}. Reply with the SQL only.")


def rename_prompt(rng: random.Random, variant: int) -> str:
    body = FUNCTIONS[variant % len(FUNCTIONS)]
    old, new = next(((a, b) for a, b in RENAMES if a in body), ("x", "item"))
    return f"Rename `{old}` to `{rng.choice([new, new + '_'])}` in this function and return the whole function:\n\n{body}"


def yaml_prompt(rng: random.Random, variant: int) -> str:
    person = PEOPLE[variant % len(PEOPLE)]
    return (f"Employee record: {person}, {rng.choice(ROLES)}, joined {rng.randint(2010, 2024)}, "
            f"badge {rng.randint(100, 999)}, office floor {rng.randint(1, 6)}. "
            "Rewrite it as YAML with keys name, role, joined, badge, floor.")


def reply_prompt(rng: random.Random, variant: int) -> str:
    tone = ["apologetic", "friendly", "formal"][variant % 3]
    return f"Write a short {tone} reply to a customer who says: \"{rng.choice(COMPLAINTS)}\"."


def outline_prompt(rng: random.Random, variant: int) -> str:
    return f"Give a numbered outline of {rng.choice([4, 5, 6])} points for a talk on {TALKS[variant % len(TALKS)]}."


MAKERS = {"sql": sql_prompt, "rename": rename_prompt, "yaml": yaml_prompt, "reply": reply_prompt, "outline": outline_prompt}
POOL = 12  # distinct prompts per workload variant: rows beyond repeat them (one recording each)


def pool(make, seed: int, variant: int) -> list[str]:
    rng = random.Random(seed * 1000 + variant)
    return [make(rng, variant) for _ in range(POOL)]


def make_table(rows_per_workload: int, keys: int, seed: int) -> pa.Table:
    rng = random.Random(seed)
    ids, workloads, key_col, prompts = [], [], [], []
    for name, make in MAKERS.items():  # the workloads' pools: every variant's prompts, in a seeded order
        prompts_of = [p for v in range(3) for p in pool(make, seed, v)]
        for i in range(rows_per_workload):
            ids.append(f"{name}-{i:05d}")
            workloads.append(name)
            key_col.append("")
            prompts.append(prompts_of[rng.randrange(len(prompts_of))])
    names = list(MAKERS)
    for k in range(keys):  # many small keys: one variant of one workload each, 40-200 rows
        name = names[k % len(names)]
        own = pool(MAKERS[name], seed, 3 + k // len(names))
        for i in range(rng.randint(40, 200)):
            ids.append(f"k{k:02d}-{i:04d}")
            workloads.append("")
            key_col.append(f"k{k:02d}-{name}")  # in key order the workloads alternate, as a job meets them
            prompts.append(own[rng.randrange(len(own))])
    return pa.table({"id": ids, "workload": workloads, "key": key_col, "prompt": prompts})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--rows-per-workload", type=int, default=2048)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--out", default="heldout.parquet")
    args = parser.parse_args()
    table = make_table(args.rows_per_workload, args.keys, args.seed)
    pq.write_table(table, args.out)
    print(f"wrote {table.num_rows} prompts ({len(set(table.column('prompt').to_pylist()))} distinct) to {args.out}")


if __name__ == "__main__":
    main()
