"""The benchmark prompt sets: four workloads as chat requests, built from templates and a seeded
random generator (nothing downloaded), shared by bench/engine.py and bench/calibrate.py.

- code: write or complete a small Python function (draft-model speculation pays here);
- extract: pull fields out of a short free-text record into JSON;
- edit: copy-heavy edits that return the whole input (add type hints, rename a variable, copy a
  paragraph with one change): the output repeats much of the prompt, where n-gram lookup pays;
- prose: free-form stories and poems (speculation pays least).

Prompts are chat `messages` so instruct models answer rather than continue the text. The word
lists and simple templates come from examples/make_prompts.py; this module adds the longer code
snippets the copy-heavy edits need. It knows nothing about engines or timing.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A benchmark measures the package beside it: the checkout's batchspec comes before any installed
# one (another checkout's editable install would otherwise be timed instead).
for _path in (ROOT / "examples", ROOT):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import make_prompts as mp  # noqa: E402  (examples/ is not a package)

from batchspec.engine.base import Request, SamplingParams  # noqa: E402

WORKLOADS = ("code", "extract", "edit", "prose")

# Small, real functions for the copy-heavy edits (each has a variable worth renaming).
SNIPPETS = [
    ("total", '''def order_total(items, tax_rate, discount):
    total = 0
    for item in items:
        total += item["price"] * item["quantity"]
    if discount:
        total = total - total * discount
    total = total + total * tax_rate
    return round(total, 2)


def cheapest(items):
    best = None
    for item in items:
        if best is None or item["price"] < best["price"]:
            best = item
    return best
'''),
    ("words", '''def top_words(text, n):
    counts = {}
    words = text.lower().split()
    for word in words:
        word = word.strip(".,;:!?")
        if word:
            counts[word] = counts.get(word, 0) + 1
    ranked = sorted(counts.items(), key=lambda pair: pair[1], reverse=True)
    return ranked[:n]


def longest_word(text):
    words = text.split()
    return max(words, key=len) if words else ""
'''),
    ("rows", '''def parse_csv_line(line, sep):
    fields = []
    current = ""
    for ch in line:
        if ch == sep:
            fields.append(current.strip())
            current = ""
        else:
            current += ch
    fields.append(current.strip())
    return fields


def parse_csv(text, sep):
    rows = []
    for line in text.splitlines():
        if line.strip():
            rows.append(parse_csv_line(line, sep))
    return rows
'''),
    ("stack", '''class Stack:
    def __init__(self):
        self.items = []

    def push(self, value):
        self.items.append(value)

    def pop(self):
        if not self.items:
            raise IndexError("pop from an empty stack")
        return self.items.pop()

    def peek(self):
        return self.items[-1] if self.items else None

    def size(self):
        return len(self.items)
'''),
    ("result", '''def binary_search(values, target):
    low = 0
    high = len(values) - 1
    while low <= high:
        middle = (low + high) // 2
        if values[middle] == target:
            return middle
        if values[middle] < target:
            low = middle + 1
        else:
            high = middle - 1
    return -1


def insert_sorted(values, value):
    result = list(values)
    index = 0
    while index < len(result) and result[index] < value:
        index += 1
    result.insert(index, value)
    return result
'''),
    ("seconds", '''def format_duration(seconds):
    hours = seconds // 3600
    minutes = (seconds % 3600) // 60
    rest = seconds % 60
    parts = []
    if hours:
        parts.append(f"{hours}h")
    if minutes:
        parts.append(f"{minutes}m")
    if rest or not parts:
        parts.append(f"{rest}s")
    return " ".join(parts)


def parse_duration(text):
    seconds = 0
    for part in text.split():
        unit = part[-1]
        amount = int(part[:-1])
        seconds += amount * {"h": 3600, "m": 60, "s": 1}[unit]
    return seconds
'''),
]
RENAMES = {"total": "amount", "words": "tokens", "rows": "records", "stack": "items", "result": "output", "seconds": "duration"}
CODE_EDITS = [
    "Add Python type hints to every function signature in the code below. Return the whole code, otherwise unchanged, in one code block.",
    "Rename the variable `{old}` to `{new}` everywhere in the code below. Return the whole code, otherwise unchanged, in one code block.",
    "Add a check at the top of each function that raises ValueError on empty input. Return the whole code, otherwise unchanged, in one code block.",
]
EMAILS = [
    "Hi team, {name} here from the {city} office. I placed an order for {qty} {product}s on March {day} at "
    "{price} EUR per unit; please charge it to our card on file and ship it to {city}. Thanks!",
    "Support ticket #{day}{qty}: customer {name} ({city}) reports that {qty} units of the {product} ordered on "
    "2025-03-{day:02d} at {price} EUR each arrived damaged and asks for a refund.",
]
STORIES = ["a short story", "a bedtime story", "a short fable with a moral", "a poem of three stanzas"]
HEROES = ["a fox who wanted to fly", "two rival bakers", "a robot gardener", "a girl who collects lost keys", "a retired pirate"]


def code_text(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return mp.code_prompt(rng)
    name, args, ret, doc = rng.choice(mp.FUNCTIONS)
    return f'Complete this Python function. Reply with code only.\n\ndef {name}({args}) -> {ret}:\n    """{doc[0].upper()}{doc[1:]}."""\n'


def extract_text(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return mp.extract_prompt(rng)
    fields = dict(name=rng.choice(mp.NAMES), city=rng.choice(mp.CITIES), product=rng.choice(mp.PRODUCTS),
                  qty=rng.randint(1, 9), price=rng.randint(20, 900), day=rng.randint(1, 28))
    return (f"{rng.choice(EMAILS).format(**fields)}\n\nExtract customer, city, product, quantity, unit_price_eur "
            "and order_date from the message above as a JSON object. Reply with the JSON only.")


def edit_text(rng: random.Random) -> str:
    if rng.random() < 0.25:
        return mp.edit_prompt(rng)
    old, code = rng.choice(SNIPPETS)
    instruction = rng.choice(CODE_EDITS).format(old=old, new=RENAMES[old])
    return f"{instruction}\n\n```python\n{code}```"


def prose_text(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return mp.prose_prompt(rng)
    return f"Write {rng.choice(STORIES)} about {rng.choice(HEROES)}."


# Workloads whose rows share structure (suffix drafting across the rows of a shard): one
# output schema, one boilerplate, one template per workload, filled from seeded fields. Not in
# WORKLOADS (the other benches' mix); bench/common/suffix.py runs them beside prose.
SHARED_WORKLOADS = ("schema", "boilerplate", "templated")
ISSUES = ["arrived damaged", "was never delivered", "was charged twice", "stopped working after a week", "is missing a part"]
COMPANIES = ["Northwind", "Blue Harbor", "Kestrel Labs", "Mosaic Foods", "Tidewater", "Ardent Print"]
VERBS = ["scale", "merge", "filter", "parse", "score", "rank", "load", "split"]
NOUNS = ["orders", "records", "events", "readings", "invoices", "users", "rows", "tickets"]
CHANGES = ["faster exports", "a dark mode", "offline sync", "two-factor sign-in", "bulk editing", "a new reports page"]


def schema_text(rng: random.Random) -> str:
    """A support message, extracted to one fixed JSON schema (the same keys in every row)."""
    f = dict(name=rng.choice(mp.NAMES), company=rng.choice(COMPANIES), city=rng.choice(mp.CITIES),
             product=rng.choice(mp.PRODUCTS), qty=rng.randint(1, 40), day=rng.randint(1, 28),
             order=rng.randint(10000, 99999), issue=rng.choice(ISSUES))
    message = (f"Hello, this is {f['name']} from {f['company']} in {f['city']}. Our order #{f['order']} of {f['qty']} "
               f"{f['product']}s placed on 2025-04-{f['day']:02d} {f['issue']}. Please advise.")
    return ("Extract the fields below from the message as a JSON object with exactly these keys, in this order: "
            "customer, company, city, order_id, product, quantity, order_date, issue, priority. Reply with the JSON only.\n\n"
            f"Message: {message}")


def boilerplate_text(rng: random.Random) -> str:
    """A small function to wrap in the same logging boilerplate (import, logger, entry/exit logs)."""
    verb, noun = rng.choice(VERBS), rng.choice(NOUNS)
    arg, factor = rng.choice(["items", "values", "data", "batch"]), rng.randint(2, 9)
    body = (f"def {verb}_{noun}({arg}, limit={rng.randint(5, 50)}):\n    out = []\n    for x in {arg}[:limit]:\n"
            f"        out.append(x * {factor})\n    return out\n")
    return ("Add logging to the function below: `import logging` at the top, `logger = logging.getLogger(__name__)`, "
            "a `logger.debug` call logging the arguments on entry and one logging the result before it returns. "
            f"Return the whole code, otherwise unchanged, in one code block.\n\n```python\n{body}```")


def templated_text(rng: random.Random) -> str:
    """A release note rewritten into one fixed announcement template."""
    product, change = rng.choice(mp.PRODUCTS).title(), rng.choice(CHANGES)
    version = f"{rng.randint(1, 9)}.{rng.randint(0, 20)}"
    note = f"v{version} of {product} ships {change}; users on plan {rng.choice('ABC')} get it first, others on day {rng.randint(2, 30)}."
    return ("Rewrite the release note below into this announcement template, filling in every bracket and keeping "
            "the rest word for word:\n\nDear customer,\nWe are happy to announce [product] [version].\n"
            "What is new: [change].\nWho gets it: [who].\nThank you for choosing us.\n\n"
            f"Release note: {note}")


MAKERS = {"code": code_text, "extract": extract_text, "edit": edit_text, "prose": prose_text,
          "schema": schema_text, "boilerplate": boilerplate_text, "templated": templated_text}


def prompts(workload: str, n: int, seed: int = 0) -> list[str]:
    """`n` prompt texts of one workload; the same (workload, n, seed) always gives the same list."""
    assert workload in MAKERS, workload
    rng = random.Random(f"{workload}-{seed}")
    return [MAKERS[workload](rng) for _ in range(n)]


def requests(workload: str, n: int, max_tokens: int, seed: int = 0) -> list[Request]:
    """`n` greedy chat requests of one workload, ids `<workload>-<i>`."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return [Request(f"{workload}-{i:04d}", messages=({"role": "user", "content": text},), params=params)
            for i, text in enumerate(prompts(workload, n, seed))]


