#!/usr/bin/env bash
# Builds hawser's cargo-fuzz targets (crates/fuzz) and runs each for a given time. See --help.

set -euo pipefail

usage() {
    cat <<'EOF'
Usage: fuzz.sh [OPTIONS]

Builds the cargo-fuzz targets of crates/fuzz (installing cargo-fuzz first if it is
missing) and runs each in turn for --seconds, then prints per target the executions,
executions per second, peak memory and the crashes with their artifacts. Exits 1 if any
target crashed, hung past --timeout or ran out of memory; 2 if the options were wrong
or the build failed.

The targets (docs/fuzzing.md says what each feeds and what counts as a failure):
  sql           SQL scripts run against a seeded in-memory database
  scheme        replication scheme DDL through parser, validator, ALTER, planner
  wire          the data plane's batch codec and Replicate / Copy messages
  log_record    the store's commit log, row, catalog and write-ahead log decoders
  raft_payload  the control plane's RaftPeer payloads and what a node does with them

Each run starts from the seed corpus in crates/fuzz/corpus/<target>, read only: new inputs
go to a temporary directory, removed at the end, unless --grow-corpus merges those that
add coverage into the repository's corpus. Crash artifacts go to
crates/fuzz/artifacts/<target>/ (not tracked); rerun one with
  crates/fuzz/target/x86_64-unknown-linux-gnu/release/<target> <artifact>

Options:
  --seconds N      fuzzing time per target (default 60; the build comes on top)
  --target NAME    a target to run; repeatable (default: all five)
  --jobs N         fuzzing processes per target, side by side (default 1)
  --timeout N      seconds one input may take before it counts as a hang (default 10)
  --sanitizer S    none (default) or address. The SQL target measures stack use as a
                   node has it; AddressSanitizer's larger frames would overflow sooner
  --grow-corpus    merge the inputs that found new coverage into crates/fuzz/corpus
  --keep           keep the work directory (logs, the temporary corpora)
  -h, --help       show this help

cargo fuzz needs nightly features: the build runs with RUSTC_BOOTSTRAP=1 on the stable
toolchain, in crates/fuzz/target (apart from the workspace's target directory).
EOF
}

prog=fuzz.sh
die() {
    echo "$prog: $*" >&2
    exit 2
}
log() {
    echo "$prog: $*" >&2
}
need_value() {
    [[ $# -ge 2 ]] || die "$1 needs a value (see --help)"
}

all_targets=(sql scheme wire log_record raft_payload)
seconds=60
jobs=1
timeout=10
sanitizer=none
grow=0
keep=0
targets=()

while [[ $# -gt 0 ]]; do
    case "$1" in
    --seconds) need_value "$@"; seconds="$2"; shift 2 ;;
    --target) need_value "$@"; targets+=("$2"); shift 2 ;;
    --jobs) need_value "$@"; jobs="$2"; shift 2 ;;
    --timeout) need_value "$@"; timeout="$2"; shift 2 ;;
    --sanitizer) need_value "$@"; sanitizer="$2"; shift 2 ;;
    --grow-corpus) grow=1; shift ;;
    --keep) keep=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
