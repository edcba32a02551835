#!/usr/bin/env bash
# Makes sure `redis-server` is on PATH: installs Debian's package when it is missing and we
# are root with apt-get. Sourced by the other scripts; exits non-zero with a hint otherwise.
ensure_redis() {
  if command -v redis-server >/dev/null 2>&1; then
    return 0
  fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "redis-server is missing: installing Debian's redis-server package..." >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2 && apt-get install -y -qq redis-server >&2 || return 1
    command -v redis-server >/dev/null 2>&1 && return 0
  fi
  echo "redis-server is not installed. Install it with:" >&2
  echo "    sudo apt-get update && sudo apt-get install -y redis-server" >&2
  return 1
}