def from_input(path: str, key: str, max_tokens: int) -> tuple[dict[str, list[Request]], list[str]]:
    """A prompt Parquet that is not the bench's own (prompts the project did not write), read as
    `batchspec run` reads its input (batchspec.parse: a `prompt` or `messages` column, the
    optional per-row sampling columns, `max_tokens` defaulting to `max_tokens`, greedy unless the
    row says otherwise), grouped by the column `key` as `--shard-by` would (its values as the
    pipeline names them, a null one "null"), in file order.
    Returns ({key value: requests}, one line per row that cannot run: those rows are left out and
    the bench says how many)."""
    import pyarrow.parquet as pq

    from batchspec.parse import RowDefaults, parse_rows
    from batchspec.read import key_strings, open_input

    open_input(path, shard_by=key)  # the pipeline's own check of the columns (InputError, one line)
    table = pq.read_table(path)
    keys = ["null" if k is None else k for k in key_strings(table, key).to_pylist()]
    ids = [str(i) for i in table.column("id").to_pylist()] if "id" in table.column_names else \
        [f"{k}-{i:05d}" for i, k in enumerate(keys)]
    groups: dict[str, list[Request]] = {}
    bad = []
    for k, row in zip(keys, parse_rows(table, ids, RowDefaults(max_tokens, 0.0, 1.0, None))):
        if row.error:
            bad.append(f"{row.request.id}: {row.error}")
        else:
            groups.setdefault(k, []).append(row.request)
    return groups, bad

