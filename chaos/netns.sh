#!/usr/bin/env bash
# Randomized chaos rounds against three hawser nodes, each in its own network namespace:
# faults the in-process drills cannot make (SIGKILL, SIGSTOP, real network cuts, one-way
# cuts, several at once), each checked by `hawser drill observe`'s history checker.

set -euo pipefail

usage() {
    cat <<'EOF'
Usage: netns.sh [OPTIONS]        (as root: it creates network namespaces)

Three nodes ds1, ds2, ds3, each in its own network namespace joined to a bridge by a
veth pair (10.231.X.11-13; the bridge, where the checker runs, is .1). Scheme r: ds1
masters hawser_drill, ds2 subscribes RETURN TWOSAFE, ds3 asynchronously. Then --rounds
rounds; each picks a fault at random, runs `hawser drill observe` (a verifying load, the
wait for recovery, the checks of every acknowledgement against what survived) and
strikes during its load:

  kill-master           SIGKILL the element's master; start it again after --down
  pause-master          SIGSTOP the master; SIGCONT after --down
  kill-leader           SIGKILL the Raft leader; start it again after --down
  partition-master      cut the master from both other nodes, both ways (clients, on
                        the bridge, still reach it)
  partition-leader      the same for the Raft leader
  partition-subscriber  the same for a subscriber chosen at random
  master-deaf           one-way: nothing the other nodes send reaches the master
  master-mute           one-way: nothing the master sends reaches the other nodes
  kill-master+pause-sub SIGKILL the master and SIGSTOP a subscriber at once

Cuts are blackhole routes inside the namespaces (`ip route`); nftables and `tc netem`
are not on these machines, so delay, loss and reordering are out of reach.

Options:
  --rounds N       rounds (default 100)
  --down D         how long each fault lasts (default 2s)
  --writers N      writers of each round's load (default 4)
  --seed S         seed of the fault choice (default: random; printed)
  --hawser BIN     the hawser binary (default: target/release/hawser of this checkout,
                   built if missing; else hawser on PATH)
  --json           one JSON object instead of text
  --keep           keep the nodes' data, logs and each round's report

Needs root, ip and jq. Progress goes to stderr; results to stdout. Exits 1 if any round
broke a promise. Every process, namespace and link it made is removed on every exit
path.
EOF
}

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
rounds=100
down=2s
writers=4
seed=""
hawser=""
json=0
keep=0

die() { echo "netns.sh: $*" >&2; exit 2; }
need_value() { [[ $# -ge 2 ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
    --rounds) need_value "$@"; rounds="$2"; shift 2 ;;
    --down) need_value "$@"; down="$2"; shift 2 ;;
    --writers) need_value "$@"; writers="$2"; shift 2 ;;
    --seed) need_value "$@"; seed="$2"; shift 2 ;;
    --hawser) need_value "$@"; hawser="$2"; shift 2 ;;
    --json) json=1; shift ;;
    --keep) keep=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
    esac
done
[[ $rounds =~ ^[0-9]+$ && $rounds -gt 0 ]] || die "--rounds must be a positive whole number"
[[ $(id -u) == 0 ]] || die "network namespaces need root"
command -v ip >/dev/null || die "ip (iproute2) is needed"
command -v jq >/dev/null || die "jq is needed"
[[ -n $seed ]] || seed=$RANDOM
RANDOM=$seed
down_s=$(python3 -c "import sys; s=sys.argv[1]; print(float(s[:-2])/1000 if s.endswith('ms') else float(s.rstrip('s')))" "$down")

work="$(mktemp -d -t hawser-netns-XXXXXX)"
# find_hawser only: this script starts its nodes in namespaces with its own start().
# shellcheck source=chaos/nodes.sh
source "$here/nodes.sh"
find_hawser
tag=$(printf '%04x' $(( $$ % 65536 )))
net=$(( $$ % 200 + 20 ))
bridge="hwb$tag"
nodes=(ds1 ds2 ds3)
declare -A ns addr pid idx
made_bridge=0

