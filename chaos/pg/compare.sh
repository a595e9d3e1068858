#!/usr/bin/env bash
# PostgreSQL synchronous-replication baseline for hawser's return-service figures.
#
# Sets up a throwaway PostgreSQL primary and one synchronous standby on loopback, runs the
# same single-row upsert load as `hawser bench` with pgbench for each synchronous_commit
# mode and client count, prints commits/s and p50/p99 latency per run, and tears
# everything down again on every exit path. See README.md beside this script.

set -euo pipefail

usage() {
    cat <<'EOF'
Usage: compare.sh [OPTIONS]

Runs a single-row upsert load (the one `hawser bench` applies) against a PostgreSQL primary
with one synchronous standby on loopback, once per synchronous_commit mode and client
count, and prints one line per run:

  postgres mode=remote_apply clients=16 commits_per_s=... p50_us=... p99_us=... steal_pct=...
      primary_cpu_us=... standby_cpu_us=...

(on one line). The last two are each server's CPU time (user + system, every process of
it, from /proc) over the measured run divided by its commits: what a commit costs the
primary and the standby, to set beside chaos/cpu.sh's figures for hawser's nodes.

Options:
  --duration SECS    measured seconds per run (default 10)
  --warmup SECS      unmeasured load before each run (default 1; 0 for none)
  --clients "N ..."  client counts to run (default "1 16")
  --modes "M ..."    synchronous_commit modes to run
                     (default "local remote_write remote_apply"; also off, on)
  --rate PER_SEC     hold the clients to this many transactions per second together
                     (pgbench --rate: Poisson arrivals, latency counted from each
                     transaction's scheduled time, as hawser bench --rate counts it);
                     default: each client starts its next transaction at once
  --standby-cpu-class CLASS
                     normal (default), or idle: the standby's processes run in Linux's
                     SCHED_IDLE class (chrt --idle), on CPU time the primary and the
                     load leave, as hawser start --cpu-class idle runs a node; for
                     asynchronous modes only (a standby a commit waits for would
                     slow every commit)
  --pg-bin DIR       directory with initdb, pg_ctl, pg_basebackup, psql, pgbench
                     (default $PG_BIN, else /usr/lib/postgresql/15/bin, else PATH)
  --json             print one JSON object per run instead of a text line
  --keep             keep the data directory (servers are still stopped)
  -h, --help         show this help

When run as root the servers run as user `postgres` (or `nobody` if there is none).
Progress and server problems go to stderr; results go to stdout.
EOF
}

duration=10
warmup=1
clients_list="1 16"
modes="local remote_write remote_apply"
pg_bin="${PG_BIN:-}"
json=0
keep=0
rate=""
standby_class=normal

prog=compare.sh
# shellcheck source=chaos/pg/args.sh
source "$(dirname "$0")/args.sh"

while [[ $# -gt 0 ]]; do
    case "$1" in
    --duration) need_value "$@"; duration="$2"; shift 2 ;;
    --warmup) need_value "$@"; warmup="$2"; shift 2 ;;
    --clients) need_value "$@"; clients_list="$2"; shift 2 ;;
    --modes) need_value "$@"; modes="$2"; shift 2 ;;
    --pg-bin) need_value "$@"; pg_bin="$2"; shift 2 ;;
    --rate) need_value "$@"; rate="$2"; shift 2 ;;
    --standby-cpu-class) need_value "$@"; standby_class="$2"; shift 2 ;;
    --json) json=1; shift ;;
    --keep) keep=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
done

check_run_args
check_rate
rate_args=()
[[ -z $rate ]] || rate_args=(--rate="$rate")
[[ -n ${modes// /} ]] || die "--modes is empty"
case "$standby_class" in
normal) ;;
idle) command -v chrt >/dev/null || die "--standby-cpu-class idle needs chrt (util-linux)" ;;
*) die "--standby-cpu-class must be normal or idle" ;;
esac
for m in $modes; do
    case "$m" in
    off | local | remote_write | on | remote_apply) ;;
    *) die "--modes: '$m' is not a synchronous_commit setting (off local remote_write on remote_apply)" ;;
    esac
done

