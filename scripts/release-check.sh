#!/usr/bin/env bash
# Before a release: does what ships build, and is its dependency tree acceptable?
#
#   1. `cargo package` of tower-redlock and tower-redlock-cli (the `redlock` command), each
#      built from its own tarball; the crate's tarball is also checked and documented with
#      every feature (the guides and README are pulled in with include_str!).
#   2. `cargo publish --dry-run` of both.
#   3. `cargo deny check licenses bans sources` against deny.toml (advisories need the
#      RustSec database from GitHub, which these machines cannot reach: not checked here).
#   4. `cargo hack check --feature-powerset --depth 2` of the crate's library: every feature
#      alone and every pair.
#
# Installs cargo-deny and cargo-hack from crates.io when missing. Takes some 20 minutes on 2
# cores; not part of CI (.ci/run stays under 15 minutes). Usage: scripts/release-check.sh
# [--allow-dirty] (a work tree with uncommitted changes).
set -euo pipefail
cd "$(dirname "$0")/.."
dirty=()
[ "${1:-}" = "--allow-dirty" ] && dirty=(--allow-dirty)
target=${CARGO_TARGET_DIR:-target}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

step() { printf '\n== %s\n' "$*"; }

step "cargo package: tower-redlock and tower-redlock-cli, each built from its tarball"
cargo package --locked "${dirty[@]}" -p tower-redlock -p tower-redlock-cli
unpacked="$target/package/tower-redlock-$version"
step "the crate's tarball, every feature: check, and docs with warnings denied"
cargo check --manifest-path "$unpacked/Cargo.toml" --all-features --lib
RUSTDOCFLAGS="-D warnings" cargo doc --manifest-path "$unpacked/Cargo.toml" --all-features --no-deps
echo "files in the crate: $(cargo package --list "${dirty[@]}" -p tower-redlock | wc -l)"

step "cargo publish --dry-run"
cargo publish --dry-run --locked "${dirty[@]}" -p tower-redlock -p tower-redlock-cli

for tool in cargo-deny cargo-hack; do
  if ! command -v "$tool" >/dev/null; then
    step "installing $tool from crates.io"
    cargo install --locked "$tool"
  fi
done

step "cargo deny check licenses bans sources"
cargo deny --locked check licenses bans sources

step "cargo hack: every feature alone and every pair (library)"
cargo hack check --locked -p tower-redlock --lib --feature-powerset --depth 2

step "release checks passed"
