#!/usr/bin/env bash
# hawser against PostgreSQL 15 streaming replication, cell by cell, in one run.
#
# For every round, client count and mode runs the same single-row upsert load against
# PostgreSQL (compare.sh: a fresh primary and synchronous standby per cell) and against a
# fresh three-node hawser cluster on loopback (ds1 master, ds2 the subscriber with the
# return service, ds3 an asynchronous subscriber; `hawser bench --mode`; or two nodes
# with --hawser-nodes 2), back to back, the order alternating by round so that the
# host's drift falls on both sides.
# Prints every run, then the median of each cell and hawser's ratio to PostgreSQL.
# See README.md beside this script.

set -euo pipefail

usage() {
    cat <<'EOF'
Usage: versus.sh [OPTIONS]

Pairs each hawser return service with the PostgreSQL synchronous_commit setting that
promises the same (async ~ local, receipt ~ on, twosafe ~ remote_apply) and measures
both, cell by cell, for several rounds. Output: one line per run (commits/s, p50, p99,
host steal, and the servers' CPU per commit: hawser's nodes, PostgreSQL's primary
and standby, each and together), then a table of medians with hawser / PostgreSQL ratios
and, since the two run back to back within a round, each round's own ratio and how many
rounds hawser was ahead in (or, with --json, one JSON object per run and one per cell).

Options:
  --rounds N         rounds of every cell (default 3)
  --duration SECS    measured seconds per run (default 10)
  --warmup SECS      unmeasured load before each run (default 1)
  --clients "N ..."  client counts (default "1 16")
  --modes "M ..."    hawser modes: async receipt twosafe (default all three)
  --receipt-vs MODE  the synchronous_commit RECEIPT is measured against: on (default:
                     the standby flushed the WAL, RECEIPT's promise) or remote_write
                     (the standby wrote it to its OS, a weaker promise)
  --hawser BIN       the hawser binary (default: target/release/hawser of this
                     checkout, built if missing; else hawser on PATH)
  --pg-bin DIR       PostgreSQL server binaries (passed to compare.sh)
  --sub-threads N    async worker threads of the subscribers ds2 and ds3 (default 1:
                     on a small machine shared by three nodes, one thread each spends
                     less CPU per replicated commit; see `hawser start --help`)
  --master-threads N async worker threads of the master ds1 (default 1, for the same
                     reason; 0 = one per core, a node's default)
  --rate PER_SEC     hold both systems to this many commits per second (all clients
                     together; pgbench --rate and hawser bench --rate: Poisson
                     arrivals, latency counted from each commit's scheduled time), so
                     that their latencies compare at the same load; pick one both
                     sustain at every --clients count (e.g. --clients 16 --rate 3000).
                     Default: every client commits again as soon as it can
  --hawser-nodes N   3 (default): ds1, ds2 with the return service and ds3 an
                     asynchronous subscriber, the shape hawser's published figures use; 2:
                     ds1 and ds2 only, the shape of PostgreSQL's primary and one
                     standby (two servers on the machine on either side)
  --async-cpu-class CLASS
                     normal (default), or idle: the servers no commit waits for run
                     in Linux's SCHED_IDLE class, on CPU time the rest leave —
                     hawser's asynchronous subscribers (ds3, and ds2 in async mode;
                     hawser start --cpu-class idle) and PostgreSQL's standby in the
                     local mode (compare.sh --standby-cpu-class idle)
  --connections N    connections hawser bench's clients share (default 1: the clients
                     of a gRPC application share one channel, HTTP/2 carrying one
                     stream per client; 0 = one per client, as pgbench's have)
  --tls              run hawser secure: a CA and certificates made in the work
                     directory, every call between the nodes and from the bench
                     mutual TLS (default: --insecure, as PostgreSQL's side runs
                     without SSL)
  --json             JSON lines instead of text
  --keep             keep the hawser nodes' data directories
  -h, --help         show this help

Progress goes to stderr; results to stdout. Every node started is stopped on every
exit path.
EOF
}

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
rounds=3
duration=10
warmup=1
clients_list="1 16"
modes="async receipt twosafe"
receipt_vs=on
hawser=""
pg_args=()
sub_threads=1
master_threads=1
hawser_nodes=3
rate=""
connections=1
async_class=normal
json=0
keep=0
tls=0

prog=versus.sh
# shellcheck source=chaos/pg/args.sh
source "$here/args.sh"

while [[ $# -gt 0 ]]; do
    case "$1" in
    --rounds) need_value "$@"; rounds="$2"; shift 2 ;;
    --duration) need_value "$@"; duration="$2"; shift 2 ;;
    --warmup) need_value "$@"; warmup="$2"; shift 2 ;;
    --clients) need_value "$@"; clients_list="$2"; shift 2 ;;
    --modes) need_value "$@"; modes="$2"; shift 2 ;;
    --receipt-vs) need_value "$@"; receipt_vs="$2"; shift 2 ;;
    --hawser) need_value "$@"; hawser="$2"; shift 2 ;;
    --pg-bin) need_value "$@"; pg_args=(--pg-bin "$2"); shift 2 ;;
    --sub-threads) need_value "$@"; sub_threads="$2"; shift 2 ;;
    --master-threads) need_value "$@"; master_threads="$2"; shift 2 ;;
    --connections) need_value "$@"; connections="$2"; shift 2 ;;
    --hawser-nodes) need_value "$@"; hawser_nodes="$2"; shift 2 ;;
    --rate) need_value "$@"; rate="$2"; shift 2 ;;
    --async-cpu-class) need_value "$@"; async_class="$2"; shift 2 ;;
    --json) json=1; shift ;;
    --tls) tls=1; shift ;;
    --keep) keep=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