if [[ -z $pg_bin ]]; then
    if [[ -x /usr/lib/postgresql/15/bin/initdb ]]; then
        pg_bin=/usr/lib/postgresql/15/bin
    elif command -v initdb >/dev/null; then
        pg_bin="$(dirname "$(command -v initdb)")"
    else
        die "no PostgreSQL server binaries found; pass --pg-bin DIR"
    fi
fi
for tool in initdb pg_ctl pg_basebackup psql pgbench postgres; do
    [[ -x $pg_bin/$tool ]] || die "$pg_bin/$tool is missing or not executable"
done
pg_version="$("$pg_bin/postgres" --version)"
[[ $pg_version =~ \ 15\. ]] || echo "compare.sh: warning: expected PostgreSQL 15, found: $pg_version" >&2

# PostgreSQL refuses to run as root: run the servers as an unprivileged user then.
run_as=""
if [[ $(id -u) -eq 0 ]]; then
    command -v runuser >/dev/null || die "running as root needs runuser to drop privileges"
    if id postgres >/dev/null 2>&1; then
        run_as=postgres
    elif id nobody >/dev/null 2>&1; then
        run_as=nobody
    else
        die "running as root but there is no postgres or nobody user to run the servers as"
    fi
fi

as_server() {
    if [[ -n $run_as ]]; then
        runuser -u "$run_as" -- "$@"
    else
        "$@"
    fi
}


# A port the kernel considers free on loopback right now. Another process could take it
# before the server binds; the server then fails to start and the script stops with its log.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

work="$(mktemp -d "${TMPDIR:-/tmp}/hawser-pgcompare.XXXXXX")"
primary="$work/primary"
standby="$work/standby"
bench_dir="$work/pgbench"
primary_port=""
standby_port=""
pgbench_pid=""

# Stops whatever was started, standby first (a primary shutting down waits to hand its
# last WAL to connected standbys), then removes the directory unless --keep.
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    set +e
    if [[ -n $pgbench_pid ]]; then
        kill "$pgbench_pid" 2>/dev/null
        wait "$pgbench_pid" 2>/dev/null
    fi
    local dir pid
    for dir in "$standby" "$primary"; do
        [[ -f $dir/postmaster.pid ]] || continue
        if ! as_server "$pg_bin/pg_ctl" stop -D "$dir" -m fast -w -t 30 >/dev/null 2>&1; then
            pid="$(head -n 1 "$dir/postmaster.pid" 2>/dev/null)"
            if [[ $pid =~ ^[0-9]+$ ]]; then
                log "server in $dir did not stop in 30 s; killing postmaster $pid"
                kill -KILL "$pid" 2>/dev/null
            fi
        fi
    done
    if command -v ss >/dev/null; then
        local port
        for port in $primary_port $standby_port; do
            if [[ -n $(ss -Hltn "sport = :$port") ]]; then
                log "warning: something still listens on 127.0.0.1:$port"
            fi
        done
    fi
    cd /
    leave_work "$status"
}
trap_cleanup

# The server user must be able to reach and write the directory; its working directory
# must be readable by it too (initdb checks).
chmod 755 "$work"
[[ -z $run_as ]] || chown "$run_as" "$work"
cd "$work"
mkdir "$bench_dir"

psql_primary() {
    "$pg_bin/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$primary_port" -U postgres -d postgres "$@"
}

# Starts the server in $1 (in the idle CPU class if $3 is idle: every process it forks
# inherits the class), or stops the script with the tail of its log.
start_server() {
    local dir="$1" name="$2" class="${3:-normal}" chrt=()
    [[ $class == normal ]] || chrt=(chrt --idle 0)
    if ! as_server "${chrt[@]}" "$pg_bin/pg_ctl" start -D "$dir" -l "$work/$name.log" -w -t 60 >/dev/null; then
        tail -n 20 "$work/$name.log" >&2 || true
        die "the $name server did not start"
    fi
}

log "$pg_version; data in $work"

# --- primary -------------------------------------------------------------------------
# initdb's own --no-sync only skips flushing the fresh catalog files; the server keeps
# fsync = on, so commits are durable as hawser's are.
primary_port="$(free_port)"
as_server "$pg_bin/initdb" -D "$primary" -U postgres --auth=trust --no-locale -E UTF8 --no-sync \
    >"$work/initdb.log" 2>&1 || { cat "$work/initdb.log" >&2; die "initdb failed"; }
