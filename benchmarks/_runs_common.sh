# The start-up that benchmarks/full_runs.sh and benchmarks/land_run.sh share (sourced, not run):
# their usage text (the calling script's header comment), argument checks, and the queue's
# paths. Both exit 2 on bad input, naming the script.

runs_usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

# runs_start PROG MIN MAX WHY ARG...: --help prints the usage and exits 0; fewer than MIN or
# more than MAX arguments (MAX empty: no bound) print it and WHY and exit 2. Then REPO (this
# checkout), RUNS ($BPFREE_RUNS, default ~/bpfree-runs) and PYTHON (default: the checkout's
# .venv/bin/python, which must be executable) are set.
runs_start() {
    local prog=$1 min=$2 max=$3 why=$4
    shift 4
    case "${1:-}" in -h|--help) runs_usage; exit 0 ;; esac
    if [ $# -lt "$min" ] || { [ -n "$max" ] && [ $# -gt "$max" ]; }; then
        runs_usage >&2
        echo "$prog: $why" >&2
        exit 2
    fi
    REPO=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
    RUNS=${BPFREE_RUNS:-$HOME/bpfree-runs}
    PYTHON=${PYTHON:-$REPO/.venv/bin/python}
    [ -x "$PYTHON" ] || { echo "$prog: no Python at $PYTHON (set PYTHON)" >&2; exit 2; }
}

# runs_rev PROG ARG: REV, the short hash of commit ARG of REPO; exit 2 if ARG names none.
runs_rev() {
    REV=$(git -C "$REPO" rev-parse --verify --quiet --short "$2^{commit}") || {
        echo "$1: '$2' is not a commit of $REPO (give a committed revision)" >&2; exit 2; }
}