done

[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a whole number ≥ 1"
check_run_args
[[ $sub_threads =~ ^[0-9]+$ ]] || die "--sub-threads must be a whole number"
[[ $master_threads =~ ^[0-9]+$ ]] || die "--master-threads must be a whole number"
[[ $connections =~ ^[0-9]+$ ]] || die "--connections must be a whole number"
[[ $hawser_nodes == 2 || $hawser_nodes == 3 ]] || die "--hawser-nodes must be 2 or 3"
check_rate
case "$async_class" in normal | idle) ;; *) die "--async-cpu-class must be normal or idle" ;; esac
rate_args=()
[[ -z $rate ]] || rate_args=(--rate "$rate")
[[ -n ${modes// /} ]] || die "--modes is empty"
case "$receipt_vs" in on | remote_write) ;; *) die "--receipt-vs must be on or remote_write" ;; esac
pg_mode() {
    case "$1" in
    async) echo local ;;
    receipt) echo "$receipt_vs" ;;
    twosafe) echo remote_apply ;;
    *) return 1 ;;
    esac
}
for m in $modes; do
    pg_mode "$m" >/dev/null || die "--modes: '$m' is not a hawser bench mode (async receipt twosafe)"
done
command -v python3 >/dev/null || die "python3 is needed (it reads the JSON results)"

if [[ -z $hawser ]]; then
    if [[ -f $repo/Cargo.toml ]]; then
        log "building hawser (cargo build --release)"
        (cd "$repo" && cargo build --release --quiet) || die "cargo build --release failed"
        hawser="$repo/target/release/hawser"
    elif command -v hawser >/dev/null; then
        hawser="$(command -v hawser)"
    else
        die "no hawser binary: pass --hawser BIN"
    fi
fi
[[ -x $hawser ]] || die "$hawser is not an executable"

work="$(mktemp -d "${TMPDIR:-/tmp}/hawser-versus.XXXXXX")"
pids=()
# Secure: every hawser command below (nodes, init, sql, bench) reads the certificates
# from HAWSER_CERTS_DIR; one node certificate serves the three on loopback.
security=(--insecure)
if [[ $tls == 1 ]]; then
    export HAWSER_CERTS_DIR="$work/certs"
    "$hawser" cert create-ca >/dev/null
    "$hawser" cert create-node nodes localhost 127.0.0.1 >/dev/null
    "$hawser" cert create-client root --role admin >/dev/null
    security=()
else
    unset HAWSER_CERTS_DIR
fi

# Stops the cluster's nodes: SIGTERM, and SIGKILL for one still there after 5 s.
stop_cluster() {
    local pid
    for pid in "${pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    pids=()
}

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    set +e
    stop_cluster
    leave_work "$status"
}
trap_cleanup