cat >>"$primary/postgresql.conf" <<EOF

# compare.sh
listen_addresses = '127.0.0.1'
port = $primary_port
unix_socket_directories = ''
fsync = on
wal_level = replica
max_wal_senders = 4
synchronous_standby_names = 'standby1'
EOF
start_server "$primary" primary

# --- standby -------------------------------------------------------------------------
standby_port="$(free_port)"
while [[ $standby_port == "$primary_port" ]]; do standby_port="$(free_port)"; done
as_server "$pg_bin/pg_basebackup" -D "$standby" -R --checkpoint=fast --no-sync \
    -d "host=127.0.0.1 port=$primary_port user=postgres application_name=standby1" \
    >"$work/basebackup.log" 2>&1 || { cat "$work/basebackup.log" >&2; die "pg_basebackup failed"; }
cat >>"$standby/postgresql.conf" <<EOF
port = $standby_port
EOF
start_server "$standby" standby "$standby_class"

# Until the standby is streaming and chosen as the synchronous one, remote modes would
# either hang or silently measure a primary alone.
deadline=$((SECONDS + 30))
until [[ $(psql_primary -At -c \
    "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby1'") == sync ]]; do
    ((SECONDS < deadline)) || die "the standby did not become the synchronous standby within 30 s"
    sleep 0.2
done
log "primary on 127.0.0.1:$primary_port, synchronous standby on 127.0.0.1:$standby_port"

psql_primary -c "CREATE TABLE bench (k bigint PRIMARY KEY, v varchar(100))"

# hawser bench writes 100 random alphanumeric characters per row; here the 100 characters
# are random hex digits made by the server (four md5 values cut to 100), since pgbench
# variables hold numbers only.
cat >"$bench_dir/upsert.sql" <<'EOF'
\set k random(0, 99999)
INSERT INTO bench (k, v)
VALUES (:k, substr(md5(random()::text) || md5(random()::text) || md5(random()::text) || md5(random()::text), 1, 100))
ON CONFLICT (k) DO UPDATE SET v = excluded.v;
EOF

# CPU time (user + system, in clock ticks) the server in $1 has used: its postmaster,
# the postmaster's children alive now (walsender, walreceiver, startup, backends, ...),
# and the children it has reaped (the postmaster's cutime and cstime: a backend exits
# when its pgbench client disconnects). Every server process is a child of the
# postmaster. Fields are counted after the ")" that ends the command name.
server_ticks() {
    local pm
    pm="$(head -n 1 "$1/postmaster.pid" 2>/dev/null || true)"
    [[ $pm =~ ^[0-9]+$ ]] || { echo 0; return; }
    { cat /proc/[0-9]*/stat 2>/dev/null || true; } | awk -v pm="$pm" '
        { pid = $1; rest = $0; sub(/^.*\) /, "", rest); split(rest, f, " ")
          if (pid == pm) t += f[12] + f[13] + f[14] + f[15]
          else if (f[2] == pm) t += f[12] + f[13] }
        END { print t + 0 }'
}
clk_tck="$(getconf CLK_TCK 2>/dev/null || echo 100)"

# Microseconds of CPU per commit from ticks $1 -> $2 over $3 commits.
cpu_per_commit() {
    awk -v a="$1" -v b="$2" -v n="$3" -v hz="$clk_tck" 'BEGIN { printf "%.1f", (b - a) * 1e6 / hz / n }'
}

# Runs pgbench in the background so that INT/TERM reach the trap at once; extra arguments
# go to pgbench. Output lands in $bench_dir/$1.out.
run_pgbench() {
    local name="$1" mode="$2" clients="$3" secs="$4"
    shift 4
    PGOPTIONS="-c synchronous_commit=$mode" "$pg_bin/pgbench" -n -h 127.0.0.1 -p "$primary_port" \
        -U postgres -f "$bench_dir/upsert.sql" --protocol=prepared -c "$clients" -j "$clients" \
        -T "$secs" "$@" postgres >"$bench_dir/$name.out" 2>&1 &
    pgbench_pid=$!
    local status=0
    wait "$pgbench_pid" || status=$?
    pgbench_pid=""
    if [[ $status -ne 0 ]]; then
        cat "$bench_dir/$name.out" >&2
        die "pgbench ($name) exited with status $status"
    fi
}

