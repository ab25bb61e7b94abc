#!/usr/bin/env bash
# Run full benchmarks one after another from a clean worktree of ONE committed revision,
# through one task cache per revision, so the same command resumes after any cut (a session's
# end, a reboot): finished training runs come back from the cache, a run cut mid-way resumes
# after its last epoch (benchmarks/README.md, "Resuming a full run that was cut off").
#
#   benchmarks/full_runs.sh REV "pmt" "pmt-seeds" "pinn --threads 2" tinyfoa tt-zo
#
# Each argument after REV is one `bpfree bench` command line (name first, then its options).
# The benchmarks of one revision share one cache folder (a task's key names its function, so
# they never collide; pmt-seeds' seed 0 is bench pmt's runs). A benchmark whose JSON is
# already in $BPFREE_RUNS/done is skipped, so the queue can be started again as it is.
# Finished JSONs are copied to $BPFREE_RUNS/done/NAME-REV.json;
# copy them into results/ of a clean checkout and run `bpfree docs --reledger`.
#
# Environment: BPFREE_RUNS (default ~/bpfree-runs: worktrees/REV, cache/REV, logs, done/),
# BPFREE_DATA (the datasets), PYTHON (default: this checkout's .venv/bin/python),
# BPFREE_TASK_CACHE_REUSE (an earlier revision whose results in cache/REV stand in for this
# revision's: a run going on at a newer revision; benchmarks/README.md).
set -euo pipefail
. "$(dirname "$0")/_runs_common.sh"

runs_start full_runs 2 "" "give a revision and at least one benchmark" "$@"
runs_rev full_runs "$1"
shift
WT=$RUNS/worktrees/$REV
mkdir -p "$RUNS/done" "$RUNS/cache" "$RUNS/logs"

if [ ! -d "$WT" ]; then
    git -C "$REPO" worktree add --detach "$WT" "$REV" >/dev/null
fi
[ "$(git -C "$WT" rev-parse --short HEAD)" = "$REV" ] || {
    echo "full_runs: $WT is not at $REV" >&2; exit 2; }
# Results and the generated docs are what a run writes; anything else dirty means the
# numbers would not belong to REV.
if [ -n "$(git -C "$WT" status --porcelain --untracked-files=no -- . \
        ':(exclude)results' ':(exclude)docs/BENCHMARKS.md')" ]; then
    echo "full_runs: worktree $WT has changes outside results/; refusing" >&2; exit 2
fi

export PYTHONPATH=$WT/src OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
for line in "$@"; do
    read -r -a argv <<<"$line"
    name=${argv[0]}
    done_json=$RUNS/done/$name-$REV.json
    if [ -f "$done_json" ]; then
        echo "full_runs: $name at $REV already done ($done_json)"
        continue
    fi
    echo "full_runs: $(date -u +%FT%TZ) bench $line at $REV"
    (cd "$WT" && BPFREE_TASK_CACHE=$RUNS/cache/$REV \
        "$PYTHON" -m bpfree.cli bench "${argv[@]}" --json "results/$name.json") \
        2>&1 | tee -a "$RUNS/logs/$name-$REV.log"
    cp "$WT/results/$name.json" "$done_json.tmp" && mv "$done_json.tmp" "$done_json"
    echo "full_runs: $(date -u +%FT%TZ) $name done -> $done_json"
done
