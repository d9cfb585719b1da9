"""What speculation saved, in device-hours (batchspec.report.savings): sums of the stats' device
columns per shard key and for the run, the price's arithmetic, the unit, and the printed digits."""

from __future__ import annotations

import pytest

from batchspec.report.savings import header, notes, row, savings, sig
from batchspec.stats import ShardStats


def shard(n: int, key: str | None, gpu_s: float | None, plain: float | None = None, err: float = 0.0, tokens: int = 1000,
          device: str = "gpu") -> ShardStats:
    return ShardStats(shard_id=f"{n:05d}", shard_key=key, rows=10, error_rows=0, engine="torch", model="m", batch_size=8,
                      output_tokens=tokens, device=device, devices=1.0, gpu_s=gpu_s, plain_gpu_s=plain, plain_gpu_s_err=err,
                      plain_estimated=err > 0 if plain is not None else None)


SHARDS = [
    shard(0, "code", 3600.0, 9000.0, err=360.0, tokens=2_000_000),
    shard(1, "code", 1800.0, None, tokens=500_000),  # the table could not price plain decoding here
    shard(2, "prose", 720.0, 648.0, tokens=100_000),  # ran plain decoding: saved minus its calibration
    shard(3, "prose", None),  # no row ran
]


def test_hours_used_and_saved_per_key_and_for_the_run_are_the_sums_of_the_stats():
    s = savings(SHARDS, price=2.0)
    code, prose = s.keys
    assert (s.unit, s.unmeasured, [h.key for h in s.keys]) == ("GPU", 1, ["code", "prose"])
    assert (code.shards, code.priced, code.used_h, code.plain_h, code.saved_h, code.saved_err_h) == (2, 1, 1.5, 2.5, 1.5, 0.1)
    assert code.estimated and not prose.estimated
    assert (prose.used_h, prose.plain_h, prose.saved_h, prose.saved_err_h) == (0.2, 0.18, pytest.approx(-0.02), 0.0)
    assert code.tokens_per_h == 2_500_000 / 1.5
    assert code.cost_per_mtok == pytest.approx(2.0 * 1.5 / 2.5) and code.money_saved == 3.0 and code.money_err == pytest.approx(0.2)
    run = s.run
    assert (run.shards, run.priced, run.used_h, run.output_tokens) == (3, 2, pytest.approx(1.7), 2_600_000)
    assert run.saved_h == pytest.approx(code.saved_h + prose.saved_h) and run.saved_err_h == pytest.approx(0.1)
    assert savings(SHARDS).run.cost_per_mtok is None  # no price, no money


def test_the_unit_is_cpu_on_cpu_workers_and_says_so_where_a_run_mixed_them():
    cpu = [shard(0, "a", 10.0, 12.0, device="cpu")]
    assert savings(cpu).unit == "CPU" and header(savings(cpu))[2] == "CPU-h used"
    assert savings(cpu + [shard(1, "a", 10.0, 12.0)]).unit == "device"


def test_the_table_prints_the_numbers_to_four_significant_digits_and_says_what_marks_mean():
    s = savings(SHARDS, price=2.0)
    assert row(s.keys[0], s) == ["code", "2", "1.500", "2.500", "1.500*", "0.1000", "1,666,667", "1.200", "3.000 +- 0.2000"]
    assert row(s.run, s)[0] == "run"
    assert any(line.startswith("* plain decoding priced") for line in notes(s))
    assert "1 shard(s) without plain decoding's price: in used, not in plain or saved" in notes(s)
    assert "1 shard(s) without GPU-seconds (no row ran, or written before the column existed): left out" in notes(s)


@pytest.mark.parametrize(("value", "text"), [(0.00123456, "0.001235"), (12345.6, "12,346"), (1.5, "1.500"), (-0.0100449, "-0.01004"),
                                             (0.0, "0"), (None, "n/a"), (999.96, "1,000")])
def test_sig_rounds_to_significant_digits_in_plain_notation(value, text):
    assert sig(value) == text