for mode in $modes; do
    # PGOPTIONS reaches the server; check it takes, or every figure would be the default's.
    seen="$(PGOPTIONS="-c synchronous_commit=$mode" psql_primary -At -c "SHOW synchronous_commit")"
    [[ $seen == "$mode" ]] || die "synchronous_commit=$mode was not applied (server says $seen)"
    for clients in $clients_list; do
        name="$mode-c$clients"
        log "run: mode=$mode clients=$clients warm-up ${warmup}s, measure ${duration}s"
        if [[ $warmup -gt 0 ]]; then
            run_pgbench "$name-warmup" "$mode" "$clients" "$warmup" "${rate_args[@]}"
        fi
        before="$(cpu_sample)"
        primary_before="$(server_ticks "$primary")"
        standby_before="$(server_ticks "$standby")"
        run_pgbench "$name" "$mode" "$clients" "$duration" "${rate_args[@]}" --log --log-prefix="$bench_dir/$name"
        steal="$(steal_since "$before")"
        primary_after="$(server_ticks "$primary")"
        standby_after="$(server_ticks "$standby")"

        tps="$(awk '/^tps = / { print $3; exit }' "$bench_dir/$name.out")"
        [[ -n $tps ]] || { cat "$bench_dir/$name.out" >&2; die "no tps in pgbench's output ($name)"; }
        # Per-transaction log lines: client_id transaction_no time_us script_no epoch epoch_us
        # (and schedule_lag_us with --rate, time_us then counting from the scheduled start).
        # The time field reads "failed" or "skipped" for transactions that did not commit.
        cat "$bench_dir/$name".[0-9]* | awk '$3 ~ /^[0-9]+$/ { print $3 }' | sort -n >"$bench_dir/$name.lat"
        failed="$(cat "$bench_dir/$name".[0-9]* | awk '$3 !~ /^[0-9]+$/' | wc -l)"
        [[ $failed -eq 0 ]] || log "warning: $failed transactions failed ($name)"
        commits="$(wc -l <"$bench_dir/$name.lat")"
        [[ $commits -gt 0 ]] || die "no transaction committed ($name)"
        # Nearest-rank percentiles (the value at rank ceil(q·n)), as hdrhistogram reports
        # them in hawser bench.
        read -r p50 p99 < <(awk -v n="$commits" '
            BEGIN { r50 = int((n * 50 + 99) / 100); r99 = int((n * 99 + 99) / 100) }
            NR == r50 { p50 = $1 }
            NR == r99 { p99 = $1 }
            END { print p50, p99 }' "$bench_dir/$name.lat")
        tps_1="$(awk -v t="$tps" 'BEGIN { printf "%.1f", t }')"
        primary_cpu="$(cpu_per_commit "$primary_before" "$primary_after" "$commits")"
        standby_cpu="$(cpu_per_commit "$standby_before" "$standby_after" "$commits")"
        if [[ $json -eq 1 ]]; then
            printf '{"system":"postgres","mode":"%s","clients":%d,"duration_s":%d,"commits":%d,"commits_per_s":%s,"p50_us":%d,"p99_us":%d,"steal_pct":%s,"primary_cpu_us_per_commit":%s,"standby_cpu_us_per_commit":%s,"rate":%s}\n' \
                "$mode" "$clients" "$duration" "$commits" "$tps_1" "$p50" "$p99" "$steal" "$primary_cpu" "$standby_cpu" "${rate:-null}"
        else
            printf 'postgres mode=%s clients=%d commits_per_s=%s p50_us=%d p99_us=%d steal_pct=%s primary_cpu_us=%s standby_cpu_us=%s\n' \
                "$mode" "$clients" "$tps_1" "$p50" "$p99" "$steal" "$primary_cpu" "$standby_cpu"
        fi
        [[ $keep -eq 1 ]] || rm -f "$bench_dir/$name".[0-9]*
    done
done
