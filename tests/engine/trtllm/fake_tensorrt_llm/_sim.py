"""What the stand-in simulates instead of a GPU: device memory, a clock, models and a tokenizer.

The GPUs a process sees (like a Ray actor's: as many as CUDA_VISIBLE_DEVICES names, else one),
each of a fixed size. Each LLM spans tensor_parallel_size x pipeline_parallel_size of them; on each
it takes its share of the weights, then `free_gpu_memory_fraction` of what is still free for its
KV cache, and holds both until `shutdown()` (SOURCES.md: the behaviour issue 13 read from llm_args.py /
KvCacheConfig and the executor's KV-cache sizing). A simulated clock advances with builds and
iterations so timings are deterministic; nothing here sleeps.

The "models" are deterministic functions over byte tokens: a target whose greedy next token
depends on the last two tokens (so text repeats and n-gram lookup finds matches), drafts that
agree with the target's greedy token at a fixed rate, and a sampled path drawn from a seeded RNG.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

GIB = 2**30
BOS, EOS = 1, 2
ALPHABET = [3 + b for b in b"abcdefgh "]  # token ids the fake target writes


class OutOfMemoryError(RuntimeError):
    """torch.OutOfMemoryError's message shape ("CUDA out of memory. Tried to allocate ...")."""


@dataclass
class SimulatedGPU:
    """One device. An LLM's memory is held by its executor's worker process, which exits some time
    after `LLM.shutdown()` returns (SOURCES.md, "Shutdown"): `release_later` hands it back only
    after `release_queries` more queries of the device (`mem_get_info`, what a caller polls and
    what the next LLM's KV-cache sizing reads) have still seen it held."""

    total_bytes: int = 80 * GIB
    held: dict[int, tuple[str, int]] = field(default_factory=dict)  # owner id -> (what, bytes)
    releasing: dict[int, int] = field(default_factory=dict)  # owner id -> queries that still see it held
    queries: int = 0  # mem_get_info calls so far

    def free_bytes(self) -> int:
        return self.total_bytes - sum(b for _, b in self.held.values())

    def mem_get_info(self, device=None) -> tuple[int, int]:
        """torch.cuda.mem_get_info(): (free, total), a query of the device: memory of an exiting
        worker process shows free once enough queries have seen it held."""
        self.queries += 1
        for owner in list(self.releasing):
            if self.releasing[owner] <= 0:
                self.release(owner)
            else:
                self.releasing[owner] -= 1
        return self.free_bytes(), self.total_bytes

    def release_later(self, owner: int, queries: int) -> None:
        if queries <= 0:
            self.release(owner)
        elif owner in self.held:
            self.releasing[owner] = queries

    def allocate(self, owner: int, what: str, nbytes: int) -> None:
        free = self.free_bytes()
        if nbytes > free:
            raise OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {nbytes / GIB:.2f} GiB for {what}. GPU 0 has a total "
                f"capacity of {self.total_bytes / GIB:.2f} GiB of which {free / GIB:.2f} GiB is free."
            )
        _, before = self.held.get(owner, ("", 0))
        self.held[owner] = (what, before + nbytes)

    def release(self, owner: int) -> None:
        self.held.pop(owner, None)
        self.releasing.pop(owner, None)


