#!/usr/bin/env bash
# The demo: starts three local redis-server masters on free loopback ports, runs the
# `lock` example against them, and stops everything it started. Without redis-server (and
# no way to install it) it runs the example on the in-memory node and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-redis.sh

pids=()
workdir=$(mktemp -d)
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$workdir"
}
trap cleanup EXIT INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Starts one master; appends its pid to `pids` and its URL to `urls`.
urls=()
start_master() {
  local port
  for _ in 1 2 3 4 5; do
    port=$(free_port)
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
      --daemonize no --dir "$workdir" --logfile "$workdir/redis-$port.log" >/dev/null 2>&1 &
    local pid=$!
    for _ in $(seq 1 100); do
      if redis-cli -p "$port" ping >/dev/null 2>&1; then
        pids+=("$pid")
        urls+=("redis://127.0.0.1:$port")
        return 0
      fi
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.05
    done
    kill "$pid" 2>/dev/null || true
  done
  echo "could not start redis-server" >&2
  return 1
}

cargo build -q --release --example lock

if ensure_redis; then
  for _ in 1 2 3; do start_master; done
  echo "started 3 redis-server masters: ${urls[*]}"
  REDLOCK_URLS=$(IFS=,; echo "${urls[*]}") ./target/release/examples/lock
else
  echo "no redis-server: running the demo on the in-memory node instead" >&2
  ./target/release/examples/lock
fi
