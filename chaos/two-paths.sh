#!/usr/bin/env bash
# A subscriber fed one master's transactions by two streams, under a load that
# alternates between them, with optional SIGKILLs: how long after the load the
# subscriber has the master's tables, and whether it has them exactly.
#
# Three nodes on loopback: ds1 masters `accounts` and `events`; ds3 gets `accounts` from
# ds1 itself and `events` through ds2, a propagator (docs/stream.md, "Two paths from one
# origin to one receiver"). With --scheme demo ds2 also receives `accounts` (the demo's
# routes); with --scheme blind it does not (a blind propagator). With --scheme relays a
# fourth node, ds4, relays `accounts` to ds3 in place of ds1 (two blind relays).

set -euo pipefail

usage() {
    cat <<'EOF'
Usage: two-paths.sh [OPTIONS]

Runs `hawser sql -f` of a script on ds1 that cycles through four transactions: `accounts`
and `events` in one (split between ds1's stream and ds2's), `accounts` alone, `events`
alone, a delete from `events` with an `accounts` update. Then waits until ds3's copy of
each table equals ds1's (CRC of the rows in key order) and reports how long that took
after the load ended. With --scheme relays the transactions writing both tables reach
ds3 in two parts, one by each relay.

Options:
  --statements N   transactions in the script (default 20000)
  --scheme S       demo (ds2 receives both tables), blind (ds2 receives only events)
                   or relays (ds2 relays events, ds4 accounts; four nodes) (default demo)
  --kills          SIGKILL ds3, then ds2 (and ds4), and start them again on their data,
                   over and over while the load runs
  --hawser BIN     the hawser binary (default: target/release/hawser of this checkout,
                   built if missing; else hawser on PATH)
  --wait SECS      how long to wait for ds3 after the load (default 300)
  --json           one JSON object instead of text
  --keep           keep the nodes' data directories
  -h, --help       show this help

Progress goes to stderr; results to stdout. Exits 1 if a table of ds3 differs from ds1's
at the end of the wait. Every node started is stopped on every exit path.
EOF
}

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
statements=20000
scheme=demo
kills=0
hawser=""
wait_secs=300
json=0
keep=0

die() { echo "two-paths.sh: $*" >&2; exit 2; }
need_value() { [[ $# -ge 2 ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
    --statements) need_value "$@"; statements="$2"; shift 2 ;;
    --scheme) need_value "$@"; scheme="$2"; shift 2 ;;
    --kills) kills=1; shift ;;
    --hawser) need_value "$@"; hawser="$2"; shift 2 ;;
    --wait) need_value "$@"; wait_secs="$2"; shift 2 ;;
    --json) json=1; shift ;;
    --keep) keep=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
    esac
done
[[ $statements =~ ^[0-9]+$ ]] || die "--statements must be a whole number"
[[ $wait_secs =~ ^[0-9]+$ ]] || die "--wait must be a whole number of seconds"
stores=(ds1 ds2 ds3)
case "$scheme" in demo) accounts_to="ds2, ds3" ;; blind) accounts_to="ds3" ;;
relays) accounts_to="ds4"; stores+=(ds4) ;;
*) die "--scheme must be demo, blind or relays" ;; esac

work="$(mktemp -d "${TMPDIR:-/tmp}/hawser-two-paths.XXXXXX")"
# shellcheck source=chaos/nodes.sh
source "$here/nodes.sh"
find_hawser
nodes "${stores[@]}"

echo "starting ${stores[*]} ($hawser)" >&2
start ds1
"$hawser" init --host "${grpc[ds1]}" >/dev/null
for n in "${stores[@]:1}"; do
    start "$n" --join "${grpc[ds1]}"
done
for n in "${stores[@]}"; do
    for _ in $(seq 100); do
        sql "$n" -e "create table accounts (k int primary key, v int); create table events (k int primary key, v varchar(60))" \
            >/dev/null 2>&1 && break
        sleep 0.2
    done
