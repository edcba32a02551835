#!/usr/bin/env bash
# The demo: three local redis-server masters, two replicas of the axum example and one of
# the actix-web example sharing them (idempotent POST /payments, replay on), and rounds of
# concurrent requests spread over all three (`examples/burst.rs`): one key (one run, the rest
# 409), the same key after it (all replayed, the same payment_id), the key with another body
# (all 422), a distinct key each (all run). Prints a table of the answers, then a few of the
# lock's counters from the axum replicas' `GET /metrics` (built with the feature `metrics`).
# Then a lost lease (with the masters started here): a replica with a 1 s ttl and
# `ON_LOST=abort` runs a 4 s handler while two masters are paused (SIGSTOP) for 2 s — its
# client gets `503` lock-lost, and the key afterwards `409` outcome-unknown, not a second run.
# Exits non-zero when an answer is not the expected one, and stops everything it started (by
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
master_pids=()
cleanup() {
  # A paused master would not act on its SIGTERM: resume it first.
  for pid in "${master_pids[@]}"; do kill -CONT "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$workdir"
}
# On INT or TERM: exit (which runs the cleanup), not go on after it.
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

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
      master_pids+=("$pid")
      urls+=("redis://127.0.0.1:$port")
      return 0
    fi
    kill "$pid" 2>/dev/null || true
  done
  echo "could not start redis-server" >&2
  return 1
}

# Starts one replica of example $1 on a free port, with the environment assignments that
# follow (`NAME=value`); appends its base URL to `replicas`. A port taken meanwhile (by another
# process on this machine) makes it try another.
replicas=()
start_replica() {
  local port pid
  for _ in 1 2 3 4 5; do
    port=$(free_port)
    env "${@:2}" BIND_ADDR="127.0.0.1:$port" "$target_dir/release/examples/$1" \
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
  # Your voters: masters, Sentinel groups, Clusters (see docs/voters.md).
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
# Non-zero when a round's answers are not the expected ones. After the rounds it prints the
# counters of every replica that serves GET /metrics.
status=0
"$target_dir/release/examples/burst" "${replicas[@]}" || status=$?

# POST /payments with `Idempotency-Key: "$2"` to 127.0.0.1:$1 (bash's /dev/tcp); prints the
# status code and the problem type, if any ("503 /problems/lock-lost").
post_payment() (
  body='{"amount_cents":1250}'
  exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
  printf 'POST /payments HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: "%s"\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' \
    "$2" "${#body}" "$body" >&3
  response=$(timeout 30 cat <&3)
  code=$(printf '%s\n' "$response" | head -n 1 | cut -d' ' -f2)
  problem=$(printf '%s' "$response" | grep -o '"type":"[^"]*"' | cut -d'"' -f4)
  echo "$code${problem:+ $problem}"
)

# The lost lease: only with masters started here (it pauses two of them).
if [ "${#master_pids[@]}" -eq 3 ]; then
  echo
  echo "a lost lease: one more axum replica (TTL_MS=1000, WORK_MS=4000, ON_LOST=abort) runs a"
  echo "request while two of the three masters are paused (SIGSTOP) for 2 s, past the ttl:"
  start_replica axum_idempotent TTL_MS=1000 WORK_MS=4000 ON_LOST=abort
  port=${replicas[-1]##*:}
  post_payment "$port" lost-lease-1 >"$workdir/lost-first" &
  client=$!
  sleep 0.5
  kill -STOP "${master_pids[0]}" "${master_pids[1]}"
  sleep 2
  kill -CONT "${master_pids[0]}" "${master_pids[1]}"
  wait "$client" || true
  first=$(cat "$workdir/lost-first")
  # The "outcome unknown" mark is written where the key is free once the masters are back.
  sleep 1
  again=$(post_payment "$port" lost-lease-1 || true)
  echo
  echo "| request | answer | expected |"
  echo "| --- | --- | --- |"
  echo "| the key, masters paused past its ttl | $first | 503 /problems/lock-lost (the handler was stopped) |"
  echo "| the same key, after it | $again | 409 /problems/idempotency-outcome-unknown (not run again) |"
  if [ "$first" != "503 /problems/lock-lost" ] || [ "$again" != "409 /problems/idempotency-outcome-unknown" ]; then
    echo "the lost lease was not answered as expected" >&2
    status=1
  fi
fi
exit "$status"
