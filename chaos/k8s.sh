#!/usr/bin/env bash
# The Kubernetes manifest's own container command, environment and probes, read from
# deploy/k8s/hawser.yaml (and the image's ENV from deploy/Dockerfile) so that they cannot
# drift, run for three pods, each in its own network namespace with its own hosts file,
# through what Kubernetes does to pods.

set -euo pipefail

usage() {
    cat <<'EOF'
Usage: k8s.sh [OPTIONS]          (as root: it creates network namespaces)

Emulates the StatefulSet of deploy/k8s/hawser.yaml: pods hawser-0..2, each in a network
namespace joined to a bridge (10.233.0.11-13), with /etc/hosts naming every pod as its
headless Service does (`ip netns exec` binds /etc/netns/NS/hosts); the pod's command and
env from the manifest (fieldRef metadata.name, resourceFieldRef limits.cpu and $(VAR)
references resolved as the kubelet does), the image's ENV from the Dockerfile, the data
volume and the certificates Secret as directories (certificates made with the recipe the
manifest documents). Probes are HTTPS GETs of the manifest's paths from the bridge. The
init Job's command runs in a fourth namespace, as do the client commands.

Steps, each ending with three ready voters, every acknowledged row on every copy and
the copies equal:
  start      all pods at once, then the init Job (run twice: a re-run is harmless)
  restart    kill -9 of each pod in turn, started again on its volume
  wipe-sub   a subscriber pod's volume wiped: it rejoins by itself (--replace)
  wipe-master  the pod holding the master role killed and wiped: failover moves the
             role, the pod rejoins as a subscriber
  scale-down `hawser node remove --force` of hawser-2, then the pod stops: two voters

Options:
  --hawser BIN   the hawser binary (default: target/debug/hawser, else target/release)
  --rows N       rows written per step (default 200, in transactions of 20)
  --steps LIST   the steps after start, comma-separated (default
                 restart,wipe-sub,wipe-master,scale-down)
  --keep         keep the pods' data and logs
  --json         print the figures as one JSON object

Needs root, ip, curl, jq and python3 (PyYAML, installed into a venv if missing).
Every process, namespace and link it made is removed on every exit path.
EOF
}

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
hawser=""
rows=200
keep=0
json=0
steps="restart,wipe-sub,wipe-master,scale-down"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --hawser) hawser="$2"; shift 2 ;;
        --rows) rows="$2"; shift 2 ;;
        --steps) steps="$2"; shift 2 ;;
        --keep) keep=1; shift ;;
        --json) json=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "k8s.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
done
[[ $(id -u) == 0 ]] || { echo "k8s.sh: needs root (network namespaces)" >&2; exit 2; }
if [[ -z $hawser ]]; then
    for b in "$repo/target/debug/hawser" "$repo/target/release/hawser"; do
        [[ -x $b ]] && { hawser="$b"; break; }
    done
fi
[[ -x $hawser ]] || { echo "k8s.sh: no hawser binary (cargo build, or --hawser)" >&2; exit 2; }
hawser="$(cd "$(dirname "$hawser")" && pwd)/$(basename "$hawser")"

