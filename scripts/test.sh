#!/usr/bin/env bash
# The test command: installs redis-server and PostgreSQL when they are missing, then runs every
# test (unit, integration against real redis-server masters and PostgreSQL servers that the
# tests start themselves, doc tests) with all features on.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-redis.sh
. scripts/ensure-postgres.sh
ensure_redis
ensure_postgres
exec cargo test --all-features --locked "$@"
