#!/usr/bin/env bash
# `hawser drill` rounds on a local three-node cluster: the figures of each drill kind
# over many runs, and whether any run broke a promise.

set -euo pipefail

usage() {
    cat <<'EOF'
Usage: drills.sh [OPTIONS]

Three nodes on loopback (ds1, ds2, ds3, every one with --allow-faults), the drill's
table on each and scheme r: ds1 masters hawser_drill, ds2 subscribes RETURN TWOSAFE,
ds3 asynchronously. Then --runs rounds; each round runs, one after another,
`hawser drill` kill-master, pause-master, isolate-master, switchover and kill-leader (JSON reports
kept in the work directory). The roles move with every failover, so each drill strikes
whoever holds the role then.

Prints, per kind, p50 / p99 / max of the time to a new master (or leader), of the write
window clients saw and of the switchover pause, and the sums of acknowledged writes,
promised writes lost, asynchronous writes lost (and set aside), two-master writes and
unequal copies.

Options:
  --runs N         rounds (default 20)
  --down D         down / pause time of each fault (default 2s)
  --writers N      writers of each drill's load (default 4)
  --hawser BIN     the hawser binary (default: target/release/hawser of this checkout,
                   built if missing; else hawser on PATH)
  --json           one JSON object instead of text
  --keep           keep the nodes' data directories and the reports
  --log LEVEL      the nodes' log level (default warn; info shows each stream's sessions)
  -h, --help       show this help

Needs jq. Progress goes to stderr; results to stdout. Exits 1 if any drill broke a
promise. Every node started is stopped on every exit path.
EOF
}

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
runs=20
down=2s
writers=4
hawser=""
json=0
keep=0

die() { echo "drills.sh: $*" >&2; exit 2; }
need_value() { [[ $# -ge 2 ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
    --runs) need_value "$@"; runs="$2"; shift 2 ;;
    --down) need_value "$@"; down="$2"; shift 2 ;;
    --writers) need_value "$@"; writers="$2"; shift 2 ;;
    --hawser) need_value "$@"; hawser="$2"; shift 2 ;;
    --json) json=1; shift ;;
    --keep) keep=1; shift ;;
    --log) need_value "$@"; node_log="$2"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
    esac
done
[[ $runs =~ ^[0-9]+$ && $runs -gt 0 ]] || die "--runs must be a positive whole number"
command -v jq >/dev/null || die "jq is needed"

work="$(mktemp -d -t hawser-drills-XXXXXX)"
# shellcheck source=chaos/nodes.sh
source "$here/nodes.sh"
find_hawser

nodes ds1 ds2 ds3
start ds1 --allow-faults
"$hawser" init --host "${grpc[ds1]}" >/dev/null
start ds2 --allow-faults --join "${grpc[ds1]}"
start ds3 --allow-faults --join "${grpc[ds1]}"
for n in ds1 ds2 ds3; do
    for _ in $(seq 100); do
        sql "$n" -e "CREATE TABLE hawser_drill (k BIGINT PRIMARY KEY, v VARCHAR(64))" >/dev/null 2>&1 && break
        sleep 0.1
    done
done
for _ in $(seq 100); do
    sql ds1 -e "CREATE REPLICATION r ELEMENT drill TABLE hawser_drill
        MASTER ds1 SUBSCRIBER ds2 RETURN TWOSAFE SUBSCRIBER ds3
        STORE ds1 RETURN WAIT TIME 10" >/dev/null 2>&1 && break
    sleep 0.1
done

broke=0
kinds=(kill-master pause-master isolate-master switchover kill-leader)
for round in $(seq "$runs"); do
    for kind in "${kinds[@]}"; do
        out="$work/$kind-$round.json"
        # A drill starts from a healthy cluster: wait for the last one's node to report.
        for _ in $(seq 100); do
            if "$hawser" drill "$kind" --host "${grpc[ds1]}" --scheme r --down "$down" \
                --writers "$writers" --format json >"$out" 2>"$work/$kind-$round.err"; then
                break
            fi
            grep -q "healthy cluster" "$work/$kind-$round.err" || break
            sleep 0.2
        done
        # jq finds nothing false in an empty file: a drill that printed no report broke.
        if ! [[ -s "$out" ]] || ! jq -e '.held' "$out" >/dev/null 2>&1; then
            broke=1
            echo "round $round $kind: PROMISE BROKEN or no report: $(cat "$out" "$work/$kind-$round.err" | head -c 600)" >&2
        else
            echo "round $round/$runs $kind: new master $(jq -r '.time_to_new_master_ms // "-"' "$out") ms, window $(jq -r '.write_window_ms' "$out") ms" >&2
        fi
    done
done

summary="$(for kind in "${kinds[@]}"; do cat "$work/$kind"-*.json 2>/dev/null; done | jq -s '
  def pct(p): if length == 0 then null else sort | .[((length - 1) * p | floor)] end;
  def stats: {p50: pct(0.5), p99: pct(0.99), max: (if length == 0 then null else max end), runs: length};
  group_by(.drill) | map({
    key: .[0].drill,
    value: {
      runs: length,
      time_to_new_master_ms: (map(.time_to_new_master_ms | select(. != null)) | stats),
      time_to_new_leader_ms: (map(.time_to_new_leader_ms | select(. != null)) | stats),
      write_window_ms: (map(.write_window_ms) | stats),
      switchover_ms: (map(.switchover_ms[]) | stats),
      acknowledged: (map(.acknowledged) | add),
      acknowledged_promised: (map(.acknowledged_promised) | add),
      lost_promised: (map(.lost_promised) | add),
      lost_async: (map(.lost_async) | add),
      lost_async_set_aside: (map(.lost_async_set_aside) | add),
      two_masters: (map(.two_masters) | add),
      unequal_copies: (map(select(.copies_equal | not)) | length),
      broken: (map(select(.held | not)) | length)
    }
  }) | from_entries')"

if [[ $json == 1 ]]; then
    jq -c --argjson runs "$runs" --arg down "$down" '{runs: $runs, down: $down, kinds: .}' <<<"$summary"
else
    echo "drills: $runs rounds, down $down, $writers writers"
    jq -r 'to_entries[] | .key as $k | .value |
      "  \($k): \(.runs) runs; new master p50/p99/max \(.time_to_new_master_ms.p50)/\(.time_to_new_master_ms.p99)/\(.time_to_new_master_ms.max) ms (\(.time_to_new_master_ms.runs) runs with one); new leader p50/p99 \(.time_to_new_leader_ms.p50)/\(.time_to_new_leader_ms.p99) ms; write window p50/p99/max \(.write_window_ms.p50)/\(.write_window_ms.p99)/\(.write_window_ms.max) ms; switchover p50/p99 \(.switchover_ms.p50)/\(.switchover_ms.p99) ms; acknowledged \(.acknowledged) (\(.acknowledged_promised) promised); lost promised \(.lost_promised), lost async \(.lost_async) (set aside \(.lost_async_set_aside)); two masters \(.two_masters); unequal copies \(.unequal_copies); broken \(.broken)"' <<<"$summary"
fi
exit "$broke"
