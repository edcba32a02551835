#!/usr/bin/env bash
# The test command: installs redis-server when it is missing, then runs every test (unit,
# integration against real redis-server masters that the tests start themselves, doc tests)
# with all features on.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-redis.sh
ensure_redis
exec cargo test --all-features --locked "$@"