# Starts node $1 on free ports (port 0) with extra flags, its data and logs in $cell;
# sets grpc_$1 from its ready line.
start_node() {
    local name="$1"
    shift
    "$hawser" start "${security[@]}" --name "$name" --listen 127.0.0.1:0 --http 127.0.0.1:0 \
        --data "$cell/$name" --log warn "$@" >"$cell/$name.out" 2>"$cell/$name.log" &
    pids+=($!)
    local pid=$! line=""
    for _ in $(seq 300); do
        line="$(grep -m1 '^ready ' "$cell/$name.out" 2>/dev/null || true)"
        [[ -n $line ]] && break
        kill -0 "$pid" 2>/dev/null || { tail -n 20 "$cell/$name.log" >&2; die "node $name exited at start"; }
        sleep 0.1
    done
    [[ -n $line ]] || { tail -n 20 "$cell/$name.log" >&2; die "node $name did not get ready in 30 s"; }
    local grpc="${line##* grpc=}"
    grpc="${grpc%% *}"
    printf -v "grpc_$name" '%s' "$grpc"
}

voters() {
    "$hawser" status --host "$grpc_ds1" --format json 2>/dev/null |
        python3 -c 'import json, sys; print(sum(1 for n in json.load(sys.stdin)["cluster"]["nodes"] if n["membership"] == "voter"))' \
            2>/dev/null || echo 0
}

# A fresh cluster (three nodes, or two with --hawser-nodes 2) in a new directory, as
# compare.sh makes a fresh PostgreSQL pair for every cell: both systems start each cell
# with an empty table and log.
cells=0
start_cluster() {
    local mode="$1" ds2_class=normal
    [[ $mode != async ]] || ds2_class="$async_class"
    cells=$((cells + 1))
    cell="$work/cell$cells"
    mkdir -p "$cell"
    start_node ds1 --threads "$master_threads"
    "$hawser" init --host "$grpc_ds1" >"$cell/init.out" 2>&1 || { cat "$cell/init.out" >&2; die "hawser init failed"; }
    start_node ds2 --join "$grpc_ds1" --threads "$sub_threads" --cpu-class "$ds2_class"
    [[ $hawser_nodes == 2 ]] ||
        start_node ds3 --join "$grpc_ds1" --threads "$sub_threads" --cpu-class "$async_class"
    local deadline=$((SECONDS + 60))
    until [[ $(voters) == "$hawser_nodes" ]]; do
        ((SECONDS < deadline)) || die "the $hawser_nodes nodes did not become voters within 60 s"
        sleep 0.2
    done
}

log "$("$hawser" --version); $hawser_nodes nodes per cell${rate:+, $rate commits/s scheduled}; asynchronous servers in the $async_class CPU class; under $work"

results="$work/results.tsv"
: >"$results"

# run_pg and run_hawser leave "commits/s p50 p99" in $figures. They run in this shell,
# not in a $(...) subshell, so that die stops everything through the EXIT trap.
figures=""


run_pg() {
    local mode="$1" clients="$2" out before class=normal
    [[ $mode != local ]] || class="$async_class"
    before="$(cpu_sample)"
    out="$(bash "$here/compare.sh" "${pg_args[@]}" "${rate_args[@]}" --standby-cpu-class "$class" --json --modes "$mode" --clients "$clients" \
        --duration "$duration" --warmup "$warmup" 2>"$work/pg.log")" ||
        { tail -n 20 "$work/pg.log" >&2; die "compare.sh failed (mode $mode, $clients clients)"; }
    # compare.sh's steal covers the measured pgbench run only; this run's, the set-up too.
    figures="$(python3 -c '
import json, sys
d = json.loads(sys.argv[1])
split = [d["primary_cpu_us_per_commit"], d["standby_cpu_us_per_commit"]]
print(d["commits_per_s"], d["p50_us"], d["p99_us"], d.get("steal_pct", sys.argv[2]),
      round(sum(split), 1), "/".join("%.0f" % c for c in split))' "$out" "$(steal_since "$before")")"
}

