#!/usr/bin/env bash
# Makes sure PostgreSQL's server binaries are installed (`initdb` under Debian's
# /usr/lib/postgresql/<version>/bin, or on PATH): installs Debian's postgresql package when
# they are missing and we are root with apt-get. The tests start their own throwaway
# servers (testkit's PostgresServer); nothing is started here. Sourced by scripts/test.sh;
# returns non-zero with a hint otherwise.
has_initdb() {
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null 2>&1
}

ensure_postgres() {
  if has_initdb; then
    return 0
  fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "PostgreSQL is missing: installing Debian's postgresql package..." >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2 && apt-get install -y -qq postgresql >&2 || return 1
    has_initdb && return 0
  fi
  echo "PostgreSQL (initdb) is not installed. Install it with:" >&2
  echo "    sudo apt-get update && sudo apt-get install -y postgresql" >&2
  return 1
}
