"""Median and range of each side's tokens/s per --max-new-tokens, from engine_tokens.py's JSON lines;
also the median and 90th percentile of single calls (on a contended machine the fast calls are the
ones other load left alone).

    python benchmarks/engine_tokens_summary.py RUNS.old RUNS.new > benchmarks/results/engine_tokens.json
"""

from __future__ import annotations

import json
import statistics
import sys


def summary(paths: dict[str, str]) -> dict:
    runs = {side: [json.loads(line) for line in open(path)] for side, path in paths.items()}
    result = {"runs": runs, "summary": {}}
    for side, figures in runs.items():
        for n in sorted({f["max_new_tokens"] for f in figures}):
            rates = [f["tokens_per_s"] for f in figures if f["max_new_tokens"] == n]
            digests = sorted({f["tokens_digest"] for f in figures if f["max_new_tokens"] == n})
            calls = [r for f in figures if f["max_new_tokens"] == n for r in f["per_call_tokens_per_s"]]
            result["summary"].setdefault(str(n), {})[side] = dict(
                median=statistics.median(rates),
                low=min(rates),
                high=max(rates),
                runs=len(rates),
                per_call_median=statistics.median(calls),
                per_call_p90=statistics.quantiles(calls, n=10)[-1],
                tokens_digests=digests,
            )
    for n, sides in result["summary"].items():
        if "old" in sides and "new" in sides:
            sides["new_over_old"] = round(sides["new"]["median"] / sides["old"]["median"], 3)
            sides["same_tokens"] = sides["new"]["tokens_digests"] == sides["old"]["tokens_digests"]
    return result


if __name__ == "__main__":
    print(json.dumps(summary({"old": sys.argv[1], "new": sys.argv[2]}), indent=1))
