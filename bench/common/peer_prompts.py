"""Held-out chat prompts for bench/peer.py: text nobody on this project wrote, at 300-600 tokens.

The text comes from what is already installed on this machine: the long descriptions (PyPI
READMEs) in the METADATA of the packages in this Python's environment, and the source of Python's
standard library. A seeded generator picks a source, a starting paragraph and a task (summarize,
rewrite, extract as JSON, continue code), then cuts the text so the prompt, chat template
applied, lands at a length drawn from [min_tokens, max_tokens]. The same seed on the same
environment gives the same prompts; another seed gives others. batchspec's own package is never
a source (its description is this project's README).

It knows nothing about engines or timing: a tokenizer in, token ids and their provenance out.
Run as a script it writes such prompts as a prompt Parquet (`id`, `task`, `source`, `messages`),
the input `batchspec run` reads and `bench/calibrate.py --input` shards by `task`:

    python bench/common/peer_prompts.py --out /tmp/held_out.parquet --rows 256 --seed 7
"""

from __future__ import annotations

import random
import sysconfig
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

TASKS = {
    "summarize": "Summarize the following text in five short bullet points.\n\n{text}",
    "rewrite": "Rewrite the following text in plain English for a newcomer, keeping every fact.\n\n{text}",
    "extract": ("From the following text, extract a JSON object with the keys name, purpose, install_command, "
                "requirements (a list) and license; use null where the text says nothing. Answer with JSON only.\n\n{text}"),
    "continue": "Continue this Python module: write the next function, in the same style, with a docstring.\n\n```python\n{text}\n```",
}
OWN = {"batchspec"}  # distributions whose text this project wrote


@dataclass(frozen=True)
class HeldOut:
    """One prompt: its token ids (chat template applied) and where its text came from."""

    id: str
    task: str
    source: str  # distribution name or stdlib file
    messages: tuple[dict[str, str], ...]
    token_ids: tuple[int, ...]


def prose_sources(min_chars: int = 3000) -> list[tuple[str, str]]:
    """(distribution, long description) of installed packages, sorted by name."""
    seen: dict[str, str] = {}
    for dist in metadata.distributions():
        name = (dist.metadata.get("Name") or "").lower()
        if not name or name in OWN or name in seen:
            continue
        body = dist.metadata.get("Description") or dist.metadata.get_payload() or ""
        if len(body) >= min_chars:
            seen[name] = body
    return sorted(seen.items())


def code_sources(min_chars: int = 4000) -> list[tuple[str, str]]:
    """(relative path, source) of standard-library modules, sorted by path (tests left out)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        rel = path.relative_to(root).as_posix()
        if "test" in rel or "site-packages" in rel:
            continue
        text = path.read_text(errors="replace")
        if len(text) >= min_chars:
            out.append((rel, text))
    return out


def encode(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def fit(tokenizer, task: str, text: str, length: int, low: int, high: int) -> tuple[list[dict[str, str]], list[int]] | None:
    """Cut `text` so the templated prompt has about `length` tokens (within [low, high])."""
    words = tokenizer(text, add_special_tokens=False)["input_ids"]
    overhead = len(encode(tokenizer, [{"role": "user", "content": TASKS[task].format(text="")}]))
    keep = length - overhead
    for _ in range(6):  # decoding a cut and re-encoding can shift the count by a few tokens
        if keep <= 0 or keep > len(words):
            return None
        messages = [{"role": "user", "content": TASKS[task].format(text=tokenizer.decode(words[:keep]).strip())}]
        ids = encode(tokenizer, messages)
        if low <= len(ids) <= high:
            return messages, ids
        keep += length - len(ids)
    return None


def held_out(tokenizer, n: int, seed: int = 0, low: int = 300, high: int = 600,
             tasks: tuple[str, ...] = tuple(TASKS)) -> list[HeldOut]:
    """n prompts, tasks in rotation (so any n mixes them), each from a seeded random source."""
    rng = random.Random(f"peer-{seed}")
    prose, code = prose_sources(), code_sources()
    out: list[HeldOut] = []
    used: set[tuple[str, int]] = set()
    while len(out) < n:
        task = tasks[len(out) % len(tasks)]
        name, text = rng.choice(code if task == "continue" else prose)
        paragraphs = [p for p in text.split("\n\n") if p.strip()]
        start = rng.randrange(max(1, len(paragraphs) // 2))
        if (name, start) in used:
            continue
        fitted = fit(tokenizer, task, "\n\n".join(paragraphs[start:]), rng.randint(low, high), low, high)
        if fitted is None:
            continue
        used.add((name, start))
        messages, ids = fitted
        out.append(HeldOut(f"{task}-{len(out)}", task, name, tuple(messages), tuple(ids)))
    return out


def write_parquet(prompts: list[HeldOut], out: str) -> None:
    """`prompts` as a prompt Parquet: id, task, source, messages (a list of {role, content})."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [p.id for p in prompts], "task": [p.task for p in prompts],
                             "source": [p.source for p in prompts],
                             "messages": [list(p.messages) for p in prompts],
                             "prompt_tokens": [len(p.token_ids) for p in prompts]}), out)


def main(argv: list[str] | None = None) -> None:
    import argparse

    from transformers import AutoTokenizer

    from batchspec.models import resolve_model

    parser = argparse.ArgumentParser(description="Write held-out chat prompts as a prompt Parquet.")
    parser.add_argument("--out", required=True)
    parser.add_argument("--rows", type=int, default=256, help="in all, the tasks in rotation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="smollm2-135m", help="whose chat template and tokenizer set the lengths")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--min-tokens", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=600)
    args = parser.parse_args(argv)
    tasks = tuple(args.tasks.split(","))
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        parser.error(f"unknown task {unknown[0]!r}; tasks: {', '.join(TASKS)}")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.model))
    prompts = held_out(tokenizer, args.rows, args.seed, args.min_tokens, args.max_tokens, tasks)
    write_parquet(prompts, args.out)
    lengths = sorted(len(p.token_ids) for p in prompts)
    print(f"{args.out}: {len(prompts)} prompts ({', '.join(tasks)}), {lengths[0]}-{lengths[-1]} tokens "
          f"(median {lengths[len(lengths) // 2]}), seed {args.seed}")


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's batchspec
    main()