done
[[ $seconds =~ ^[1-9][0-9]*$ ]] || die "--seconds must be a positive whole number"
[[ $jobs =~ ^[1-9][0-9]*$ ]] || die "--jobs must be a positive whole number"
[[ $timeout =~ ^[1-9][0-9]*$ ]] || die "--timeout must be a positive whole number"
case "$sanitizer" in none | address) ;; *) die "--sanitizer must be none or address" ;; esac
((${#targets[@]} > 0)) || targets=("${all_targets[@]}")
for t in "${targets[@]}"; do
    [[ " ${all_targets[*]} " == *" $t "* ]] || die "unknown target '$t' (one of: ${all_targets[*]})"
done

repo="$(cd "$(dirname "$0")/.." && pwd)"
fuzz_dir="$repo/crates/fuzz"
triple="$(rustc -vV | sed -n 's/^host: //p')"
bin_dir="$fuzz_dir/target/$triple/release"
work="$(mktemp -d "${TMPDIR:-/tmp}/hawser-fuzz.XXXXXX")"
cleanup() {
    local status=$?
    if [[ $keep -eq 1 ]]; then log "kept $work"; else rm -rf "$work"; fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if ! cargo fuzz --version >/dev/null 2>&1; then
    log "installing cargo-fuzz (cargo install cargo-fuzz --locked)"
    cargo install cargo-fuzz --locked || die "cargo install cargo-fuzz failed"
fi

# Its own target directory, whatever the caller's CARGO_TARGET_DIR says: the binaries
# are looked for there, and the instrumented build must not replace the workspace's.
export CARGO_TARGET_DIR="$fuzz_dir/target"
build_start=$SECONDS
build_args=(--fuzz-dir "$fuzz_dir" --release --debug-assertions --sanitizer "$sanitizer")
# All five at once: they share every dependency, so one more target costs a link.
log "building the fuzz targets (sanitizer: $sanitizer)"
RUSTC_BOOTSTRAP=1 cargo fuzz build "${build_args[@]}" || die "cargo fuzz build failed"
log "built in $((SECONDS - build_start)) s"

# libFuzzer's options per target: SQL gets inputs long enough to reach the complexity
# limits (crates/sql/src/limits.rs: 4096 tokens), the others libFuzzer's default of 4 KB.
max_len() {
    case "$1" in
    sql) echo 20000 ;;
    *) echo 4096 ;;
    esac
}

# The value of libFuzzer's final statistic $2 in log $1, or 0.
final_stat() {
    sed -n "s/^stat::$2: *//p" "$1" | tail -1 | grep . || echo 0
}

failed=0
total=0
summary=()
for t in "${targets[@]}"; do
    bin="$bin_dir/$t"
    [[ -x $bin ]] || die "$bin was not built"
    run_dir="$work/$t"
    new_corpus="$work/corpus/$t"
    artifacts="$fuzz_dir/artifacts/$t"
    mkdir -p "$run_dir" "$new_corpus" "$artifacts"
    log "fuzzing $t for $seconds s ($jobs job(s))"
    opts=(
        -max_total_time="$seconds"
        -timeout="$timeout"
        -rss_limit_mb=2048
        -max_len="$(max_len "$t")"
        -artifact_prefix="$artifacts/"
        -print_final_stats=1
    )
    # A dictionary (crates/fuzz/dict): keywords of the text targets, JSON keys of Raft's.
    [[ -f $fuzz_dir/dict/$t.dict ]] && opts+=(-dict="$fuzz_dir/dict/$t.dict")
    status=0
    if ((jobs == 1)); then
        (cd "$run_dir" && "$bin" "${opts[@]}" "$new_corpus" "$fuzz_dir/corpus/$t") \
            >"$run_dir/fuzz-0.log" 2>&1 || status=$?
    else
        # libFuzzer's -jobs writes one fuzz-N.log per job into the working directory.
        (cd "$run_dir" && "$bin" "${opts[@]}" -jobs="$jobs" -workers="$jobs" \
            "$new_corpus" "$fuzz_dir/corpus/$t") >"$run_dir/driver.log" 2>&1 || status=$?
    fi
    execs=0
    rate=0
    rss=0
    crashes=()
    for f in "$run_dir"/fuzz-*.log; do
        [[ -f $f ]] || continue
        execs=$((execs + $(final_stat "$f" number_of_executed_units)))
        rate=$((rate + $(final_stat "$f" average_exec_per_sec)))
        r=$(final_stat "$f" peak_rss_mb)
        ((r > rss)) && rss=$r
        while read -r a; do crashes+=("$a"); done < <(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$f")
    done
    total=$((total + execs))
    if ((${#crashes[@]} > 0)) || ((status != 0)); then
        failed=1
        line=$(printf '%-13s %12d executions %8d exec/s %6d MB  FAILED (exit %d, %d artifact(s))' \
            "$t" "$execs" "$rate" "$rss" "$status" "${#crashes[@]}")
        log "$t failed; the log's end:"
        tail -n 30 "$run_dir"/fuzz-*.log >&2 || true
        keep=1
    else
        line=$(printf '%-13s %12d executions %8d exec/s %6d MB  no crash' "$t" "$execs" "$rate" "$rss")
    fi
    summary+=("$line")
    for a in "${crashes[@]}"; do summary+=("    artifact: $a"); done
    if ((grow == 1)); then
        n_before=$(find "$fuzz_dir/corpus/$t" -type f | wc -l)
        "$bin" -merge=1 -max_len="$(max_len "$t")" -timeout="$timeout" \
            "$fuzz_dir/corpus/$t" "$new_corpus" >"$run_dir/merge.log" 2>&1 ||
            die "merging the new inputs of $t failed (see $run_dir/merge.log)"
        n_after=$(find "$fuzz_dir/corpus/$t" -type f | wc -l)
        summary+=("    corpus: $((n_after - n_before)) input(s) added to crates/fuzz/corpus/$t")
    fi
done

echo
printf '%s\n' "${summary[@]}"
printf '%-13s %12d executions in all, %d s per target\n' "total" "$total" "$seconds"
if ((failed == 1)); then
    log "a target failed"
    exit 1
fi