log() { echo "k8s.sh: $*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

work="$(mktemp -d /tmp/hawser-k8s.XXXXXX)"
# Four digits however short the pid: every name below is this plus a one-letter role, and
# interface names must stay under 16 characters.
tag="$(printf '%04d' $(( $$ % 10000 )))"
bridge="hwkb$tag"
ns_client="hwkc$tag"
declare -a ns pid
ip_of() { echo "10.233.0.$((11 + $1))"; }
client_ip="10.233.0.20"

cleanup() {
    set +e
    for i in 0 1 2; do
        [[ -n ${pid[$i]:-} ]] && kill -9 "${pid[$i]}" 2>/dev/null
    done
    for i in 0 1 2; do
        [[ -n ${ns[$i]:-} ]] && ip netns del "${ns[$i]}" 2>/dev/null
        [[ -n ${ns[$i]:-} ]] && rm -rf "/etc/netns/${ns[$i]}"
    done
    ip netns del "$ns_client" 2>/dev/null
    rm -rf "/etc/netns/$ns_client"
    ip link del "$bridge" 2>/dev/null
    if [[ $keep == 1 ]]; then log "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# --- the manifest, read -----------------------------------------------------------------
python=python3
if ! python3 -c 'import yaml' 2>/dev/null; then
    python3 -m venv "$work/venv"
    "$work/venv/bin/pip" install --quiet 'PyYAML==6.0.3'
    python="$work/venv/bin/python"
fi
"$python" - "$repo/deploy/k8s" "$repo/deploy/Dockerfile" > "$work/manifest.json" <<'PY'
import json, math, os, re, sys, yaml
k8s_dir, dockerfile = sys.argv[1], sys.argv[2]
docs = []
for root, _, files in os.walk(k8s_dir):
    for f in sorted(files):
        if f.endswith((".yaml", ".yml")):
            with open(os.path.join(root, f)) as fh:
                docs += [d for d in yaml.safe_load_all(fh) if d]
sts = next(d for d in docs if d["kind"] == "StatefulSet")
job = next(d for d in docs if d["kind"] == "Job")
pod = sts["spec"]["template"]["spec"]
c = next(c for c in pod["containers"] if c["name"] == "hawser")
def cpu(v):
    v = str(v)
    return math.ceil(int(v[:-1]) / 1000) if v.endswith("m") else math.ceil(float(v))
def env_of(container):
    out = []
    for e in container.get("env", []):
        if "value" in e:
            out.append([e["name"], "value", e["value"]])
        elif "fieldRef" in e.get("valueFrom", {}):
            out.append([e["name"], "field", e["valueFrom"]["fieldRef"]["fieldPath"]])
        elif "resourceFieldRef" in e.get("valueFrom", {}):
            r = e["valueFrom"]["resourceFieldRef"]
            kind, what = r["resource"].split(".")
            out.append([e["name"], "value", str(cpu(container["resources"][kind][what]))])
        else:
            raise SystemExit(f"env {e['name']}: a source this script does not emulate")
    return out
def mounts(container, pod_spec):
    vols = {v["name"]: v for v in pod_spec.get("volumes", [])}
    out = {}
    for m in container.get("volumeMounts", []):
        v = vols.get(m["name"], {})
        kind = "secret" if "secret" in v else ("emptyDir" if "emptyDir" in v else "pvc")
        out[m["mountPath"]] = kind
    return out
def probe(p):
    g = p["httpGet"]
    port = g["port"]
    if isinstance(port, str):
        port = next(x["containerPort"] for x in c["ports"] if x["name"] == port)
    return {"path": g["path"], "port": port, "scheme": g.get("scheme", "HTTP")}
image_env = {}
for line in open(dockerfile).read().replace("\\\n", " ").splitlines():
    if line.startswith("FROM "):
        image_env = {}
    if line.startswith("ENV "):
        for k, v in re.findall(r'(\w+)=("[^"]*"|\S+)', line[4:]):
            image_env[k] = v.strip('"')
jc = next(iter(job["spec"]["template"]["spec"]["containers"]))
print(json.dumps({
    "replicas": sts["spec"]["replicas"],
    "service": sts["spec"]["serviceName"],
    "command": c.get("command", []) + c.get("args", []),
    "env": env_of(c),
    "mounts": mounts(c, pod),
    "ports": {p["name"]: p["containerPort"] for p in c["ports"]},
    "startup": probe(c["startupProbe"]),
    "liveness": probe(c["livenessProbe"]),
    "readiness": probe(c["readinessProbe"]),
    "image_env": image_env,
    "job_command": jc.get("command", []) + jc.get("args", []),
    "job_env": env_of(jc),
}))
PY
m() { jq -r "$1" "$work/manifest.json"; }
[[ $(m .replicas) == 3 ]] || fail "the manifest runs $(m .replicas) replicas; this test knows three"
svc="$(m .service)"
grpc_port="$(m .ports.grpc)"
http_port="$(m .ports.http)"
data_mount="$(m '.mounts | to_entries[] | select(.value == "pvc") | .key')"
certs_mount="$(m '.mounts | to_entries[] | select(.value == "secret") | .key')"
log "manifest: $(m '.command | join(" ")'); data at $data_mount, certificates at $certs_mount"

# --- certificates: the recipe the manifest's comments give ------------------------------
certs="$work/certs"
"$hawser" cert create-ca --certs-dir "$certs" --ca-key "$work/ca.key" >/dev/null
"$hawser" cert create-node hawser "hawser-0.$svc" "hawser-1.$svc" "hawser-2.$svc" "*.$svc" \
    localhost 127.0.0.1 --certs-dir "$certs" --ca-key "$work/ca.key" >/dev/null
"$hawser" cert create-client root --role admin --certs-dir "$certs" --ca-key "$work/ca.key" >/dev/null

# --- the network: a bridge, a namespace per pod and one for the Job and clients -----------
ip link add "$bridge" type bridge
ip addr add 10.233.0.1/24 dev "$bridge"
ip link set "$bridge" up
hosts="127.0.0.1 localhost"
for i in 0 1 2; do hosts+=$'\n'"$(ip_of $i) hawser-$i.$svc"; done
plumb() { # NS IP
    local n="$1" a="$2" v="hwv${1:3}"     # hwk<role><tag> -> hwv<role><tag>
    ip netns add "$n"
    ip link add "$v" type veth peer name "${v}p"
    ip link set "$v" master "$bridge" up
    ip link set "${v}p" netns "$n"
    ip netns exec "$n" ip link set lo up
    ip netns exec "$n" ip link set "${v}p" name eth0
    ip netns exec "$n" ip addr add "$a/24" dev eth0
    ip netns exec "$n" ip link set eth0 up
    mkdir -p "/etc/netns/$n"
    printf '%s\n' "$hosts" > "/etc/netns/$n/hosts"
}
for i in 0 1 2; do ns[$i]="hwk$i$tag"; plumb "${ns[$i]}" "$(ip_of $i)"; done
plumb "$ns_client" "$client_ip"

# The pod's environment as the kubelet makes it: image ENV, then the manifest's env in
# order with $(VAR) references to earlier ones resolved; mount paths are directories here.
pod_env() { # ORDINAL -> NAME=VALUE lines
    local i="$1" name="hawser-$1"
    "$python" - "$work/manifest.json" "$name" "$data_mount" "$work/pod-$i" \
        "$certs_mount" "$certs" "${2:-env}" <<'PY'
import json, re, sys
man, pod, data_mount, data_dir, certs_mount, certs_dir, which = sys.argv[1:]
m = json.load(open(man))
env = dict(m["image_env"]) if which == "env" else {}
for name, kind, v in m["env" if which == "env" else "job_env"]:
    if kind == "field":
        assert v == "metadata.name", v
        v = pod
    v = re.sub(r"\$\((\w+)\)", lambda x: env.get(x.group(1), x.group(0)), v)
    env[name] = v
for k, v in env.items():
    v = v.replace(data_mount, data_dir).replace(certs_mount, certs_dir)
    print(f"{k}={v}")
PY
}

start_pod() { # ORDINAL
    local i="$1"
    mkdir -p "$work/pod-$i"
    mapfile -t envs < <(pod_env "$i")
    mapfile -t cmd < <(m '.command[]')
    # `exec hawser start ...` finds the binary on PATH, as in the image.
    ip netns exec "${ns[$i]}" env -i PATH="$(dirname "$hawser"):/usr/bin:/bin" HOME=/tmp \
        "${envs[@]}" "${cmd[@]}" >>"$work/pod-$i.log" 2>&1 &
    pid[$i]=$!
}

probe() { # ORDINAL WHICH -> HTTP code
    local i="$1" p scheme path port
    scheme="$(m ".$2.scheme" | tr 'A-Z' 'a-z')"; path="$(m ".$2.path")"; port="$(m ".$2.port")"
    curl -s -o /dev/null -w '%{http_code}' --max-time 2 --cacert "$certs/ca.crt" \
        --resolve "hawser-$i.$svc:$port:$(ip_of "$i")" "$scheme://hawser-$i.$svc:$port$path" || true
}

client() { # ORDINAL ARGS... : a client command in the Job's namespace, against pod ORDINAL
    local i="$1"; shift
    ip netns exec "$ns_client" env -i PATH=/usr/bin:/bin HAWSER_CERTS_DIR="$certs" \
        HAWSER_HOST="hawser-$i.$svc:$grpc_port" "$hawser" "$@"
}

wait_until() { # WHAT SECONDS COMMAND...
    local what="$1" secs="$2"; shift 2
    local deadline=$((SECONDS + secs))
    until "$@"; do
        (( SECONDS < deadline )) || fail "timed out after ${secs}s waiting for $what (last seen: ${seen:-nothing})"
        sleep 0.2
    done
}

seen=""
voters_of() { client "$1" status --format json 2>>"$work/client.err" \
    | jq '[.cluster.nodes[]? | select(.membership == "voter")] | length' 2>/dev/null || echo 0; }
all_ready() { # N: pods 0..N-1 ready, each seeing N voters
    local n="$1" i code v
    seen=""
    for ((i = 0; i < n; i++)); do
        code="$(probe "$i" readiness)"; v="$(voters_of "$i")"
        seen+="hawser-$i readyz $code, $v voters; "
    done
    [[ $seen != *"readyz 200, $n voters"* ]] && return 1
    for ((i = 0; i < n; i++)); do
        [[ $seen == *"hawser-$i readyz 200, $n voters;"* ]] || return 1
    done
}

master_of() { # -> ordinal of the pod holding the master role
    local i
    for i in 0 1 2; do
        local addr
        addr="$(client "$i" status --format json 2>/dev/null \
            | jq -r '.cluster.schemes[]? | select(.name == "r") | .elements[0].master_addr' 2>/dev/null)" || continue
        [[ $addr =~ hawser-([0-9]) ]] && { echo "${BASH_REMATCH[1]}"; return 0; }
    done
    return 1
}

moved_off() { local now; now="$(master_of)" && [[ $now != "$1" ]]; }

acked=0
write_rows() { # N rows more, in transactions of 20, through the master; counts acknowledged
    local n="$1" done=0
    while (( done < n )); do
        local from=$((acked + 1)) sql="BEGIN;" k master
        for ((k = from; k < from + 20; k++)); do sql+=" INSERT INTO t VALUES ($k, 'row $k');"; done
        sql+=" COMMIT;"
        master="$(master_of)" || { sleep 0.2; continue; }
        if client "$master" sql -e "$sql" >/dev/null 2>&1; then
            acked=$((acked + 20)); done=$((done + 20))
        else
            # Not acknowledged: these keys may or may not exist; skip past them.
            acked=$((acked + 20)); unacked+=("$from")
            sleep 0.2
        fi
    done
}
unacked=()

copies_equal() { # N pods: every acknowledged row on every copy, the copies equal
    local n="$1" i first="" got equal=1
    seen=""
    for ((i = 0; i < n; i++)); do
        got="$(client "$i" sql --format json -e "SELECT count(*), sum(k) FROM t" 2>/dev/null \
            | jq -c '.rows[0]' 2>/dev/null)" || got=""
        seen+="hawser-$i (count, sum) ${got:-none}; "
        [[ -n $got && $got != null ]] || equal=0
        [[ -z $first ]] && first="$got"
        [[ $got == "$first" ]] || equal=0
    done
    [[ $equal == 1 ]] || return 1
    echo "$first" > "$work/last-check"
}

acknowledged_present() { # pod: every acknowledged key present
    local i="$1"
    local missing
    missing="$(client "$i" sql --format json -e "SELECT k FROM t" 2>/dev/null | jq -r '.rows[][0]' \
        | sort -n | comm -13 - <(for ((k = 1; k <= acked; k++)); do
            local t=$(( (k - 1) / 20 * 20 + 1 ))
            [[ " ${unacked[*]} " == *" $t "* ]] || echo "$k"; done | sort -n) | wc -l)"
    [[ $missing == 0 ]]
}