run_hawser() {
    local mode="$1" clients="$2" out before p
    start_cluster "$mode"
    before="$(cpu_sample)"
    # CPU of ds1, ds2 and ds3 (the order start_cluster started them in) over the bench,
    # its warm-up included, as chaos/cpu.sh counts it.
    local ticks_before=() ticks_after=() subscribers=(--subscriber ds2 --async-subscriber ds3)
    [[ $hawser_nodes == 3 ]] || subscribers=(--subscriber ds2)
    for p in "${pids[@]}"; do ticks_before+=("$(proc_ticks "$p")"); done
    out="$("$hawser" bench --host "$grpc_ds1" --mode "$mode" "${subscribers[@]}" \
        --clients "$clients" --connections "$connections" "${rate_args[@]}" --duration "$duration" --warmup "$warmup" --format json 2>"$work/bench.log")" ||
        { tail -n 20 "$work/bench.log" >&2; die "hawser bench failed (mode $mode, $clients clients)"; }
    for p in "${pids[@]}"; do ticks_after+=("$(proc_ticks "$p")"); done
    local steal
    steal="$(steal_since "$before")"
    stop_cluster
    [[ $keep -eq 1 ]] || rm -rf "$cell"
    # The bench's own steal covers its measured seconds only (null off Linux). CPU per
    # commit divides by the commits the master counted over the bench, warm-up included.
    figures="$(python3 -c '
import json, sys
d = json.loads(sys.argv[1]); l = d["latency_us"]; s = d.get("host_steal_pct")
hz = int(sys.argv[3]); ticks = sys.argv[4:]; half = len(ticks) // 2
commits = d.get("server_commits") or d["commits"]
split = [(int(a) - int(b)) * 1e6 / hz / commits for b, a in zip(ticks[:half], ticks[half:])]
print(round(d["commits_per_sec"], 1), l["p50"], l["p99"], round(s, 1) if s is not None else sys.argv[2],
      round(sum(split), 1), "/".join("%.0f" % c for c in split))' \
        "$out" "$steal" "$(getconf CLK_TCK)" "${ticks_before[@]}" "${ticks_after[@]}")"
}

# One line per run: round system mode clients commits/s p50 p99 steal% cpu split, where
# cpu is the servers' CPU per commit in µs (hawser's three nodes, PostgreSQL's primary and
# standby) and split the same per server ("43/24/24", "108/27").
record() {
    local round="$1" system="$2" mode="$3" clients="$4" figures="$5"
    printf '%s\t%s\t%s\t%s\t%s\n' "$round" "$system" "$mode" "$clients" "${figures// /$'\t'}" >>"$results"
    if [[ $json -eq 1 ]]; then
        python3 -c '
import json, sys
r, s, m, c, f = sys.argv[1:]
t, p50, p99, st, cpu, split = f.split()
print(json.dumps({"round": int(r), "system": s, "mode": m, "clients": int(c), "commits_per_s": float(t),
                  "p50_us": int(float(p50)), "p99_us": int(float(p99)), "steal_pct": float(st),
                  "cpu_us_per_commit": float(cpu), "cpu_us_per_commit_by_server": [float(x) for x in split.split("/")]}))' \
            "$round" "$system" "$mode" "$clients" "$figures"
    else
        read -r tps p50 p99 steal cpu split <<<"$figures"
        printf 'round %s  %-8s %-12s clients %-3s %9s commits/s  p50 %6s us  p99 %6s us  steal %5s %%  cpu %6s us/commit (%s)\n' \
            "$round" "$system" "$mode" "$clients" "$tps" "$p50" "$p99" "$steal" "$cpu" "$split"
    fi
}

for round in $(seq "$rounds"); do
    for clients in $clients_list; do
        for mode in $modes; do
            pg="$(pg_mode "$mode")"
            log "round $round/$rounds: $mode vs $pg, $clients clients"
            if ((round % 2 == 1)); then
                run_pg "$pg" "$clients"
                record "$round" postgres "$pg" "$clients" "$figures"
                run_hawser "$mode" "$clients"
                record "$round" hawser "$mode" "$clients" "$figures"
            else
                run_hawser "$mode" "$clients"
                record "$round" hawser "$mode" "$clients" "$figures"
                run_pg "$pg" "$clients"
                record "$round" postgres "$pg" "$clients" "$figures"
            fi
        done
    done
done

# Medians per cell, and the ratio of hawser's to PostgreSQL's.
python3 - "$results" "$json" "$receipt_vs" "$rate" <<'EOF'
import json
import statistics
import sys

rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line.strip()]
as_json = sys.argv[2] == "1"
pair = {"async": "local", "receipt": sys.argv[3], "twosafe": "remote_apply"}
cells = {}
by_round = {}
steal = {}
for rnd, system, mode, clients, tps, p50, p99, st, cpu, _split in rows:
    cells.setdefault((system, mode, int(clients)), []).append((float(tps), float(p50), float(p99), float(cpu)))
    by_round[(int(rnd), system, mode, int(clients))] = (float(tps), float(p99))
    steal[(int(rnd), system, mode, int(clients))] = float(st)

# A round in which either run lost this much of the CPU to other guests is marked: its
# ratio says more about the host than about the two systems.
NOISY_STEAL_PCT = 5.0

