"""Throughput figures of the text reports: rates below 1/s (a real model on a 2-core CPU) keep
two significant digits instead of rounding to 0; rates of 10 and more print as before."""

from __future__ import annotations

from benchmarks.report import _fmt_sig, _throughput_table


def test_small_rates_keep_two_significant_digits() -> None:
    assert [_fmt_sig(x) for x in (None, 0.0, 0.405, 0.0242, 4.727, 9.96, 45.3, 9460.2)] == [
        "-",
        "0",
        "0.41",
        "0.024",
        "4.7",
        "10",
        "45",
        "9,460",
    ]
    assert [_fmt_sig(x, 3) for x in (133.8675, 0.0699, 2.638)] == ["134", "0.0699", "2.64"]


def test_throughput_table_prints_slow_rates() -> None:
    t = {"step_time_s": 133.8675, "completions_per_s": 0.405, "tokens_per_s": 4.73, "peak_rss_mb": 4174.3}
    agg = {"rows": {"a/grpo": {"label": "arith_chat", "algo": "grpo", "throughput": t}}}
    (row,) = [line for line in _throughput_table(agg) if line.startswith("| arith_chat |")]
    assert row == "| arith_chat | grpo | 134 | 0.41 | 4.7 | 4,174 | - |"
