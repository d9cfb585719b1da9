"""An engine that replays recorded greedy outputs on a cost regime: the simulator's engine.

Greedy speculative decoding commits exactly plain decoding's tokens; only how many each step
commits differs. So once a model's plain greedy outputs are recorded (`record`), every arm can be
run again without the model: `ReplayTarget` accepts a draft where it equals the recorded token,
behind the torch engine's own decode loop (the same admission, batching, draining, drafters and
in-flight switching; tests/sim/test_replay.py checks its steps against the engine's), while a
cost regime prices every second (regimes.py), handed to the engine as its clock (clock.py).
Where the regime's arms are builds, so are the replay's (`arms_are_builds`): calibration counts
and caps them as over TensorRT-LLM, and each build's seconds are charged to the decode time of
the call that switched (the clock's `switch`), not recorded as `builds`. A shard that took minutes on a CPU replays in
a second of Python, and its figures are simulated, deterministic, and labelled so.

A draft model's proposals are recorded too: the draft's greedy argmax at every output position
given prompt + output so far (one teacher-forced forward). Where its earlier proposals in a step
matched, that is exactly what it would have proposed; after a mismatch nothing it proposes is
accepted, so the replay accepts what the engine would. An EAGLE-3 head's the same way: at every
output position its greedy chain of K drafts, each fed the true tokens before it
(`TorchEngine.head_chains`, over the hidden states of one teacher-forced target forward), exact
wherever the chain's earlier drafts matched, which are the only drafts that count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Mapping, Sequence

import torch

from batchspec.engine.base import NO_SPEC, Completion, GenerateResult, Profile, Request, SpecConfig
from batchspec.engine.torch.decode import Decoder, Proposal, Row, Verdict
from batchspec.engine.torch.drafters import Drafts
from batchspec.engine.torch.engine import TorchEngine
from batchspec.errors import ConfigError
from batchspec.sim.clock import RegimeClock
from batchspec.sim.regimes import Regime


@dataclass(frozen=True)
class Recorded:
    """One row's plain greedy decode: its prompt and output ids, per draft model the draft's
    greedy proposal at every output position (`proposals[m][s]`: its argmax after prompt + output[:s]),
    and per EAGLE-3 head folder its greedy chain at every output position (`chains[h][t]`: the
    drafts of a step starting at t, as deep as recorded; index 0 empty: prefill commits it)."""

    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    proposals: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    chains: Mapping[str, tuple[tuple[int, ...], ...]] = field(default_factory=dict)

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update({"chains": {}, **state})  # a row pickled before heads were recorded has none


def record(engine: TorchEngine, requests: Sequence[Request], batch_size: int, draft_models: Sequence[str] = (),
           heads: Sequence[str] = (), head_k: int = 4) -> tuple[dict[str, Recorded], list[Completion]]:
    """Decode `requests` plainly (greedy) on the real engine; each row's recording by request id
    (with each draft model's proposals, and each head's chains `head_k` drafts deep), and the
    completions (error rows are not recorded: the replay fails them again)."""
    if any(not r.params.greedy for r in requests):
        raise ConfigError("the simulator replays greedy rows only (temperature 0)")
    done = engine.generate(list(requests), NO_SPEC, batch_size).completions
    rows = [(r, c) for r, c in zip(requests, done) if c.finish_reason != "error"]
    prompts = [tuple(engine.encode(r)) for r, _ in rows]
    sequences = [(p, c.token_ids) for p, (_, c) in zip(prompts, rows)]
    proposals = {m: engine.draft_proposals(sequences, m) for m in draft_models}
    chains = {h: engine.head_chains(sequences, h, head_k) for h in heads}
    recorded = {r.id: Recorded(p, tuple(c.token_ids), {m: tuple(proposals[m][i]) for m in draft_models},
                               {h: tuple(tuple(chain) for chain in chains[h][i]) for h in heads})
                for i, (p, (r, c)) in enumerate(zip(prompts, rows))}
    return recorded, done


# What the replay of a drafter that reads a model reads from the recording: its name, and the field
RECORDED_AS = {"draft_target": ("draft model", "proposals"), "eagle3": ("EAGLE-3 head", "chains")}


class ReplayBatch:
    """The cache of a replayed batch: only its rows, for the step's context (the longest row)."""

    def __init__(self, rows: list[Row] | None = None) -> None:
        self.rows = rows or []

    @property
    def slots(self) -> int:
        return max((len(r.context) - 1 for r in self.rows), default=0)

    def extend(self, other: "ReplayBatch") -> None:
        self.rows += other.rows

    def select(self, keep: list[int]) -> None:
        self.rows = [self.rows[i] for i in keep]

    def compact(self) -> None:
        pass


