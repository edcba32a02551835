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
# Then durable replay (with the masters started here, and PostgreSQL): a throwaway PostgreSQL
# cluster on a free loopback port and two replicas of `examples/axum_durable.rs` (the key's
# row in the payment's own transaction); one has `CRASH_AFTER_COMMIT=1` and SIGKILLs itself
# right after its commit, before its response is stored anywhere; every master is flushed;
# the retry on the other replica gets the original `payment_id`, rebuilt from PostgreSQL's
# `payments` table. Without PostgreSQL (and no way to install it) that round is skipped, and
# says why; it never fails the demo.
# Exits non-zero when an answer is not the expected one, and stops everything it started (by
# pid).
#
# Without redis-server (and no way to install it) it runs one replica on the in-memory node
# and says so. Environment: REQUESTS (per round, default 40), WORK_MS (default 200),
# CARGO_TARGET_DIR (honoured), REDLOCK_URLS (set: the replicas lock on those voters —
# masters, Sentinel groups, Clusters — instead of three masters started here),
# POSTGRES_BIN_DIR (where `initdb`, `postgres` and `psql` are; see scripts/ensure-postgres.sh),
# REDLOCK_DEMO_TARGETS (set: a file path; the replicas that serve GET /metrics, those of
# axum_idempotent, are written there as Prometheus file_sd targets, the file rewritten as each
# starts, and each start waits (10 s at most) for the scraper's word that it has scraped them
# all, "$REDLOCK_DEMO_TARGETS.scraped": scripts/ops-e2e.sh scrapes them).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-redis.sh
. scripts/ensure-postgres.sh
. scripts/free-port.sh

# Where cargo puts the binaries (relative to the repository root, as cargo reads it).
target_dir=${CARGO_TARGET_DIR:-target}

pids=()
urls=()
workdir=$(mktemp -d)
master_pids=()
# The durable round's PostgreSQL: its server's pid and its scratch directory.
pg_pid=""
pg_dir=""
cleanup() {
  # A paused master would not act on its SIGTERM: resume it first.
  for pid in "${master_pids[@]}"; do kill -CONT "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  # An immediate shutdown (what `pg_ctl stop -m immediate` sends): the cluster is thrown away.
  if [ -n "$pg_pid" ]; then
    kill -QUIT "$pg_pid" 2>/dev/null || true
    wait "$pg_pid" 2>/dev/null || true
  fi
  if [ -n "$pg_dir" ]; then rm -rf "$pg_dir"; fi
  rm -rf "$workdir"
}
# On INT or TERM: exit (which runs the cleanup), not go on after it.
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM


# Whether `GET /health` on 127.0.0.1:$1 answers 200 (bash's /dev/tcp, 1 s read timeout).
health_ok() (
  exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
  printf 'GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  read -r -t 1 _ status _ <&3
  [ "$status" = 200 ]
)