check_step() { # STEP N
    local step="$1" n="${2:-3}" i
    wait_until "$step: $n ready voters" 120 all_ready "$n"
    wait_until "$step: equal copies" 60 copies_equal "$n"
    for ((i = 0; i < n; i++)); do
        acknowledged_present "$i" || fail "$step: an acknowledged row is missing on hawser-$i"
    done
    log "$step: $n ready voters, $(cat "$work/last-check") (count, sum) on every copy"
}

# --- start: every pod at once, then the init Job -----------------------------------------
t0=$SECONDS
for i in 0 1 2; do start_pod "$i"; done
all_started() { local i; for i in 0 1 2; do [[ $(probe "$i" startup) == 200 ]] || return 1; done; }
wait_until "every pod's startup probe" 120 all_started
[[ $(probe 0 readiness) != 200 ]] || fail "a pod was ready before the cluster existed"
mapfile -t job < <(m '.job_command[]')
mapfile -t job_env < <(pod_env 0 job)
run_job() {
    ip netns exec "$ns_client" env -i PATH="$(dirname "$hawser"):/usr/bin:/bin" HOME=/tmp \
        "${job_env[@]}" "${job[@]}"
}
wait_until "the init Job to succeed" 60 run_job
run_job >/dev/null || fail "the init Job, run again, failed"
wait_until "three ready voters" 120 all_ready 3
start_secs=$((SECONDS - t0))
log "start: three ready voters ${start_secs}s after the pods started"

