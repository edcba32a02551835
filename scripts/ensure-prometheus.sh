#!/usr/bin/env bash
# Makes sure `promtool` (and `prometheus`, for scripts/ops-e2e.sh) are on PATH: installs
# Debian's prometheus package when they are missing and we are root with apt-get. Sourced by
# scripts/ops-check.sh and scripts/ops-e2e.sh; returns non-zero with a hint otherwise.
#
# The package would start a system prometheus on port 9090 where services start: the
# install runs with a policy-rc.d that refuses every service start (Debian's documented
# switch; one already there, such as a container's, is used as it is and left alone), and
# the recommended node exporter is not installed. Nothing is stopped here: a prometheus
# that was already running is none of ours.
ensure_prometheus() {
  if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
    return 0
  fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "promtool is missing: installing Debian's prometheus package..." >&2
    export DEBIAN_FRONTEND=noninteractive
    local policy=/usr/sbin/policy-rc.d ours=no rc=0
    if [ ! -e "$policy" ]; then
      printf '#!/bin/sh\n# scripts/ensure-prometheus.sh: no service starts during its install\nexit 101\n' >"$policy"
      chmod 755 "$policy"
      ours=yes
    fi
    { apt-get update -qq >&2 &&
      apt-get install -y -qq --no-install-recommends prometheus >&2; } || rc=$?
    if [ "$ours" = yes ]; then rm -f "$policy"; fi
    [ "$rc" = 0 ] || return "$rc"
    command -v promtool >/dev/null 2>&1 && return 0
  fi
  echo "promtool is not installed. Install it with:" >&2
  echo "    sudo apt-get update && sudo apt-get install -y --no-install-recommends prometheus" >&2
  return 1
}
