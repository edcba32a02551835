#!/usr/bin/env bash
# The demo: three local redis-server masters, two replicas of the axum example and one of
# the actix-web example sharing them (idempotent POST /payments, replay on), and rounds of
# concurrent requests spread over all three (`examples/burst.rs`): one key (one run, the rest
# 409), the same key after it (all replayed, the same payment_id), the key with another body
# (all 422), a distinct key each (all run). Prints a table of the answers, then a few of the
# lock's counters from the axum replicas' `GET /metrics` (built with the feature `metrics`),
# exits non-zero when a count is not the expected one, and stops everything it started (by
# pid).
#
# Without redis-server (and no way to install it) it runs one replica on the in-memory node
# and says so. Environment: REQUESTS (per round, default 40), WORK_MS (default 200),
# CARGO_TARGET_DIR (honoured), REDLOCK_URLS (set: the replicas lock on those voters —
# masters, Sentinel groups, Clusters — instead of three masters started here).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-redis.sh

# Where cargo puts the binaries (relative to the repository root, as cargo reads it).
target_dir=${CARGO_TARGET_DIR:-target}

pids=()
urls=()
workdir=$(mktemp -d)
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$workdir"
}
trap cleanup EXIT INT TERM

# A port nothing on 127.0.0.1 listens on (bash only: a fresh machine may lack python). A race
# with another process taking it meanwhile makes the start fail and be retried.
free_port() {
  local port
  for _ in $(seq 1 100); do
    port=$(( 20000 + RANDOM % 40000 ))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return 0
    fi
  done
  echo "no free port found" >&2
  return 1
}

# Whether `GET /health` on 127.0.0.1:$1 answers 200 (bash's /dev/tcp, 1 s read timeout).
health_ok() (
  exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
  printf 'GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  read -r -t 1 _ status _ <&3
  [ "$status" = 200 ]
)

# Waits until `$1` (a command) succeeds, for at most 10 s, while pid $2 lives.
wait_for() {
  for _ in $(seq 1 200); do
    if eval "$1" >/dev/null 2>&1; then return 0; fi
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# Starts one master on a free port; appends its pid to `pids` and its URL to `urls`.
start_master() {
  local port pid
  for _ in 1 2 3 4 5; do
    port=$(free_port)
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
      --daemonize no --dir "$workdir" --logfile "$workdir/redis-$port.log" >/dev/null 2>&1 &
    pid=$!
    if wait_for "redis-cli -p $port ping" "$pid"; then
      pids+=("$pid")
      urls+=("redis://127.0.0.1:$port")
      return 0
    fi
    kill "$pid" 2>/dev/null || true
  done
  echo "could not start redis-server" >&2
  return 1
}

# Starts one replica of example $1 on a free port; appends its base URL to `replicas`. A port
# taken meanwhile (by another process on this machine) makes it try another.
replicas=()
start_replica() {
  local port pid
  for _ in 1 2 3 4 5; do
    port=$(free_port)
    BIND_ADDR="127.0.0.1:$port" "$target_dir/release/examples/$1" \
      >"$workdir/replica-$port.log" 2>&1 &
    pid=$!
    if wait_for "health_ok $port" "$pid"; then
      pids+=("$pid")
      head -n 1 "$workdir/replica-$port.log"
      replicas+=("http://127.0.0.1:$port")
      return 0
    fi
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    grep -q "AddrInUse" "$workdir/replica-$port.log" && continue
    echo "replica on port $port did not start:" >&2
    cat "$workdir/replica-$port.log" >&2
    return 1
  done
  echo "no free port for a replica" >&2
  return 1
}

echo "building the examples (release; the first build compiles every dependency and takes several minutes)..."
cargo build --release --features axum,actix,cluster,metrics \
  --example axum_idempotent --example actix_idempotent --example burst

if [ -n "${REDLOCK_URLS:-}" ]; then
  # Your voters: masters, Sentinel groups, Clusters (see the README's "Voters").
  echo "using the voters of REDLOCK_URLS (none started here)"
  export REDLOCK_URLS
  start_replica axum_idempotent
  start_replica axum_idempotent
  start_replica actix_idempotent
elif ensure_redis; then
  for _ in 1 2 3; do start_master; done
  echo "started 3 redis-server masters: ${urls[*]}"
  export REDLOCK_URLS
  REDLOCK_URLS=$(IFS=,; echo "${urls[*]}")
  start_replica axum_idempotent
  start_replica axum_idempotent
  start_replica actix_idempotent
else
  echo "no redis-server: running ONE replica on the in-memory node instead" >&2
  echo "(the in-memory node protects a single process; install redis-server for the fleet demo)" >&2
  unset REDLOCK_URLS
  start_replica axum_idempotent
fi
echo
# Its exit status is the script's: non-zero when a round's answers are not the expected ones.
# After the rounds it prints the counters of every replica that serves GET /metrics.
"$target_dir/release/examples/burst" "${replicas[@]}"
