#!/usr/bin/env bash
# hawser duplicate against catching up through the stream, on two nodes: how long a
# subscriber takes to get a table of N rows each way, and whether it ends equal to the
# master.

set -euo pipefail

usage() {
    cat <<'EOF'
Usage: duplicate.sh [OPTIONS]

Two nodes on loopback, ds1 master of table t and ds2 its subscriber. ds2's receiver is
stopped, ds1 commits N rows (1,000 per statement), then three ways of giving ds2 the
rows are timed, each until ds2's copy of t equals ds1's (CRC of the rows in key order):

  catch-up         ds2's receiver started again; ds1's stream sends the backlog
                   (the receiver compiles it into net rows); timed until ds2 counts
                   N rows, polled every 50 ms
  duplicate-same   `hawser duplicate` of ds2 once it holds every row (nothing written)
  duplicate-empty  `hawser duplicate` of a third node, ds3, stopped before the load
                   (every row written)
                   both timed until the command returns (rows and marks in place,
                   receiver started)

After the duplicates, one more commit on ds1 must reach both subscribers (the streams
resumed).

Options:
  --rows N         rows in t (default 200000)
  --hawser BIN     the hawser binary (default: target/release/hawser of this checkout,
                   built if missing; else hawser on PATH)
  --json           one JSON object instead of text
  --keep           keep the nodes' data directories
  -h, --help       show this help

Progress goes to stderr; results to stdout. Exits 1 if a subscriber's table differs
from ds1's at the end. Every node started is stopped on every exit path.
EOF
}

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
rows=200000
hawser=""
json=0
keep=0

die() { echo "duplicate.sh: $*" >&2; exit 2; }
need_value() { [[ $# -ge 2 ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
    --rows) need_value "$@"; rows="$2"; shift 2 ;;
    --hawser) need_value "$@"; hawser="$2"; shift 2 ;;
    --json) json=1; shift ;;
    --keep) keep=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
    esac
done
[[ $rows =~ ^[0-9]+$ && $rows -gt 0 ]] || die "--rows must be a positive whole number"

work="$(mktemp -d "${TMPDIR:-/tmp}/hawser-duplicate.XXXXXX")"
# shellcheck source=chaos/nodes.sh
source "$here/nodes.sh"
find_hawser
nodes ds1 ds2 ds3
receiver() { "$hawser" receiver --host "${grpc[ds1]}" --scheme r --subscriber "$1" --state "$2" >/dev/null; }
now() { date +%s.%N; }
since() { python3 -c "print(round($(now) - $1, 2))"; }
checksum() { sql "$1" --format json -e "select * from t order by k" 2>/dev/null | cksum | cut -d' ' -f1; }
# Waits (up to 300 s) until $1's t equals ds1's; prints whether it does.
equal_to_ds1() {
    local want deadline
    want="$(checksum ds1)"
    deadline=$(($(date +%s) + 300))
    while [[ "$(checksum "$1")" != "$want" ]]; do
        [[ $(date +%s) -ge $deadline ]] && { echo false; return; }
        sleep 0.05
    done
    echo true
}

echo "starting ds1, ds2, ds3 ($hawser)" >&2
start ds1
"$hawser" init --host "${grpc[ds1]}" >/dev/null
start ds2 --join "${grpc[ds1]}"
start ds3 --join "${grpc[ds1]}"
for n in ds1 ds2 ds3; do
    for _ in $(seq 100); do
        sql "$n" -e "create table t (k int primary key, v int, s varchar(60))" >/dev/null 2>&1 && break
        sleep 0.2
    done
done
sql ds1 -e "CREATE REPLICATION r ELEMENT e TABLE t MASTER ds1 SUBSCRIBER ds2, ds3" >/dev/null
receiver ds2 stop
receiver ds3 stop

python3 - "$rows" >"$work/load.sql" <<'PY'
import sys
n = int(sys.argv[1])
for b in range(0, n, 1000):
    print("insert into t values " + ", ".join(
        f"({k}, {k}, 'row {k} with some text to copy')" for k in range(b, min(n, b + 1000))) + ";")
PY
echo "loading $rows rows on ds1" >&2
sql ds1 -f "$work/load.sql" >/dev/null

echo "catch-up: starting ds2's receiver" >&2
t0=$(now)
receiver ds2 start
# Timed on the row count (a cheap poll); the rows are compared after.
for _ in $(seq 6000); do
    [[ "$(sql ds2 --format json -e "select count(*) from t" 2>/dev/null)" == *"[[$rows]]"* ]] && break
    sleep 0.05
done
catchup_s=$(since "$t0")
catchup_equal=$(equal_to_ds1 ds2)

run_duplicate() {
    local n=$1
    receiver "$n" stop
    "$hawser" duplicate --host "${grpc[$n]}" --format json >"$work/$n.dup" 2>"$work/$n.dup.err" ||
        die "duplicate of $n failed: $(cat "$work/$n.dup.err")"
}
echo "duplicate-same: ds2" >&2
t0=$(now)
run_duplicate ds2
same_s=$(since "$t0")
same_equal=$(equal_to_ds1 ds2)
echo "duplicate-empty: ds3" >&2
t0=$(now)
run_duplicate ds3
empty_s=$(since "$t0")
empty_equal=$(equal_to_ds1 ds3)
written() { tail -1 "$work/$1.dup" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["rows_written"], d["rows_unchanged"])'; }
read -r same_written same_unchanged <<<"$(written ds2)"
read -r empty_written empty_unchanged <<<"$(written ds3)"

sql ds1 -e "insert into t values (-1, 0, 'after the duplicates')" >/dev/null
after2=$(equal_to_ds1 ds2)
after3=$(equal_to_ds1 ds3)

if [[ $json == 1 ]]; then
    printf '{"rows":%s,"catch_up":{"s":%s,"equal":%s},' "$rows" "$catchup_s" "$catchup_equal"
    printf '"duplicate_same":{"s":%s,"equal":%s,"written":%s,"unchanged":%s},' \
        "$same_s" "$same_equal" "$same_written" "$same_unchanged"
    printf '"duplicate_empty":{"s":%s,"equal":%s,"written":%s,"unchanged":%s},' \
        "$empty_s" "$empty_equal" "$empty_written" "$empty_unchanged"
    printf '"streaming_after":%s}\n' "$([[ $after2 == true && $after3 == true ]] && echo true || echo false)"
else
    echo "$rows rows"
    echo "  catch-up through the stream:    ${catchup_s} s, equal $catchup_equal"
    echo "  duplicate, subscriber has them: ${same_s} s, equal $same_equal ($same_written written, $same_unchanged unchanged)"
    echo "  duplicate, subscriber empty:    ${empty_s} s, equal $empty_equal ($empty_written written, $empty_unchanged unchanged)"
    echo "  streaming after: ds2 $after2, ds3 $after3"
fi
[[ $catchup_equal == true && $same_equal == true && $empty_equal == true && $after2 == true && $after3 == true ]] || exit 1
