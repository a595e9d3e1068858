# Local hawser nodes for the drills in chaos/: sourced by a script that has set `hawser`
# (the binary, or empty), `repo` (the checkout), `work` (a fresh directory), `keep` (1
# keeps it on exit) and `die`.
#
#   find_hawser          an empty `hawser` becomes target/release/hawser of the checkout
#                        (built if missing), else hawser on PATH
#   nodes ds1 ds2 ds3    free ports for each (grpc[n], http[n]); every node is killed
#                        and `work` removed (unless kept) on every exit path
#   start ds1 [ARGS…]    `hawser start` node ds1 on them and wait until it is ready
#   sql ds1 ARGS…        `hawser sql` against it
#
# Nodes run --insecure unless HAWSER_CERTS_DIR is set: then every node and every hawser
# command reads its certificates from there.

declare -A pid grpc http

find_hawser() {
    [[ -n $hawser ]] && return 0
    if [[ -x $repo/target/release/hawser ]] || (cd "$repo" && cargo build --release -p hawser-cli >&2); then
        hawser="$repo/target/release/hawser"
    else
        hawser="$(command -v hawser)" || die "no hawser binary: build it or pass --hawser"
    fi
}

cleanup() {
    for p in "${pid[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [[ $keep == 1 ]]; then echo "data kept in $work" >&2; else rm -rf "$work"; fi
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

nodes() {
    trap cleanup EXIT
    local n
    for n in "$@"; do grpc[$n]="127.0.0.1:$(free_port)"; http[$n]="127.0.0.1:$(free_port)"; done
}

# Starts node $1 (more arguments go to `hawser start`) and waits until it is ready.
start() {
    local n=$1
    shift
    : >"$work/$n.out"
    local security=(--insecure)
    [[ -n ${HAWSER_CERTS_DIR:-} ]] && security=()
    "$hawser" start "${security[@]}" --name "$n" --listen "${grpc[$n]}" --http "${http[$n]}" --data "$work/$n" \
        --log "${node_log:-warn}" "$@" >>"$work/$n.out" 2>>"$work/$n.log" &
    pid[$n]=$!
    for _ in $(seq 300); do
        grep -q '^ready ' "$work/$n.out" && return 0
        kill -0 "${pid[$n]}" 2>/dev/null || die "$n exited; see its log: $(tail -3 "$work/$n.log")"
        sleep 0.1
    done
    die "$n not ready within 30 s"
}

sql() { local n=$1; shift; "$hawser" sql --host "${grpc[$n]}" "$@"; }
