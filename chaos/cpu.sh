#!/usr/bin/env bash
# CPU per commit of each node of a three-node hawser cluster under `hawser bench`, for one
# binary or two compared in alternating runs. See --help.

set -euo pipefail

usage() {
    cat <<'EOF'
Usage: cpu.sh [OPTIONS]

Starts three hawser nodes on loopback as chaos/pg/versus.sh does (ds1 the master, ds2 the
subscriber the return service waits for, ds3 an asynchronous subscriber; one async worker
each), runs `hawser bench --mode MODE` against ds1, and prints per run commits/s, the
bench's p50 / p99 and each node's CPU per commit in microseconds: user + system time from
/proc/PID/stat over the whole bench (its warm-up and the subscribers' catch-up included),
divided by the commits the master counted over the same span (the bench's
`server_commits`). Under each run a second line says where each node's flushes went,
from its /metrics over its life: the mean flush in ms as the log's sync (the disk) plus
the move of durable batches into sled, and the mean of its checkpoints' sled flushes
(absent for a build without those histograms). A fresh cluster per run. With two
--hawser binaries the runs alternate A B, B A, ... by round and a last line gives each
binary's means, so a change's CPU cost or saving can be read against the host's drift.

Options:
  --hawser BIN       the binary to measure; twice to compare two (default: target/release/
                     hawser of this checkout, built if missing)
  --mode M           async | receipt | twosafe (default async)
  --clients N        bench clients (default 16)
  --duration SECS    measured seconds per run (default 8)
  --rounds N         runs per binary (default 3)
  --sub-args "ARGS"  extra `hawser start` flags for ds2 and ds3 (e.g. "--no-compile";
                     "--threads N" replaces the default of one thread)
  --master-args "ARGS"
                     extra `hawser start` flags for ds1 (e.g. "--threads 4" or
                     "--compress-codec zstd")
  --bench-args "ARGS"
                     extra `hawser bench` flags (e.g. "--compress", "--connections 0"
                     instead of the default of one shared connection)
  --target "CLAUSE"  the subscribers' target table, as `hawser bench --target` takes it
                     (e.g. "CCD NONCONDENSED INTO bench_hist"; docs/targets.md); with
                     a BASE AGGREGATE the bench table is created on every node first
  --bidirectional    the scheme also sends the bench table back from ds2 to ds1 (two
                     masters; the bench still writes on ds1): `hawser bench
                     --bidirectional`, with the table created on every node first
  --check-conflicts  CHECK CONFLICTS BY ROW TIMESTAMP on the scheme's elements (`hawser
                     bench --check-conflicts`; the table gets ts BINARY(8))
  --tls              run the nodes secure: a CA, one node certificate for the three and
                     an admin client certificate made in the work directory (default:
                     --insecure)
  --json             one JSON object per run (and one for the means) instead of text
  -h, --help         show this help

Every node is stopped and every directory removed on every exit path. Linux only (reads
/proc). The figures move with the host: compare binaries in the same invocation.
EOF
}

mode=async
clients=16
duration=8
rounds=3
sub_args=""
master_args=""
bench_args=""
json=0
tls=0
target=()
pair=()
binaries=()

prog=cpu.sh
# shellcheck source=chaos/pg/args.sh
source "$(dirname "$0")/pg/args.sh"

while [[ $# -gt 0 ]]; do
    case "$1" in
    --hawser) need_value "$@"; binaries+=("$2"); shift 2 ;;
    --mode) need_value "$@"; mode="$2"; shift 2 ;;
    --clients) need_value "$@"; clients="$2"; shift 2 ;;
    --duration) need_value "$@"; duration="$2"; shift 2 ;;
    --rounds) need_value "$@"; rounds="$2"; shift 2 ;;
    --sub-args) need_value "$@"; sub_args="$2"; shift 2 ;;
    --master-args) need_value "$@"; master_args="$2"; shift 2 ;;
    --bench-args) need_value "$@"; bench_args="$2"; shift 2 ;;
    --tls) tls=1; shift ;;
    --target) need_value "$@"; target=(--target "$2"); shift 2 ;;
    --bidirectional) pair+=(--bidirectional); shift ;;
    --check-conflicts) pair+=(--check-conflicts); shift ;;
    --json) json=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
done
case "$mode" in async | receipt | twosafe) ;; *) die "--mode must be async, receipt or twosafe" ;; esac
[[ $clients =~ ^[1-9][0-9]*$ ]] || die "--clients must be a positive whole number"
[[ $duration =~ ^[1-9][0-9]*$ ]] || die "--duration must be a positive whole number of seconds"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a positive whole number"
((${#binaries[@]} <= 2)) || die "--hawser at most twice"
[[ -r /proc/self/stat ]] || die "needs Linux's /proc"
command -v python3 >/dev/null || die "python3 is needed (it reads the JSON results)"

repo="$(cd "$(dirname "$0")/.." && pwd)"
if ((${#binaries[@]} == 0)); then
    if [[ ! -x $repo/target/release/hawser ]]; then
        log "building hawser (cargo build --release)"
        (cd "$repo" && cargo build --release --quiet -p hawser-cli) || die "cargo build --release failed"
    fi
    binaries=("$repo/target/release/hawser")
fi
for b in "${binaries[@]}"; do [[ -x $b ]] || die "$b is not an executable"; done

root="$(mktemp -d "${TMPDIR:-/tmp}/hawser-cpu.XXXXXX")"
here="$(dirname "$0")"
keep=0
hawser=""
work="$root/none"
# shellcheck source=chaos/nodes.sh
source "$here/nodes.sh"
trap 'cleanup; rm -rf "$root"' EXIT
trap 'exit 130' INT TERM
if [[ $tls == 1 ]]; then
    export HAWSER_CERTS_DIR="$root/certs"
    "${binaries[0]}" cert create-ca >/dev/null
    "${binaries[0]}" cert create-node nodes localhost 127.0.0.1 >/dev/null
    "${binaries[0]}" cert create-client root --role admin >/dev/null
else
    unset HAWSER_CERTS_DIR
fi

# The flags $1 (a list of flags) with "$2 $3" in front unless they name $2 themselves:
# the default a caller's own flags replace (clap refuses a flag given twice).
with_default() {
    local flags="$1" flag="$2" value="$3"
    if [[ " $flags " == *" $flag "* ]]; then echo "$flags"; else echo "$flag $value $flags"; fi
}

# One run of binary $1 in round $2: leaves its JSON line in $root/last.json. Runs in
# this shell, not in a $(...) subshell, so that die stops every node through the trap.
run() {
    hawser="$1"
    local round="$2" n
    work="$root/run$round-$RANDOM"
    mkdir -p "$work"
    nodes ds1 ds2 ds3
    trap 'cleanup; rm -rf "$root"' EXIT
    # shellcheck disable=SC2046 # lists of flags
    start ds1 $(with_default "$master_args" --threads 1)
    "$hawser" init --host "${grpc[ds1]}" >"$work/init.out" 2>&1 || { cat "$work/init.out" >&2; die "hawser init failed"; }
    # shellcheck disable=SC2046
    start ds2 --join "${grpc[ds1]}" $(with_default "$sub_args" --threads 1)
    # shellcheck disable=SC2046
    start ds3 --join "${grpc[ds1]}" $(with_default "$sub_args" --threads 1)
    local deadline=$((SECONDS + 60))
    until [[ $("$hawser" status --host "${grpc[ds1]}" --format json 2>/dev/null |
        python3 -c 'import json, sys; print(sum(1 for n in json.load(sys.stdin)["cluster"]["nodes"] if n["membership"] == "voter"))' 2>/dev/null) == 3 ]]; do
        ((SECONDS < deadline)) || die "the three nodes did not become voters within 60 s"
        sleep 0.2
    done
    if [[ " ${pair[*]} " == *" --bidirectional "* || " ${target[*]} " == *"BASE AGGREGATE"* ]]; then
        # A TABLE element's table is created on each node (its DDL is not replicated):
        # both masters' own, or the copy a BASE AGGREGATE is computed from.
        local ts=""
        [[ " ${pair[*]} " == *" --check-conflicts "* ]] && ts=", ts BINARY(8)"
        for n in ds1 ds2 ds3; do
            sql "$n" -e "create table bench (k bigint primary key, v varchar(1000)$ts)" >/dev/null ||
                die "cannot create the bench table on $n"
        done
    fi
    local before=() after=()
    for n in ds1 ds2 ds3; do before+=("$(proc_ticks "${pid[$n]}")"); done
    # shellcheck disable=SC2046
    "$hawser" bench --host "${grpc[ds1]}" --mode "$mode" --subscriber ds2 --async-subscriber ds3 \
        --clients "$clients" --duration "$duration" --warmup 1 --format json "${target[@]}" "${pair[@]}" \
        $(with_default "$bench_args" --connections 1) >"$work/bench.json" 2>"$work/bench.log" || { tail -n 20 "$work/bench.log" >&2; die "hawser bench failed"; }
    for n in ds1 ds2 ds3; do after+=("$(proc_ticks "${pid[$n]}")"); done
    # Each node's /metrics, for where its flushes' time went (empty from a build without
    # the histograms, or if a node does not answer).
    for n in ds1 ds2 ds3; do
        python3 - "${http[$n]}" "${HAWSER_CERTS_DIR:-}" >"$work/metrics.$n" 2>/dev/null <<'PY' || : >"$work/metrics.$n"
import ssl, sys, urllib.request
addr, certs = sys.argv[1], sys.argv[2]
ctx = None
if certs:  # secure: HTTPS, the CA's own certificate, the admin client certificate
    ctx = ssl.create_default_context(cafile=certs + "/ca.crt")
    ctx.load_cert_chain(certs + "/client.root.crt", certs + "/client.root.key")
url = ("https://" if certs else "http://") + addr + "/metrics"
sys.stdout.write(urllib.request.urlopen(url, timeout=10, context=ctx).read().decode())
PY
    done
    for n in ds1 ds2 ds3; do kill -KILL "${pid[$n]}" 2>/dev/null || true; done
    wait 2>/dev/null || true
    pid=()
    python3 - "$work/bench.json" "$hawser" "$round" "$(getconf CLK_TCK)" "${before[@]}" "${after[@]}" "$work"/metrics.ds{1,2,3} >"$root/last.json" <<'PY'
import json, re, sys
bench, binary, rnd, hz = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
before, after, metrics = sys.argv[5:8], sys.argv[8:11], sys.argv[11:14]
d = json.load(open(bench))
commits = d.get("server_commits") or d["commits"]
cpu = {n: round((int(a) - int(b)) / hz * 1e6 / commits, 1) for n, b, a in zip(("ds1", "ds2", "ds3"), before, after)}

def mean_ms(text, name):
    """The mean of a histogram of seconds, in ms, over the node's life; None if absent."""
    total = re.search(r"^hawser_store_%s_seconds_sum (\S+)$" % name, text, re.M)
    count = re.search(r"^hawser_store_%s_seconds_count (\S+)$" % name, text, re.M)
    if not (total and count) or float(count.group(1)) == 0:
        return None
    return round(float(total.group(1)) / float(count.group(1)) * 1000, 3)

# Where each node's flushes went (the log's sync: the disk; the move into sled), and its
# checkpoints' sled flushes: means over the node's life, warm-up included.
flush = {}
for n, path in zip(("ds1", "ds2", "ds3"), metrics):
    text = open(path).read()
    flush[n] = {k: mean_ms(text, k) for k in ("flush", "log_sync", "move", "checkpoint")}
print(json.dumps({"round": rnd, "hawser": binary, "server_commits": commits, "commits_per_s": round(d["commits_per_sec"], 1),
                  "p50_us": d["latency_us"]["p50"], "p99_us": d["latency_us"]["p99"],
                  "steal_pct": d.get("host_steal_pct"), "cpu_us_per_commit": cpu, "flush_ms_mean": flush,
                  "lag_ms_mean": {s["receiver"]: s["lag_ms_mean"] for s in d.get("streams") or []},
                  "catch_up_ms": d.get("catch_up_ms")}))
PY
    rm -rf "$work"
}

show() {
    if [[ $json -eq 1 ]]; then
        echo "$1"
    else
        python3 -c '
import json, sys
r = json.loads(sys.argv[1]); c = r["cpu_us_per_commit"]; s = r["steal_pct"]
print("round %d  %-28s %9.1f commits/s  p50 %5d us  p99 %6d us  cpu us/commit ds1 %5.1f ds2 %5.1f ds3 %5.1f  steal %s" % (
    r["round"], r["hawser"][-28:], r["commits_per_s"], r["p50_us"], r["p99_us"], c["ds1"], c["ds2"], c["ds3"],
    "%.1f %%" % s if s is not None else "?"))
f = r.get("flush_ms_mean", {})
ms = lambda v: "%.3f" % v if v is not None else "-"
if any(v is not None for n in f.values() for v in n.values()):
    print("         flush ms (mean: sync + move; checkpoint)  " + "   ".join(
        "%s %s = %s + %s; %s" % (n, ms(f[n]["flush"]), ms(f[n]["log_sync"]), ms(f[n]["move"]), ms(f[n]["checkpoint"]))
        for n in ("ds1", "ds2", "ds3")))
lag = r.get("lag_ms_mean") or {}
if lag or r.get("catch_up_ms") is not None:
    print("         lag ms (mean under load) " + "  ".join("%s %.1f" % (k, v) for k, v in sorted(lag.items()) if v is not None)
          + ("   catch-up %.0f ms" % r["catch_up_ms"] if r.get("catch_up_ms") is not None else ""))' "$1"
    fi
}

results="$root/results.jsonl"
: >"$results"
log "$mode, $clients clients, ${duration}s, $rounds round(s) of ${#binaries[@]} binary(ies)"
for round in $(seq "$rounds"); do
    order=("${binaries[@]}")
    if ((${#binaries[@]} == 2 && round % 2 == 0)); then order=("${binaries[1]}" "${binaries[0]}"); fi
    for b in "${order[@]}"; do
        run "$b" "$round"
        line="$(cat "$root/last.json")"
        echo "$line" >>"$results"
        show "$line"
    done
done
python3 - "$results" "$json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
out = []
for b in dict.fromkeys(r["hawser"] for r in rows):
    rs = [r for r in rows if r["hawser"] == b]
    mean = lambda f: round(sum(f(r) for r in rs) / len(rs), 1)
    out.append({"hawser": b, "runs": len(rs), "commits_per_s": mean(lambda r: r["commits_per_s"]),
                "p99_us": mean(lambda r: r["p99_us"]),
                "cpu_us_per_commit": {n: mean(lambda r, n=n: r["cpu_us_per_commit"][n]) for n in ("ds1", "ds2", "ds3")}})
for m in out:
    if sys.argv[2] == "1":
        print(json.dumps({"means": m}))
    else:
        c = m["cpu_us_per_commit"]
        print("means    %-28s %9.1f commits/s  p99 %6.0f us  cpu us/commit ds1 %5.1f ds2 %5.1f ds3 %5.1f  (%d runs)" % (
            m["hawser"][-28:], m["commits_per_s"], m["p99_us"], c["ds1"], c["ds2"], c["ds3"], m["runs"]))
PY
