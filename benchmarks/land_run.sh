#!/usr/bin/env bash
# Land one finished full run of the queue (benchmarks/full_runs.sh) in this checkout:
#
#   benchmarks/land_run.sh NAME REV
#
# copies $BPFREE_RUNS/done/NAME-REV.json to results/NAME.json and the figures that run wrote
# (new or changed files under results/figures of its worktree), commits them, re-derives every
# ledger (`bpfree docs --reledger`, which also regenerates docs/BENCHMARKS.md), runs the ledger
# tests, and commits the regenerated docs. Refused (exit 2, nothing copied): a checkout with
# uncommitted changes to tracked files, a missing JSON, or a JSON that is not a clean run of
# REV. If the reledger or the ledger tests fail, the results commit stays and the script
# stops (exit 1) with the docs uncommitted, for a person to look at.
#
# Environment: BPFREE_RUNS (default ~/bpfree-runs), PYTHON (default: this checkout's
# .venv/bin/python).
set -euo pipefail
. "$(dirname "$0")/_runs_common.sh"

runs_start land_run 2 2 "give a benchmark name and the revision its run was made at" "$@"
NAME=$1
runs_rev land_run "$2"
DONE=$RUNS/done/$NAME-$REV.json
WT=$RUNS/worktrees/$REV

[ -f "$DONE" ] || { echo "land_run: $DONE does not exist (has the queue finished $NAME?)" >&2
    exit 2; }
if [ -n "$(git -C "$REPO" status --porcelain --untracked-files=no)" ]; then
    echo "land_run: $REPO has uncommitted changes; commit or stash them first" >&2; exit 2
fi
# The JSON must be a clean run of REV: its numbers belong to that revision only.
"$PYTHON" - "$DONE" "$REV" <<'EOF' || exit 2
import json, sys
path, rev = sys.argv[1], sys.argv[2]
try:
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
except (OSError, ValueError) as err:
    sys.exit(f"land_run: {path} is not a readable JSON document ({err})")
got = str(doc.get("git_revision") or "")
if not got or not (got.startswith(rev) or rev.startswith(got)):
    sys.exit(f"land_run: {path} was made at revision {got or '(none)'!r}, not {rev}")
if doc.get("dirty") is not False:
    sys.exit(f"land_run: {path} comes from a dirty tree (dirty={doc.get('dirty')!r})")
if doc.get("quick") is True:
    sys.exit(f"land_run: {path} is a quick run, not a full one")
EOF

cd "$REPO"
cp "$DONE" "results/$NAME.json"
if [ -d "$WT/results/figures" ]; then
    # The figures the run wrote: new or changed against REV in its worktree.
    git -C "$WT" status --porcelain --untracked-files=all -- results/figures |
        awk '{print $2}' | while read -r f; do
            mkdir -p "$(dirname "$f")"
            cp "$WT/$f" "$f"
        done
fi
git add results
git commit -qm "results/$NAME.json: the full run at $REV (benchmarks/land_run.sh)"
echo "land_run: committed results/$NAME.json ($(git rev-parse --short HEAD))"

PYTHONPATH=$REPO/src "$PYTHON" -m bpfree.cli docs --reledger || {
    echo "land_run: bpfree docs --reledger failed; the results commit stays" >&2; exit 1; }
tests=()
for t in tests/test_bench_verdicts.py tests/test_ledgers_*.py tests/test_ttzo_pinn_ledgers.py; do
    [ -f "$t" ] && tests+=("$t")
done
if [ ${#tests[@]} -gt 0 ]; then
    "$PYTHON" -m pytest -q "${tests[@]}" || {
        echo "land_run: the ledger tests failed; docs left uncommitted" >&2; exit 1; }
fi
git add -A results docs
if git diff --cached --quiet; then
    echo "land_run: the ledgers and docs/BENCHMARKS.md did not change"
else
    git commit -qm "docs/BENCHMARKS.md regenerated (bpfree docs --reledger) with the $NAME run at $REV"
    echo "land_run: committed the regenerated docs ($(git rev-parse --short HEAD))"
fi
