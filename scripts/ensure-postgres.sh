#!/usr/bin/env bash
# Makes sure PostgreSQL's server binaries are installed (`initdb` under Debian's
# /usr/lib/postgresql/<version>/bin, or on PATH): installs Debian's postgresql package when
# they are missing and we are root with apt-get. The tests start their own throwaway
# servers (testkit's PostgresServer), the demo its own; nothing is started here. Sourced by
# scripts/test.sh and scripts/demo.sh; returns non-zero with a hint otherwise.
#
# POSTGRES_BIN_DIR, when set, is the only place looked at (and nothing is installed): the
# demo's lookup of `initdb`, `postgres`, `pg_isready` and `psql`. Set to a directory without
# them, it makes the demo behave as on a machine without PostgreSQL.

# The directory of `initdb` and the other server binaries: POSTGRES_BIN_DIR when set, else the
# newest of Debian's /usr/lib/postgresql/<version>/bin, else the one on PATH.
postgres_bin_dir() {
  local dir
  if [ -n "${POSTGRES_BIN_DIR+set}" ]; then
    [ -x "$POSTGRES_BIN_DIR/initdb" ] && echo "$POSTGRES_BIN_DIR"
    return
  fi
  while read -r dir; do
    if [ -x "$dir/initdb" ]; then
      echo "$dir"
      return 0
    fi
  done < <(compgen -G "/usr/lib/postgresql/*/bin" | sort -V -r)
  dir=$(command -v initdb 2>/dev/null) || return 1
  dirname "$dir"
}

has_initdb() {
  postgres_bin_dir >/dev/null
}

ensure_postgres() {
  if has_initdb; then
    return 0
  fi
  if [ -n "${POSTGRES_BIN_DIR+set}" ]; then
    echo "PostgreSQL (initdb) is not in POSTGRES_BIN_DIR=$POSTGRES_BIN_DIR (set: nothing is installed)" >&2
    return 1
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
