#!/usr/bin/env bash
# The public API, guarded: builds rustdoc's JSON of the crate (every feature, as docs.rs
# builds it; RUSTC_BOOTSTRAP=1 lets stable rustdoc write JSON), lists every public item with
# scripts/public-api.py and compares the listing with tests/public-api.txt. A difference fails,
# so that every change to the surface is a deliberate diff in the same commit:
#
#   scripts/public-api.sh            # check (CI)
#   scripts/public-api.sh --bless    # write tests/public-api.txt after a deliberate change
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
RUSTC_BOOTSTRAP=1 RUSTDOCFLAGS="-D warnings" cargo rustdoc -q -p tower-redlock --lib \
  --all-features --locked -- -Z unstable-options --output-format json
# The API docs cite no tests (the guides do), read from the same JSON.
python3 scripts/api-doc-citations.py "$target/doc/tower_redlock.json"
listing=$(python3 scripts/public-api.py "$target/doc/tower_redlock.json")
if [ "${1:-}" = "--bless" ]; then
  printf '%s\n' "$listing" > tests/public-api.txt
  echo "wrote tests/public-api.txt ($(wc -l < tests/public-api.txt) lines)"
  exit 0
fi
if ! diff -u tests/public-api.txt <(printf '%s\n' "$listing"); then
  echo >&2
  echo "The public API differs from tests/public-api.txt (- committed, + this build)." >&2
  echo "If the change is deliberate: scripts/public-api.sh --bless, commit the listing, and" >&2
  echo "say it in CHANGELOG.md." >&2
  exit 1
fi
echo "public API unchanged ($(wc -l < tests/public-api.txt) lines in tests/public-api.txt)"
