#!/usr/bin/env bash
# The checks of ops/ (the Grafana dashboard and the Prometheus alerts), quick enough for CI
# (scripts/test.sh runs it):
#   - `promtool check rules` and `promtool test rules` (every alert fires on the series that
#     should fire it and stays silent on a healthy one: ops/prometheus/alerts.test.yml);
#   - scripts/ops-names.py: every metric name of the alerts and of the dashboard's queries is
#     one the crate defines (tower_redlock::metrics::NAMES in src/metrics.rs, histograms with
#     their _bucket/_count/_sum), every name has a panel; then the same checker on fixtures
#     with dangling names (ops/tests/), which must fail and name them;
#   - the committed dashboard JSON is what ops/grafana/dashboard.py generates.
# Installs Debian's prometheus package when promtool is missing (scripts/ensure-prometheus.sh)
# and the pinned Python packages (ops/requirements.txt) into a venv of its own, kept under
# ~/.cache/tower-redlock (OPS_VENV overrides the path) and reused while the pins are the same.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-prometheus.sh
started=$SECONDS
ensure_prometheus
installed=$((SECONDS - started))

requirements=ops/requirements.txt
pins=$(sha256sum "$requirements" | cut -c1-12)
venv=${OPS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tower-redlock/ops-venv-$pins}
if ! "$venv/bin/python" -c 'import grafana_foundation_sdk, yaml' 2>/dev/null; then
  echo "ops-check: installing $requirements into $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$requirements"
fi
py="$venv/bin/python"
setup=$((SECONDS - started))

promtool check rules ops/prometheus/alerts.yml
(cd ops/prometheus && promtool test rules alerts.test.yml)

"$py" scripts/ops-names.py
# The negative test: names the crate does not define must fail the checker, each named.
out=$("$py" scripts/ops-names.py --rules ops/tests/dangling-alerts.yml \
  --dashboard ops/tests/dangling-dashboard.json --tests - 2>&1) && {
  echo "ops-check: scripts/ops-names.py passed the fixtures with dangling names:" >&2
  echo "$out" >&2
  exit 1
}
for name in redlock_acquire_total redlock_lost_total_bucket redlock_nodes_suspended \
  redlock_hold_seconds_bucket; do
  if ! grep -q "dangling metric name $name " <<<"$out"; then
    echo "ops-check: scripts/ops-names.py did not name the dangling $name:" >&2
    echo "$out" >&2
    exit 1
  fi
done
echo "ops-names: the fixtures' 4 dangling names fail the check, each named"

"$py" ops/grafana/dashboard.py --check
echo "ops-check: passed in $((SECONDS - started)) s (promtool install ${installed} s, venv ${setup} s in all)"