cleanup() {
    local n
    for n in "${nodes[@]}"; do
        if [[ -n ${pid[$n]:-} ]]; then
            kill -CONT "${pid[$n]}" 2>/dev/null || true
            kill -9 "${pid[$n]}" 2>/dev/null || true
        fi
    done
    wait 2>/dev/null || true
    for n in "${nodes[@]}"; do
        [[ -n ${ns[$n]:-} ]] && ip netns del "${ns[$n]}" 2>/dev/null || true
    done
    [[ $made_bridge == 1 ]] && ip link del "$bridge" 2>/dev/null || true
    if [[ $keep == 1 ]]; then echo "data, logs and reports kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The bridge on this side, and one namespace per node on a veth pair.
ip link add "$bridge" type bridge
made_bridge=1
ip addr add "10.231.$net.1/24" dev "$bridge"
ip link set "$bridge" up
i=0
for n in "${nodes[@]}"; do
    i=$((i + 1))
    idx[$n]=$i
    ns[$n]="hwc$tag-$n"
    addr[$n]="10.231.$net.1$i"
    ip netns add "${ns[$n]}"
    ip link add "hwv$tag$i" type veth peer name "hwp$tag$i"
    ip link set "hwp$tag$i" netns "${ns[$n]}"
    ip link set "hwv$tag$i" master "$bridge" up
    ip netns exec "${ns[$n]}" ip link set lo up
    ip netns exec "${ns[$n]}" ip link set "hwp$tag$i" name eth0
    ip netns exec "${ns[$n]}" ip addr add "${addr[$n]}/24" dev eth0
    ip netns exec "${ns[$n]}" ip link set eth0 up
done

grpc() { echo "${addr[$1]}:7420"; }

# Starts node $1 in its namespace (more arguments go to `hawser start`) and waits until
# it is ready. `ip netns exec` execs hawser, so the pid is the node's.
start() {
    local n=$1
    shift
    : >"$work/$n.out"
    ip netns exec "${ns[$n]}" "$hawser" start --insecure --name "$n" --listen "$(grpc "$n")" \
        --http "${addr[$n]}:7421" --data "$work/$n" --log warn "$@" \
        >>"$work/$n.out" 2>>"$work/$n.log" &
    pid[$n]=$!
    for _ in $(seq 300); do
        grep -q '^ready ' "$work/$n.out" && return 0
        kill -0 "${pid[$n]}" 2>/dev/null || die "$n exited; see its log: $(tail -3 "$work/$n.log")"
        sleep 0.1
    done
    die "$n not ready within 30 s"
}
declare -A args
args[ds1]=""
args[ds2]="--join $(grpc ds1)"
args[ds3]="--join $(grpc ds1)"
restart() {
    local n=$1
    # shellcheck disable=SC2086
    start "$n" ${args[$n]}
}

sql() { local n=$1; shift; "$hawser" sql --host "$(grpc "$n")" "$@"; }

start ds1
"$hawser" init --host "$(grpc ds1)" >/dev/null
restart ds2
restart ds3
for n in "${nodes[@]}"; do
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

# The store that masters the drill's element and the Raft leader's store, as the node
# with the newest view says (highest element epoch; highest term for the leader).
roles() {
    local n views=""
    for n in "${nodes[@]}"; do
        views+="$("$hawser" status --host "$(grpc "$n")" --format json 2>/dev/null || true)"$'\n'
    done
    jq -rs '
      map(select(.cluster != null)) as $v
      | ($v | map(.cluster.schemes[]?.elements[]? | select(.name == "drill")) | max_by(.epoch) | .master_store) as $m
      | ($v | max_by(.cluster.term) | .cluster) as $c
      | ($c.nodes[] | select(.id == $c.leader_id) | .store) as $l
      | "\($m) \($l)"' <<<"$views" 2>/dev/null || true
}

others() { local n; for n in "${nodes[@]}"; do [[ $n != "$1" ]] && echo "$n"; done; }

# Blackhole routes: $1 can no longer send to $2 (a one-way cut).
cut_to() { ip netns exec "${ns[$1]}" ip route add blackhole "${addr[$2]}/32" 2>/dev/null || true; }
heal_all() {
    local a b
    for a in "${nodes[@]}"; do
        for b in "${nodes[@]}"; do
            ip netns exec "${ns[$a]}" ip route del blackhole "${addr[$b]}/32" 2>/dev/null || true
        done
    done
}
isolate() {
    local o
    for o in $(others "$1"); do cut_to "$1" "$o"; cut_to "$o" "$1"; done
}

faults=(kill-master pause-master kill-leader partition-master partition-leader
    partition-subscriber master-deaf master-mute kill-master+pause-sub)

# Strikes fault $1 given master $2 and leader $3; says what it did in `what`. Undone by
# heal.
declare -a killed=() paused=()
what=""
strike() {
    local f=$1 m=$2 l=$3 o subs
    read -r -a subs <<<"$(others "$m" | tr '\n' ' ')"
    local s=${subs[$((RANDOM % ${#subs[@]}))]}
    killed=()
    paused=()
    case "$f" in
    kill-master) kill -9 "${pid[$m]}"; killed=("$m"); what="SIGKILL $m (master)" ;;
    pause-master) kill -STOP "${pid[$m]}"; paused=("$m"); what="SIGSTOP $m (master)" ;;
    kill-leader) kill -9 "${pid[$l]}"; killed=("$l"); what="SIGKILL $l (leader)" ;;
    partition-master) isolate "$m"; what="cut $m (master) from its peers" ;;
    partition-leader) isolate "$l"; what="cut $l (leader) from its peers" ;;
    partition-subscriber) isolate "$s"; what="cut $s (subscriber) from its peers" ;;
    master-deaf)
        for o in $(others "$m"); do cut_to "$o" "$m"; done
        what="nothing reaches $m (master)"
        ;;
    master-mute)
        for o in $(others "$m"); do cut_to "$m" "$o"; done
        what="nothing leaves $m (master)"
        ;;
    kill-master+pause-sub)
        kill -9 "${pid[$m]}"
        kill -STOP "${pid[$s]}"
        killed=("$m")
        paused=("$s")
        what="SIGKILL $m (master) and SIGSTOP $s (subscriber)"
        ;;
    esac
}
heal() {
    local n
    heal_all
    for n in "${paused[@]}"; do kill -CONT "${pid[$n]}" 2>/dev/null || true; done
    for n in "${killed[@]}"; do wait "${pid[$n]}" 2>/dev/null || true; restart "$n"; done
}

