# Helpers shared by compare.sh and versus.sh, and chaos/cpu.sh (sourced, not run): messages,
# option values, and the checks of the options the first two take. The sourcing script sets
# $prog first.

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

# --rate, if given ($rate): transactions per second above zero, as pgbench --rate and
# hawser bench --rate take it.
check_rate() {
    [[ -z $rate ]] && return
    [[ $rate =~ ^[0-9]+([.][0-9]+)?$ ]] && awk -v r="$rate" 'BEGIN { exit !(r > 0) }' ||
        die "--rate must be a number of transactions per second above 0"
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

# User + system clock ticks process $1 has used so far: fields 14 and 15 of /proc/PID/stat,
# counted after the ")" that ends the command name (which may hold spaces).
proc_ticks() {
    awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"
}

# CPU time the hypervisor gave to other guests while this one wanted it ("steal", the
# eighth figure of /proc/stat's cpu line), in percent of all CPU time between two
# samples. On a shared virtual machine it swings from 0 to over 30 % within minutes and
# throughput falls with it, so every run reports its own over its measured seconds.
cpu_sample() {
    awk '/^cpu /{ t = 0; for (i = 2; i <= NF; i++) t += $i; print $9 + 0, t; exit }' /proc/stat 2>/dev/null ||
        echo "0 0"
}
steal_since() {
    local before="$1" after
    after="$(cpu_sample)"
    awk -v a="$before" -v b="$after" 'BEGIN { split(a, x, " "); split(b, y, " ");
        d = y[2] - x[2]; printf "%.1f", (d > 0 ? (y[1] - x[1]) * 100 / d : 0) }'
}