# Held to one rate (--rate), both systems commit about as many per second: a round is
# then won by the shorter tail, and its ratio is PostgreSQL's p99 over hawser's (above 1:
# hawser's p99 is lower). Otherwise hawser's commits/s over PostgreSQL's.
rated = bool(sys.argv[4])

def round_ratio(hw, pg):
    return pg[1] / hw[1] if rated else hw[0] / pg[0]

def med(runs, i):
    return statistics.median(r[i] for r in runs)

if not as_json:
    print()
    print("medians of %d rounds%s" % (max(int(r[0]) for r in rows),
                                      ", both held to %s commits/s" % sys.argv[4] if sys.argv[4] else ""))
    print("%-8s %-13s %7s  %10s %10s %6s  %8s %8s  %8s %8s  %6s %6s  %s" % (
        "hawser", "postgres", "clients", "hawser c/s", "pg c/s", "ratio", "p50 hw", "p50 pg",
        "p99 hw", "p99 pg", "cpu hw", "cpu pg",
        "%s (per-round ratios; * = steal >= %g %%)  quiet rounds"
        % ("rounds with the lower p99, pg/hw" if rated else "rounds ahead", NOISY_STEAL_PCT)))
for (system, mode, clients), runs in sorted(cells.items(), key=lambda kv: (kv[0][2], kv[0][1])):
    if system != "hawser":
        continue
    pg_runs = cells.get(("postgres", pair[mode], clients))
    if not pg_runs:
        continue
    hw, pg = med(runs, 0), med(pg_runs, 0)
    ratio = hw / pg if pg else float("nan")
    # The two systems run back to back within a round, so a round's own ratio cancels
    # most of the host's drift between rounds: a cell is clearly ahead or behind only
    # when every round says so.
    rounds = sorted({k[0] for k in by_round if k[1:] == ("hawser", mode, clients)})
    round_ratios = [
        round_ratio(by_round[(r, "hawser", mode, clients)], by_round[(r, "postgres", pair[mode], clients)])
        for r in rounds
        if by_round.get((r, "postgres", pair[mode], clients))
    ]
    ahead = sum(1 for q in round_ratios if q > 1)
    round_steal = [
        (steal[(r, "hawser", mode, clients)], steal[(r, "postgres", pair[mode], clients)])
        for r in rounds
        if by_round.get((r, "postgres", pair[mode], clients))
    ]
    marks = ["*" if max(st) >= NOISY_STEAL_PCT else "" for st in round_steal]
    quiet = [q for q, m in zip(round_ratios, marks) if not m]
    if as_json:
        print(json.dumps({
            "cell": True, "mode": mode, "postgres_mode": pair[mode], "clients": clients,
            "rate": float(sys.argv[4]) if sys.argv[4] else None,
            "rounds": len(runs), "hawser_commits_per_s": hw, "postgres_commits_per_s": pg,
            "ratio": round(ratio, 3), "hawser_p50_us": med(runs, 1), "postgres_p50_us": med(pg_runs, 1),
            "hawser_p99_us": med(runs, 2), "postgres_p99_us": med(pg_runs, 2),
            "hawser_cpu_us_per_commit": med(runs, 3), "postgres_cpu_us_per_commit": med(pg_runs, 3),
            "hawser_runs": [r[0] for r in runs], "postgres_runs": [r[0] for r in pg_runs],
            "round_ratios": [round(q, 3) for q in round_ratios], "rounds_ahead": ahead,
            "round_ratio_of": "postgres_p99_over_hawser_p99" if rated else "hawser_over_postgres_commits_per_s",
            "round_steal_pct": [{"hawser": h, "postgres": g} for h, g in round_steal],
            "quiet_round_ratios": [round(q, 3) for q in quiet],
        }))
    else:
        print("%-8s %-13s %7d  %10.0f %10.0f %5.2fx  %8.0f %8.0f  %8.0f %8.0f  %6.0f %6.0f  %d/%d (%s)  %s" % (
            mode, pair[mode], clients, hw, pg, ratio, med(runs, 1), med(pg_runs, 1),
            med(runs, 2), med(pg_runs, 2), med(runs, 3), med(pg_runs, 3),
            ahead, len(round_ratios), " ".join("%.2f%s" % (q, m) for q, m in zip(round_ratios, marks)),
            "%d ahead of %d" % (sum(1 for q in quiet if q > 1), len(quiet)) if quiet else "none"))
EOF