echo "netns.sh: seed $seed, $rounds rounds, down $down, work $work" >&2
broke=0
for round in $(seq "$rounds"); do
    f=${faults[$((RANDOM % ${#faults[@]}))]}
    out="$work/round-$round.json"
    # A round starts from a healthy cluster: the drill refuses to start otherwise.
    read -r m l <<<"$(roles)"
    started=0
    for _ in $(seq 150); do
        "$hawser" drill observe --host "$(grpc ds1)" --scheme r --down "$down" \
            --writers "$writers" --format json >"$out" 2>"$work/round-$round.err" &
        drill=$!
        # The drill plans first (and refuses an unhealthy cluster at once).
        sleep 0.5
        if kill -0 "$drill" 2>/dev/null; then started=1; break; fi
        wait "$drill" || true
        grep -q "healthy cluster" "$work/round-$round.err" || break
        sleep 0.5
        read -r m l <<<"$(roles)"
    done
    if [[ $started == 0 ]]; then
        broke=1
        echo "round $round $f: the drill did not start: $(head -c 400 "$work/round-$round.err")" >&2
        continue
    fi
    # Its warm-up is 1 s from the start; strike a little after.
    sleep 0.7
    strike "$f" "$m" "$l"
    sleep "$down_s"
    heal
    wait "$drill" || true
    if jq -e --arg f "$f" --arg w "$what" '. + {chaos_fault: $f, chaos_did: $w}' "$out" >"$out.tmp" 2>/dev/null; then
        mv "$out.tmp" "$out"
    fi
    if ! jq -e '.held' "$out" >/dev/null 2>&1; then
        broke=1
        echo "round $round $f ($what): PROMISE BROKEN or no report: $(cat "$out" "$work/round-$round.err" | head -c 700)" >&2
    else
        echo "round $round/$rounds $f ($what): new master $(jq -r '.new_master.store // "-"' "$out") after $(jq -r '.time_to_new_master_ms // "-"' "$out") ms, window $(jq -r '.write_window_ms' "$out") ms" >&2
    fi
done

summary="$(cat "$work"/round-*.json 2>/dev/null | jq -s '{
    rounds: length,
    faults: (group_by(.chaos_fault) | map({key: .[0].chaos_fault, value: length}) | from_entries),
    held: (map(select(.held)) | length),
    acknowledged: (map(.acknowledged) | add),
    acknowledged_promised: (map(.acknowledged_promised) | add),
    lost_promised: (map(.lost_promised) | add),
    lost_async: (map(.lost_async) | add),
    lost_async_set_aside: (map(.lost_async_set_aside) | add),
    refused_but_committed: (map(.refused_but_committed) | add),
    two_masters: (map(.two_masters) | add),
    unequal_copies: (map(select(.copies_equal | not)) | length),
    failovers: (map(select(.new_master != null)) | length),
    write_window_ms_p50: (map(.write_window_ms) | sort | .[((length - 1) * 0.5 | floor)]),
    write_window_ms_p99: (map(.write_window_ms) | sort | .[((length - 1) * 0.99 | floor)])
  }')"
if [[ $json == 1 ]]; then
    jq -c --argjson seed "$seed" --arg down "$down" '. + {seed: $seed, down: $down}' <<<"$summary"
else
    jq -r --argjson seed "$seed" '"chaos: \(.rounds) rounds (seed \($seed)), \(.held) held; faults \(.faults | to_entries | map("\(.key) \(.value)") | join(", "))
  acknowledged \(.acknowledged) (\(.acknowledged_promised) promised); lost promised \(.lost_promised); lost async \(.lost_async) (set aside \(.lost_async_set_aside)); refused but committed \(.refused_but_committed)
  two masters \(.two_masters); unequal copies \(.unequal_copies); failovers \(.failovers); write window p50/p99 \(.write_window_ms_p50)/\(.write_window_ms_p99) ms"' <<<"$summary"
fi
exit "$broke"
