#!/bin/bash
# run_pair.sh SNAPSHOT OUT WORKLOAD [override ...]: one async/bidirl pair of bench/real_policies.py
# from a probe snapshot, with the per-micro-batch probe on and syssample.py beside it.
# Hold the lock: flock /work/bench.lock nice -n 0 quiet.sh bench/microbatch_probe/run_pair.sh ...
snap=$1; out=$2; wl=$3; shift 3
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out/probe"
python3 "$here/syssample.py" "$out/sys-$wl.jsonl" 1.0 & sp=$!
cd "$snap" && BIDIRL_PROBE_DIR="$out/probe" PYTHONPATH="$snap/src" "${PYTHON:-python}" bench/real_policies.py \
   --workload "$wl" --pairs 1 --keep "$out" --json "$out/rp-$wl.json" -- "$@" > "$out/rp-$wl.log" 2>&1
rc=$?
kill $sp; wait $sp
tail -4 "$out/rp-$wl.log"
exit $rc