done
relay_accounts=""
[[ $scheme == relays ]] && relay_accounts="
ELEMENT a2 TABLE accounts PROPAGATOR ds4 SUBSCRIBER ds3"
sql ds1 -e "CREATE REPLICATION paths
ELEMENT a TABLE accounts MASTER ds1 SUBSCRIBER $accounts_to
ELEMENT e TABLE events MASTER ds1 SUBSCRIBER ds2
ELEMENT e2 TABLE events PROPAGATOR ds2 SUBSCRIBER ds3$relay_accounts" >/dev/null

python3 - "$statements" >"$work/load.sql" <<'PY'
import sys
n = int(sys.argv[1])
print("insert into accounts values " + ", ".join(f"({k}, 0)" for k in range(50)) + ";")
for i in range(n):
    k = i % 50
    m = i % 4
    if m == 0:
        print(f"begin; update accounts set v = v + 1 where k = {k}; insert into events values ({i}, 'split {i}'); commit;")
    elif m == 1:
        print(f"update accounts set v = v + 10 where k = {k};")
    elif m == 2:
        print(f"insert into events values ({i}, 'event {i}');")
    else:
        print(f"begin; delete from events where k = {i - 3}; update accounts set v = v - 1 where k = {(k + 7) % 50}; commit;")
PY

# Until ds3 has streams from both senders, what it gets first may be only one path's.
for _ in $(seq 100); do
    streams="$(curl -s "http://${http[ds3]}/replication" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["inbound"]))' 2>/dev/null || echo 0)"
    [[ $streams == 2 ]] && break
    sleep 0.2
done

echo "loading $statements transactions on ds1 (scheme $scheme, kills $kills)" >&2
started=$(date +%s.%N)
sql ds1 -f "$work/load.sql" >"$work/load.out" 2>&1 &
load=$!
rounds=0
if [[ $kills == 1 ]]; then
    while kill -0 $load 2>/dev/null; do
        for victim in "${stores[@]:2}" ds2; do
            sleep 0.7
            kill -9 "${pid[$victim]}" 2>/dev/null || true
            wait "${pid[$victim]}" 2>/dev/null || true
            sleep 0.3
            start "$victim"
        done
        rounds=$((rounds + 1))
    done
fi
wait $load || die "the load failed: $(tail -3 "$work/load.out")"
loaded=$(date +%s.%N)

checksum() { sql "$1" --format json -e "select * from $2 order by k" 2>/dev/null | cksum | cut -d' ' -f1; }
declare -A caught match
deadline=$(($(date +%s) + wait_secs))
for t in accounts events; do
    want="$(checksum ds1 $t)"
    match[$t]=false
    while :; do
        if [[ "$(checksum ds3 $t)" == "$want" ]]; then
            match[$t]=true
            break
        fi
        [[ $(date +%s) -ge $deadline ]] && break
        sleep 0.1
    done
    caught[$t]=$(python3 -c "import time; print(round(time.time() - $loaded, 2))")
done
load_s=$(python3 -c "print(round($loaded - $started, 2))")

if [[ $json == 1 ]]; then
    printf '{"scheme":"%s","statements":%s,"kill_rounds":%s,"load_s":%s,' \
        "$scheme" "$statements" "$rounds" "$load_s"
    printf '"accounts":{"equal":%s,"after_load_s":%s},"events":{"equal":%s,"after_load_s":%s}}\n' \
        "${match[accounts]}" "${caught[accounts]}" "${match[events]}" "${caught[events]}"
else
    echo "scheme $scheme, $statements transactions in ${load_s} s, $rounds kill rounds"
    for t in accounts events; do
        echo "  ds3 $t: equal to ds1's ${match[$t]}, ${caught[$t]} s after the load"
    done
fi
[[ ${match[accounts]} == true && ${match[events]} == true ]] || exit 1
