#!/usr/bin/env bash
# The benchmarks: installs redis-server when it is missing (as scripts/test.sh does), then
# runs `cargo bench -p tower-redlock-bench` (the workspace member bench/) with the given
# arguments — by default the side-by-side comparison runner of BENCHMARKS.md (`--bench
# compare`, about 2 minutes; it starts its own masters).
#
#   scripts/bench.sh                   # the comparison table
#   scripts/bench.sh --bench profile   # the ablation
#   scripts/bench.sh --bench lock      # criterion (also: --bench layer)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-redis.sh
ensure_redis
if [ "$#" -eq 0 ]; then
  set -- --bench compare
fi
exec cargo bench --locked -p tower-redlock-bench "$@"