class SimClock:
    """Seconds on the simulated device; engines under test read it instead of perf_counter (and
    sleep with `advance`). `realtime`: it also runs with the process's own clock, for processes
    whose engine sleeps for real (Ray workers started by a pipeline run: shim/)."""

    def __init__(self, realtime: bool = False) -> None:
        self.now = 1000.0
        self.realtime = realtime
        self._t0 = time.monotonic()

    def __call__(self) -> float:
        return self.now + (time.monotonic() - self._t0 if self.realtime else 0.0)

    def advance(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


@dataclass(frozen=True)
class FakeModel:
    """A checkpoint the stand-in can load: what it costs and how its drafts behave."""

    weight_bytes: int
    kv_bytes_per_token: int = 0
    max_position_embeddings: int = 8192
    agree: float = 0.0  # draft models / heads: share of positions where the draft equals the target
    mtp_layers: int = 0  # targets with MTP modules (num_nextn_predict_layers in their config)
    mtp_agree: float = 0.7


# The models the shipped trt_configs and jobs name (sizes: bf16 weights of the public checkpoints).
DEFAULT_MODELS = {
    "meta-llama/Llama-3.1-8B-Instruct": FakeModel(int(16.1 * GIB), 128 * 1024, 8192),
    "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B": FakeModel(int(0.8 * GIB), 4 * 1024, agree=0.75),
    "meta-llama/Llama-3.2-1B-Instruct": FakeModel(int(2.5 * GIB), 32 * 1024, 8192, agree=0.6),
}


def visible_gpus() -> int:
    """How many GPUs this process sees: CUDA_VISIBLE_DEVICES (Ray sets it for an actor's GPUs), else one."""
    names = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return len(names) or 1


@dataclass
class State:
    gpus: list[SimulatedGPU] = field(default_factory=lambda: [SimulatedGPU() for _ in range(visible_gpus())])
    clock: SimClock = field(default_factory=SimClock)
    models: dict[str, FakeModel] = field(default_factory=lambda: dict(DEFAULT_MODELS))
    build_seconds: float = 0.0  # simulated seconds each LLM build takes (load + CUDA graph capture)
    builds: int = 0
    live: set[int] = field(default_factory=set)  # ids of LLMs not yet shut down
    max_live: int = 0  # most LLMs alive at once in this process
    built: list = field(default_factory=list)  # TorchLlmArgs of every LLM built (for tests to inspect)
    audit: list = field(default_factory=list)  # every iteration's stats, never dropped (the truth tests compare with)
    # device queries after shutdown() that still see an LLM's memory held (its worker process exiting)
    release_queries: int = 2
    # whether RequestOutput's token_ids end with the end token of a row that stopped on it: open in
    # the source read (SOURCES.md, "End tokens"); numGeneratedTokens counts it either way
    end_token_in_output: bool = False

    @property
    def gpu(self) -> SimulatedGPU:
        """The first GPU (rank 0's; the one a one-GPU LLM uses)."""
        return self.gpus[0]


STATE = State()


def reset(gpu_bytes: int = 80 * GIB, build_seconds: float = 0.0, gpus: int = 1, release_queries: int = 2) -> State:
    """A fresh process: `gpus` empty GPUs of `gpu_bytes` each, a new clock, the default models."""
    global STATE
    STATE = State(gpus=[SimulatedGPU(gpu_bytes) for _ in range(gpus)], build_seconds=build_seconds,
                  release_queries=release_queries)
    return STATE


def find_model(name: str) -> FakeModel:
    """A registered name, or a local folder with config.json (weights: *.safetensors sizes);
    anything else fails the way an offline Hugging Face download does."""
    if name in STATE.models:
        return STATE.models[name]
    folder = Path(name)
    if (folder / "config.json").is_file():
        config = json.loads((folder / "config.json").read_text())
        heads = int(config.get("num_attention_heads", 1))
        kv = 2 * int(config.get("num_hidden_layers", 1)) * int(config.get("num_key_value_heads") or heads) * (
            int(config.get("head_dim") or int(config.get("hidden_size", heads)) // heads)) * 2
        weights = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        return FakeModel(weights, kv, int(config.get("max_position_embeddings", 8192)), agree=0.6,
                         mtp_layers=int(config.get("num_nextn_predict_layers", 0)))
    raise OSError(
        f"We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in the "
        f"cached files. Check your internet connection or see how to run the library in offline mode: {name}"
    )


# ---- tokenizer ---------------------------------------------------------------------------------


class FakeTokenizer:
    """Bytes as tokens (id = byte + 3), BOS 1, EOS 2. Like a Hugging Face tokenizer, special-token
    text inside a string ("<s>") is parsed as the special token, and `add_special_tokens=True`
    prepends BOS; so a chat template rendered to text (which holds "<s>") and then encoded with
    special tokens carries BOS twice, exactly as with Llama 3's tokenizer."""

    bos_token, eos_token = "<s>", "</s>"
    bos_token_id, eos_token_id = BOS, EOS

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = [BOS] if add_special_tokens else []
        for i, part in enumerate(text.split(self.bos_token)):
            if i:
                ids.append(BOS)
            ids.extend(3 + b for b in part.encode("utf-8"))
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        out = bytearray()
        for t in ids:
            if t >= 3:
                out.append(t - 3)
            elif not skip_special_tokens:
                out.extend((self.bos_token if t == BOS else self.eos_token).encode())
        return out.decode("utf-8", errors="replace")

    def apply_chat_template(self, messages, tokenize: bool = True, add_generation_prompt: bool = False, **_):
        text = self.bos_token + "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in messages)
        if add_generation_prompt:
            text += "<|assistant|>"
        return self.encode(text, add_special_tokens=False) if tokenize else text


# ---- the model ---------------------------------------------------------------------------------


def _mix(*xs: int) -> int:
    h = 2166136261
    for x in xs:
        h = ((h ^ (x & 0xFFFFFFFF)) * 16777619) & 0xFFFFFFFF
    return h


def logits(context: list[int]) -> list[float]:
    """Target scores over ALPHABET + [EOS] after `context` (depends on its last two tokens). The
    toy model never ends before its first output token (callers pass allow_eos=False there)."""
    a, b = (context[-2], context[-1]) if len(context) >= 2 else (0, context[-1] if context else 0)
    base = _mix(a, b)
    scores = [(_mix(base, j) % 1000) / 250.0 for j in range(len(ALPHABET))]
    scores.append(4.5 if _mix(base, 77) % 23 == 0 else -2.0)  # EOS from a few states only
    return scores


def greedy(context: list[int], allow_eos: bool = True) -> int:
    s = logits(context)
    if not allow_eos:
        s[-1] = -1e9
    j = max(range(len(s)), key=lambda i: (s[i], -i))
    return EOS if j == len(ALPHABET) else ALPHABET[j]


def sample(context: list[int], temperature: float, top_p: float, rng: random.Random, allow_eos: bool = True) -> int:
    s = logits(context)
    if not allow_eos:
        s[-1] = -1e9
    m = max(s)
    w = [math.exp((x - m) / temperature) for x in s]
    total = sum(w)
    order = sorted(range(len(w)), key=lambda i: -w[i])
    kept, mass = [], 0.0
    for i in order:  # nucleus: the smallest set of tokens with probability >= top_p
        kept.append(i)
        mass += w[i] / total
        if mass >= top_p:
            break
    u = rng.random() * sum(w[i] for i in kept)
    for i in kept:
        u -= w[i]
        if u <= 0:
            break
    return EOS if i == len(ALPHABET) else ALPHABET[i]


def draft_token(context: list[int], agree: float, salt: int) -> int:
    """A draft model's guess: the target's greedy token on a fixed share of contexts."""
    g = greedy(context)
    if (_mix(*context[-3:], salt) % 1000) < agree * 1000:
        return g
    wrong = ALPHABET[(ALPHABET.index(g) + 1) % len(ALPHABET)] if g in ALPHABET else ALPHABET[0]
    return wrong