class ReplayTarget:
    """A target whose greedy token at every position is the recorded one (`ModelTarget`'s twin)."""

    def __init__(self, outputs: Mapping[int, Sequence[int]]) -> None:
        self.outputs = outputs  # request index -> recorded output ids

    def new_batch(self) -> ReplayBatch:
        return ReplayBatch()

    def prefill(self, rows: list[Row]) -> tuple[ReplayBatch, list[int]]:
        return ReplayBatch(list(rows)), [self.outputs[r.index][0] for r in rows]

    def verify(self, rows: list[Row], batch: ReplayBatch, proposal: Proposal) -> Verdict:
        accepted, nexts = [], []
        for row, draft in zip(rows, proposal.tokens):
            truth, t = self.outputs[row.index], len(row.output)
            if t >= len(truth):
                raise RuntimeError(f"row {row.index} ran past its recording ({len(truth)} tokens)")
            n = 0
            while n < len(draft) and t + n < len(truth) and draft[n] == truth[t + n]:
                n += 1
            accepted.append(n)
            # drafts that matched through the row's last token (its eos) end it there: what follows is never committed
            nexts.append(truth[t + n] if t + n < len(truth) else truth[-1])
        return Verdict(torch.tensor(accepted), torch.tensor(nexts), [0] * len(rows))  # no mask: no grammar consumed drafts


class RecordedDrafter:
    """A draft model's proposals as recorded: at output position t, proposals[t:t + budget]."""

    def __init__(self, proposals: Mapping[int, Sequence]) -> None:
        self.proposals = proposals  # request index -> what was recorded at every output position

    def admit(self, rows: list, device) -> None:
        pass

    def propose(self, rows: list[Row], budgets: list[int], vocab: int, ahead=None) -> Drafts:
        assert not any(ahead or ()), "the simulator replays unconstrained rows only"
        return Drafts([self.drafts(self.proposals[row.index], len(row.output), k) for row, k in zip(rows, budgets)], None)

    @staticmethod
    def drafts(recorded: Sequence[int], t: int, k: int) -> list[int]:
        """A step's drafts at output position t with budget k: the next k proposals, one a position."""
        return list(recorded[t : t + k])

    def commit(self, num_accepted, drafts: Drafts, next_tokens: list[int]) -> None:
        pass

    def select(self, keep: list[int]) -> None:
        pass

    def compact(self) -> None:
        pass


class RecordedChainDrafter(RecordedDrafter):
    """An EAGLE-3 head's chains as recorded: at output position t, chains[t][:budget]."""

    @staticmethod
    def drafts(recorded: Sequence[Sequence[int]], t: int, k: int) -> list[int]:
        return list(recorded[t][:k])


