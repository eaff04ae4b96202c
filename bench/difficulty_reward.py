"""A reward of fixed prompt difficulty, for the ``filter`` workload of ``bench/real_policies.py``.

DAPO's dynamic sampling (``algorithm.filter_groups``) pays off where many groups score all
right or all wrong: in real reasoning runs, prompts too easy or too hard for the model.  The
workloads of ``bench/real_policies.py`` use a random-weight model (their figures are the
schedule's, not learning), so this reward gives each prompt a difficulty from its answer's
hash: 30 % of prompts are easy (every response 1.0), 20 % hard (every response 0.0), and on
the other half a response scores its own hash's parity, so a group of 8 almost always has a
spread.  About half the groups are filtered: a step generates about twice the groups it trains.
"""

from __future__ import annotations

import zlib


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    bucket = zlib.crc32(str(ground_truth).encode()) % 10
    if bucket < 3:
        return 1.0
    if bucket < 5:
        return 0.0
    return float(zlib.crc32(solution_str.encode()) % 2)
