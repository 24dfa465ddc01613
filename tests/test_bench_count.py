#!/usr/bin/env python3
"""bench/bench_compress.py's summary counts quality wins only where both
arms met every limit: a case Minitron's grid cannot meet is "only
AutoCompress feasible", never a win, and a loss where both met is listed."""
import contextlib
import io
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, Runner  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_compress as B  # noqa: E402


def row(scn, m_ppl, m_ok, a_ppl, a_ok):
    arm = lambda p, ok: {"perplexity": p, "perplexity_pruned": None, "feasible": ok, "architecture": "-"}
    return {"model": "tiny", "scenario": scn, "limits": [("max_tpot_ms", "tpot_ms", 0.9)],
            "baseline": {"perplexity": 50.0}, "minitron": arm(m_ppl, m_ok), "autocompress": arm(a_ppl, a_ok)}


def summary(rows):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        B.print_table(rows)
    return out.getvalue()


def test_wins_only_where_both_met():
    rows = [row("a", 58.6, True, 58.1, True),    # both met, AutoCompress lower: a win
            row("b", 58.0, True, 58.5, True),    # both met, Minitron lower: a loss
            row("c", 104.0, False, 59.0, True),  # beyond Minitron's grid: not a win
            row("d", 104.0, False, 61.0, True),
            row("e", 58.0, True, 70.0, False),   # only Minitron met
            row("f", 99.0, False, 98.0, False)]  # neither
    s = summary(rows)
    assert "Both arms met every limit in 2 of 6 cases; there AutoCompress reaches lower held-out perplexity than " \
           "Minitron in 1 of 2" in s, s
    assert "Only AutoCompress feasible (beyond Minitron's reach; no quality comparison): 2; only Minitron feasible: " \
           "1; neither: 1" in s, s
    assert "lost: tiny/b/" in s and "lost: tiny/c/" not in s, s
    assert s.count(" MISSED ") >= 4, s


if __name__ == "__main__":
    r = Runner()
    r.run(test_wins_only_where_both_met)
    r.done()
