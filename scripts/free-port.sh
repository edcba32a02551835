# Sourced by scripts/demo.sh and scripts/ops-e2e.sh: `free_port` prints a port nothing on
# 127.0.0.1 listens on (bash only: a fresh machine may lack python). A race with another
# process taking it meanwhile makes the start fail and be retried by the caller.
# shellcheck shell=bash
free_port() {
  local port
  for _ in $(seq 1 100); do
    port=$(( 20000 + RANDOM % 40000 ))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return 0
    fi
  done
  echo "no free port found" >&2
  return 1
}
