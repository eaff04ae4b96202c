"""An all-or-nothing reward for the built-in tasks: 1 for the exact answer, else 0.

The built-in tasks give partial credit (``algo/tasks.py``), so a group's rewards are rarely
all equal and DAPO's dynamic sampling (``algorithm.filter_groups``) would filter almost
nothing.  Scored exactly, a warm-started tiny model (about one answer in ten exact on
``copy``) has many groups that are all wrong, and, as it learns, some that are all right:
the ``filter`` workload of ``bench/real_policies.py`` gives it as ``data.reward_fn``.
"""

from __future__ import annotations

from bidirl.algo.tasks import extract_answer


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """1.0 when the response's first line is exactly the answer, else 0.0."""
    return 1.0 if extract_answer(solution_str) == str(ground_truth) else 0.0