class ReplayEngine(TorchEngine):
    """The torch engine over recordings instead of a forward pass, on a cost regime: `generate`
    takes requests whose ids were recorded (prompt_token_ids set), greedy only."""

    def __init__(self, base: TorchEngine, recorded: Mapping[str, Recorded], regime: Regime) -> None:
        super().__init__(base.model, base.tokenizer, base.model_name, str(base.device), clock=partial(RegimeClock, regime))
        self.regime = regime
        self.arms_are_builds = regime.build_s > 0
        self.recorded = recorded
        self.heads = frozenset(h for r in recorded.values() for h in r.chains)  # the EAGLE-3 heads recorded
        self._ids: list[str] = []  # the current generate call's request ids, by index
        self._prompts: dict | None = None

    def profile(self, target, drafts=(), tries: int = 2, **kwargs) -> Profile:
        """Each point the regime's price of its forward, timed `tries` times; where an arm is a
        build, nothing, as TensorRT-LLM's adapter: that engine times no forward apart, so the
        controller learns every price from the steps it runs."""
        if self.arms_are_builds:
            return Profile()
        points = self.regime.profile(self.model_name, target, drafts, self.heads)
        return Profile(points, tries * sum(p.seconds for p in points))

    def switch_s(self, arm: SpecConfig) -> float:
        return self.regime.switch_s(arm.method)

    def check(self, spec: SpecConfig) -> None:
        if spec.method not in ("none", "ngram", "draft_target", "suffix", "eagle3"):
            raise ConfigError(f"the simulator replays none, ngram, suffix, draft_target and eagle3 arms, not {spec.method}")
        if spec.method in RECORDED_AS:
            what, field_name = RECORDED_AS[spec.method]
            missing = [i for i, r in self.recorded.items() if spec.draft_model not in getattr(r, field_name)][:1]
            if missing:
                raise ConfigError(f"{what} {spec.draft_model!r} was not recorded (row {missing[0]})")
        if spec.method == "eagle3":
            depth = next((len(r.chains[spec.draft_model][1]) for r in self.recorded.values()
                          if len(r.chains[spec.draft_model]) > 1), spec.draft_len)
            if spec.draft_len > depth:
                raise ConfigError(f"EAGLE-3 head {spec.draft_model!r} was recorded {depth} drafts deep, "
                                  f"not {spec.draft_len}: record it deeper (head_k)")

    def generate(self, requests: Sequence[Request], spec: SpecConfig, batch_size: int, control=None) -> GenerateResult:
        unknown = [r.id for r in requests if r.id not in self.recorded]
        if unknown or any(not r.params.greedy for r in requests):
            raise ConfigError(f"the simulator replays recorded greedy rows only (not recorded: {unknown[:3]})")
        self._ids = [r.id for r in requests]
        return super().generate(requests, spec, batch_size, control)

    def encode(self, request: Request) -> list[int]:
        return list(self.recorded[request.id].prompt_ids)

    def draft_proposals(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], draft_model: str) -> list[list[int]]:
        """As recorded: a row's proposals depend only on its prompt and output so far, and two rows
        with one prompt have one greedy output."""
        by_prompt = self._by_prompt()
        return [list(by_prompt[tuple(p)].proposals[draft_model][: len(o)]) for p, o in sequences]

    def head_chains(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], folder: str, k: int) -> list[list[list[int]]]:
        """As recorded (as `draft_proposals`): draft j of a chain at t reads prompt + output[:t + j],
        and is compared with the output only where the output runs that far."""
        by_prompt = self._by_prompt()
        return [[list(chain[:k]) for chain in by_prompt[tuple(p)].chains[folder][: len(o)]] for p, o in sequences]

    def _by_prompt(self) -> dict[tuple[int, ...], Recorded]:
        if self._prompts is None:
            self._prompts = {r.prompt_ids: r for r in self.recorded.values()}
        return self._prompts

    def _decoder(self, scopes, lookups) -> Decoder:
        outputs = {i: self.recorded[rid].output_ids for i, rid in enumerate(self._ids)}
        return Decoder(ReplayTarget(outputs), self.tokenizer, self.eos_ids, self.vocab, self.device,
                       lambda spec: self._drafter(spec, scopes, lookups))

    def _drafter(self, spec: SpecConfig, scopes, lookups):
        if spec.method == "draft_target":
            return RecordedDrafter({i: self.recorded[rid].proposals[spec.draft_model] for i, rid in enumerate(self._ids)})
        if spec.method == "eagle3":
            return RecordedChainDrafter({i: self.recorded[rid].chains[spec.draft_model] for i, rid in enumerate(self._ids)})
        return super()._drafter(spec, scopes, lookups)  # n-gram and suffix drafters read only the rows
