# Helpers shared by compare.sh and versus.sh (sourced, not run): messages, option values,
# and the checks of the options both take. The sourcing script sets $prog first.

die() {
    echo "$prog: $*" >&2
    exit 1
}

log() {
    echo "$prog: $*" >&2
}

need_value() {
    [[ $# -ge 2 ]] || die "$1 needs a value (see --help)"
}

# --duration, --warmup and --clients, as both scripts take them.
check_run_args() {
    # pgbench's -T takes whole seconds.
    [[ $duration =~ ^[1-9][0-9]*$ ]] || die "--duration must be a whole number of seconds ≥ 1"
    [[ $warmup =~ ^[0-9]+$ ]] || die "--warmup must be a whole number of seconds"
    [[ -n ${clients_list// /} ]] || die "--clients is empty"
    local c
    for c in $clients_list; do
        [[ $c =~ ^[1-9][0-9]*$ ]] || die "--clients: '$c' is not a positive number"
    done
}

# The end of each script's EXIT cleanup: keeps $work (--keep) or removes it, and exits
# with $1, the status the script was leaving with.
leave_work() {
    if [[ $keep -eq 1 ]]; then
        log "kept $work"
    else
        rm -rf "$work"
    fi
    exit "$1"
}

# Runs the script's `cleanup` on every exit; INT and TERM exit with 130 / 143 through it.
trap_cleanup() {
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}