client 0 sql -e "CREATE REPLICATION r ELEMENT e DATASTORE MASTER hawser_0 SUBSCRIBER hawser_1, hawser_2 RETURN RECEIPT" >/dev/null
create_table() { client 0 sql -e 'CREATE TABLE t (k BIGINT PRIMARY KEY, v VARCHAR(40))' >/dev/null 2>&1; }
wait_until "the table on the master" 30 create_table
write_rows "$rows"
check_step start

wipe_sub_secs=null
wipe_master_secs=null
want() { [[ ",$steps," == *",$1,"* ]]; }

# --- kill -9 and restart of each pod -----------------------------------------------------
if want restart; then
# Each pod's restart settles before the next pod dies: while a subscriber is down its
# return service is off, and a commit acknowledged then is asynchronous — a master killed
# before shipping it may lose it, as TimesTen's return services allow (the drills count
# such commits apart). Settled, every acknowledged commit is on every copy.
for i in 0 1 2; do
    kill -9 "${pid[$i]}"; wait "${pid[$i]}" 2>/dev/null || true
    write_rows 40
    start_pod "$i"
    write_rows 40
    check_step "restart hawser-$i"
done
fi

# A pod's volume lost: killed, wiped, written around, started again; prints the seconds
# from its start to a settled cluster.
wipe() { # ORDINAL STEP
    local i="$1" step="$2" t
    kill -9 "${pid[$i]}"; wait "${pid[$i]}" 2>/dev/null || true
    rm -rf "$work/pod-$i"
    [[ $step == wipe-master ]] && wait_until "failover off hawser-$i" 60 moved_off "$i"
    write_rows 40
    t=$SECONDS
    start_pod "$i"
    write_rows 40
    check_step "$step"
    wiped_secs=$((SECONDS - t))
}