# Waits until `$1` (a command) succeeds, for at most $3 s (default 10), while pid $2 lives.
wait_for() {
  for _ in $(seq 1 $(( ${3:-10} * 20 ))); do
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

# The `host:port` of every replica that serves GET /metrics, written to REDLOCK_DEMO_TARGETS
# (when set) as Prometheus file_sd JSON: a whole new file each time, renamed into place.
metrics_targets=()
write_targets() {
  [ -n "${REDLOCK_DEMO_TARGETS:-}" ] || return 0
  local list
  list=$(printf '"%s", ' "${metrics_targets[@]}")
  printf '[{"targets": [%s]}]\n' "${list%, }" >"$REDLOCK_DEMO_TARGETS.tmp"
  mv "$REDLOCK_DEMO_TARGETS.tmp" "$REDLOCK_DEMO_TARGETS"
  # The new replica's series at 0 should be on record before its first request (a counter's
  # first value is no increase to `rate()`): a scraper that says so (scripts/ops-e2e.sh)
  # copies the list to "$REDLOCK_DEMO_TARGETS.scraped" once it has scraped every target.
  # Without one, the demo goes on after 10 s.
  local deadline=$((SECONDS + 10))
  while [ "$(cat "$REDLOCK_DEMO_TARGETS.scraped" 2>/dev/null)" != "$(cat "$REDLOCK_DEMO_TARGETS")" ] &&
    [ "$SECONDS" -lt "$deadline" ]; do
    sleep 0.1
  done
}

# Starts one replica of example $1 on a free port, with the environment assignments that
# follow (`NAME=value`); appends its base URL to `replicas`, and sets `replica_pid`. A port
# taken meanwhile (by another process on this machine) makes it try another.
replicas=()
replica_pid=""
start_replica() {
  local port pid
  for _ in 1 2 3 4 5; do
    port=$(free_port)
    env "${@:2}" BIND_ADDR="127.0.0.1:$port" "$target_dir/release/examples/$1" \
      >"$workdir/replica-$port.log" 2>&1 &
    pid=$!
    if wait_for "health_ok $port" "$pid"; then
      pids+=("$pid")
      replica_pid=$pid
      head -n 1 "$workdir/replica-$port.log"
      replicas+=("http://127.0.0.1:$port")
      if [ "$1" = axum_idempotent ]; then
        metrics_targets+=("127.0.0.1:$port")
        write_targets
      fi
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

# Masters of our own, unless REDLOCK_URLS names voters; the durable round (which flushes them)
# also needs PostgreSQL. Both are installed here when missing and possible.
have_redis=no
if [ -z "${REDLOCK_URLS:-}" ] && ensure_redis; then have_redis=yes; fi
durable_skip=""
pg_bin=""
if [ -n "${REDLOCK_URLS:-}" ]; then
  durable_skip="REDLOCK_URLS is set, and the round flushes every master: it runs only on masters started here"
elif [ "$have_redis" = no ]; then
  durable_skip="no redis-server masters to flush"
elif ! ensure_postgres 2>"$workdir/postgres-hint"; then
  cat "$workdir/postgres-hint" >&2
  hint=$(tr -s ' \n' ' ' <"$workdir/postgres-hint")
  durable_skip="no PostgreSQL, and it cannot be installed here: ${hint% }"
else
  cat "$workdir/postgres-hint" >&2
  pg_bin=$(postgres_bin_dir)
  if [ ! -x "$pg_bin/postgres" ] || [ ! -x "$pg_bin/psql" ]; then
    durable_skip="$pg_bin has initdb but not postgres and psql"
  elif [ "$(id -u)" = 0 ] && ! command -v setpriv >/dev/null 2>&1; then
    durable_skip="running as root without setpriv (PostgreSQL refuses to run as root)"
  elif [ "$(id -u)" = 0 ] && ! id -u postgres >/dev/null 2>&1; then
    durable_skip="running as root without a postgres OS user (PostgreSQL refuses to run as root)"
  fi
fi

# Built also when its round is skipped: the examples compile sqlx (a dev-dependency) either
# way, and one feature set keeps every later build incremental.
echo "building the examples (release; the first build compiles every dependency and takes several minutes)..."
cargo build --release --features axum,actix,cluster,metrics,sqlx-0_8 \
  --example axum_idempotent --example actix_idempotent --example burst --example axum_durable

if [ -n "${REDLOCK_URLS:-}" ]; then
  # Your voters: masters, Sentinel groups, Clusters (see docs/voters.md).
  echo "using the voters of REDLOCK_URLS (none started here)"
  export REDLOCK_URLS
  start_replica axum_idempotent
  start_replica axum_idempotent
  start_replica actix_idempotent
elif [ "$have_redis" = yes ]; then
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

# Whether the PostgreSQL server pid $1 serves port $2: its `postmaster.pid` names that pid and
# port and says `ready` (what `pg_ctl -w` waits for; not a server of someone else's).
pg_ready() {
  local lines=()
  mapfile -t lines <"$pg_dir/data/postmaster.pid" 2>/dev/null || return 1
  [ "${#lines[@]}" -ge 8 ] && [ "${lines[0]// /}" = "$1" ] && [ "${lines[3]// /}" = "$2" ] &&
    [ "${lines[7]// /}" = ready ]
}

# Starts a throwaway PostgreSQL cluster (initdb into a scratch directory; trust
# authentication; fsync off) on a free 127.0.0.1 port, as the `postgres` OS user when we are
# root (PostgreSQL refuses to run as root; setpriv execs, so `pg_pid` is the server itself).
# Sets `pg_pid` and `pg_port`.
start_postgres() {
  local as=() port pid
  pg_dir=$(mktemp -d)
  if [ "$(id -u)" = 0 ]; then
    chown postgres: "$pg_dir"
    as=(setpriv --reuid=postgres --regid=postgres --init-groups)
  fi
  if ! (cd "$pg_dir" && exec "${as[@]}" "$pg_bin/initdb" -D "$pg_dir/data" -U postgres \
    -A trust -E UTF8 --locale=C --no-sync) >"$workdir/initdb.log" 2>&1; then
    echo "initdb failed:" >&2
    cat "$workdir/initdb.log" >&2
    return 1
  fi
  for _ in 1 2 3 4 5; do
    port=$(free_port)
    (cd "$pg_dir" && exec "${as[@]}" "$pg_bin/postgres" -D "$pg_dir/data" -p "$port" -k "$pg_dir" \
      -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off \
      -c full_page_writes=off -c shared_buffers=16MB) >"$workdir/postgres-$port.log" 2>&1 &
    pid=$!
    if wait_for "pg_ready $pid $port" "$pid" 30; then
      pg_pid=$pid
      pg_port=$port
      return 0
    fi
    kill -QUIT "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  echo "could not start postgres:" >&2
  cat "$workdir/postgres-$port.log" >&2
  return 1
}

# One SQL statement on the demo's PostgreSQL; rows as `a|b` lines.
psql_q() {
  "$pg_bin/psql" -X -q -A -t -h 127.0.0.1 -p "$pg_port" -U postgres -d postgres -c "$1"
}

# POST /payments with `Idempotency-Key: "$2"` to 127.0.0.1:$1; prints the raw response (none
# when the connection dies first), carriage returns removed.
post_raw() (
  body='{"amount_cents":1250}'
  exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 0
  printf 'POST /payments HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: "%s"\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' \
    "$2" "${#body}" "$body" >&3 || exit 0
  timeout 30 cat <&3 2>/dev/null | tr -d '\r' || true
)

# A response's status code, its header $2's value, its payment_id.
status_of() { printf '%s\n' "$1" | head -n 1 | cut -d' ' -f2; }
header_of() { printf '%s\n' "$1" | grep -i "^$2:" | head -n 1 | cut -d' ' -f2- || true; }
payment_of() { printf '%s' "$1" | grep -o '"payment_id":"[^"]*"' | cut -d'"' -f4 || true; }

# A response as the table shows it: `200 replayed, payment_id …`.
describe() {
  local replayed=""
  if [ "$(header_of "$1" idempotency-replayed)" = true ]; then replayed=" replayed"; fi
  echo "$(status_of "$1")$replayed, payment_id $(payment_of "$1")"
}

# Whether pid $1 is gone (reaped: its exit status in `gone_status`), within 10 s.
wait_gone() {
  for _ in $(seq 1 200); do
    if ! kill -0 "$1" 2>/dev/null; then
      gone_status=0
      wait "$1" 2>/dev/null || gone_status=$?
      return 0
    fi
    sleep 0.05
  done
  return 1
}

# Durable replay: a replica killed after its commit, the masters flushed, the retry served
# from PostgreSQL. Sets `status` to 1 when an answer is not the expected one.
durable_round() {
  local db_url survivor doomed doomed_pid key first retry code after conflicts=0 deadline
  local committed rows again
  echo
  echo "durable replay (examples/axum_durable.rs: the key's row in the payment's PostgreSQL"
  echo "transaction): a replica SIGKILLed right after its commit, before its response was stored;"
  echo "then every master flushed; the retry goes to another replica:"
  start_postgres || return 1
  echo "started PostgreSQL on 127.0.0.1:$pg_port (a throwaway cluster)"
  db_url="postgres://postgres@127.0.0.1:$pg_port/postgres"
  # A short ttl and store timeout: a row without its response is trusted to have lost it
  # (and rebuilt) once it is older than both, about 3 s, not the defaults' 15 s.
  start_replica axum_durable DATABASE_URL="$db_url" TTL_MS=2000 DURABLE_TIMEOUT_MS=1000 || return 1
  survivor=${replicas[-1]##*:}
  start_replica axum_durable DATABASE_URL="$db_url" TTL_MS=2000 DURABLE_TIMEOUT_MS=1000 \
    CRASH_AFTER_COMMIT=1 || return 1
  doomed=${replicas[-1]##*:}
  doomed_pid=$replica_pid
  key="durable-$(cat /proc/sys/kernel/random/uuid)"

  # Bash reports a background job killed by a signal ("Killed") on its stderr: expected here.
  exec 4>&2 2>/dev/null
  first=$(post_raw "$doomed" "$key")
  wait_gone "$doomed_pid" || gone_status=alive
  exec 2>&4 4>&-
  if [ "$gone_status" = alive ]; then
    echo "the CRASH_AFTER_COMMIT replica answered and lives on: $(status_of "$first")" >&2
    return 1
  fi
  grep -h "CRASH_AFTER_COMMIT:" "$workdir/replica-$doomed.log" || true
  committed=$(psql_q "SELECT payment_id FROM payments")
  rows=$(psql_q "SELECT count(*) || ' row, ' || count(record) || ' response' FROM tower_redlock_keys")
  for url in "${urls[@]}"; do redis-cli -p "${url##*:}" flushall >/dev/null; done
  echo "flushed ${#urls[@]} masters (FLUSHALL): no lock, no record of the key is left in Redis"

  # The row is younger than the ttl and the store timeout: 409 + Retry-After, honoured.
  deadline=$((SECONDS + 30))
  while :; do
    retry=$(post_raw "$survivor" "$key")
    code=$(status_of "$retry")
    after=$(header_of "$retry" retry-after)
    if [ "$code" = 409 ] && [ -n "$after" ] && [ "$SECONDS" -lt "$deadline" ]; then
      conflicts=$((conflicts + 1))
      sleep "$after"
      continue
    fi
    break
  done
  grep -h "rebuilt the response" "$workdir/replica-$survivor.log" || true
  again=$(post_raw "$survivor" "$key")

  local answer_first="no answer (connection closed: exit status $gone_status)"
  [ -n "$first" ] && answer_first=$(status_of "$first")
  echo
  echo "| request | answer | expected |"
  echo "| --- | --- | --- |"
  echo "| the key, on the CRASH_AFTER_COMMIT=1 replica | $answer_first | no answer (SIGKILL, 137) |"
  echo "| (PostgreSQL then: payments / the key's row) | ${committed:-none} / $rows | one payment / 1 row, 0 response |"
  echo "| the key, on another replica, masters flushed | ${conflicts}× 409 + Retry-After, then $(describe "$retry") | 409 while the row is young, then 200 replayed, payment_id $committed |"
  echo "| the same key again | $(describe "$again") | the same |"
  local payments stored
  payments=$(psql_q "SELECT count(*) FROM payments")
  stored=$(psql_q "SELECT count(record) FROM tower_redlock_keys")
  if [ -n "$first" ] || [ "$gone_status" != 137 ] || [ -z "$committed" ] || [ "$rows" != "1 row, 0 response" ] ||
    [ "$code" != 200 ] || [ "$(header_of "$retry" idempotency-replayed)" != true ] ||
    [ "$(payment_of "$retry")" != "$committed" ] || [ "$(payment_of "$again")" != "$committed" ] ||
    [ "$payments" != 1 ] || [ "$stored" != 1 ]; then
    echo "durable replay was not answered as expected (payments in PostgreSQL: $payments)" >&2
    echo "the retry's response:" >&2
    printf '%s\n' "$retry" >&2
    status=1
    return 0
  fi
  echo
  echo "the retry got the original payment_id $committed, rebuilt from PostgreSQL's payments table"
  echo "(Durable::rebuild) after ${conflicts} 409s while the row was younger than ttl + Durable::timeout;"
  echo "PostgreSQL holds $payments payment: the handler never ran twice, though Redis had forgotten the key."
}

if [ -n "$durable_skip" ]; then
  echo
  echo "durable replay round skipped: $durable_skip"
elif [ "${#master_pids[@]}" -eq 3 ]; then
  durable_round || status=1
fi
exit "$status"
