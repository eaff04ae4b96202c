"""Is an auxiliary trainer slower than the primary on the same work?  From run profiles alone.

    python bench/microbatch_probe/aux_ratio.py RUN_DIR [RUN_DIR ...]

Fits the primary's ``train_micro`` measurements with the stage model's features (non-negative,
as ``bench/stage_model_errors.py``'s floor), then prints the median of each auxiliary
measurement over that fit's prediction, beside the primary's own median ratio and the
primary's ratio within 3 s of an auxiliary measurement (what the machine did then).  Per token
alone, the auxiliary looks slower whenever it gets the costlier micro-batches (the tail of a
step, the later steps): this compares like with like.
"""

from __future__ import annotations

import json
import sys

import numpy as np


def nonneg_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    a, free, theta = x / y[:, None], list(range(x.shape[1])), np.zeros(x.shape[1])
    while free:
        u = np.linalg.lstsq(a[:, free], np.ones(len(y)), rcond=None)[0]
        if u.min() >= 0:
            theta[free] = u
            break
        free.pop(int(np.argmin(u)))
    return theta


def main(runs: list[str]) -> None:
    for d in runs:
        prof = [json.loads(line) for line in open(f"{d}/profile.jsonl")]
        prim = [p for p in prof if p.get("stage") == "train_micro"]
        aux = [p for p in prof if p.get("stage") == "aux_micro"]
        if not aux or len(prim) < 4:
            print(f"{d}: no auxiliary micro-batches")
            continue
        x = np.array([p["features"] for p in prim])
        y = np.array([p["seconds"] for p in prim])
        theta = nonneg_fit(x, y)
        r_aux = np.array([p["seconds"] for p in aux]) / (np.array([p["features"] for p in aux]) @ theta)
        r_prim = y / (x @ theta)
        near = [r for p, r in zip(prim, r_prim, strict=True) if any(abs(p["t"] - q["t"]) < 3 for q in aux)]
        print(f"{d}: aux n={len(aux)} aux/primary-fit {np.median(r_aux):.3f}; primary's own {np.median(r_prim):.3f}, "
              f"primary near the aux's times {np.median(near) if near else float('nan'):.3f} (n={len(near)})")


if __name__ == "__main__":
    main(sys.argv[1:])