# --- a subscriber's volume lost -----------------------------------------------------------
if want wipe-sub; then
    master="$(master_of)"
    wipe $(( (master + 2) % 3 )) wipe-sub
    wipe_sub_secs=$wiped_secs
fi

# --- the master's volume lost -------------------------------------------------------------
if want wipe-master; then
    wipe "$(master_of)" wipe-master
    wipe_master_secs=$wiped_secs
fi

# --- scale-down: the highest ordinal leaves ------------------------------------------------
if want scale-down; then
# A pod holding the master role hands it over before it leaves (docs/kubernetes.md).
if [[ $(master_of) == 2 ]]; then
    client 0 switchover --scheme r --to hawser_0 >/dev/null || fail "scale-down: switchover off hawser-2"
    wait_until "the master role off hawser-2" 60 moved_off 2
fi
# Not through jq: a node id is a u64, past what jq 1.6 holds exactly.
id2="$(client 2 status --format json | grep -o '"node_id": *[0-9]*' | head -1 | grep -o '[0-9]*$')"
client 0 node remove --node-id "$id2" --force >/dev/null || fail "scale-down: node remove"
kill -TERM "${pid[2]}"; wait "${pid[2]}" 2>/dev/null || true; pid[2]=""
write_rows 40
check_step scale-down 2
fi

if [[ $json == 1 ]]; then
    jq -n --argjson start "$start_secs" --argjson sub "$wipe_sub_secs" \
        --argjson master "$wipe_master_secs" --argjson rows "$acked" \
        '{ready_voters_after_start_s: $start, wiped_subscriber_caught_up_s: $sub,
          wiped_master_pod_caught_up_s: $master, rows_written: $rows}'
else
    echo "k8s.sh: passed (start,$steps): start ${start_secs}s to three ready voters; a wiped" \
         "subscriber caught up in ${wipe_sub_secs/null/-}s, a wiped master pod in" \
         "${wipe_master_secs/null/-}s; $acked rows written (${#unacked[@]} transactions" \
         "unacknowledged)"
fi
