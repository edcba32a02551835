#!/usr/bin/env python3
"""The API docs cite no tests: test names belong in the guides (docs/*.md, shown as
`tower_redlock::guide`), beside the promises they try to break, not in the reference docs of
the public items. Reads rustdoc's JSON of the crate (built by scripts/public-api.sh) and prints
each public item whose docs name a test (a `fn` of tests/, of a tests.rs file, or marked
#[test] / #[tokio::test]); the guide module and the crate's page (the README) are the guides'.
Exits 1 if there is one.  usage: scripts/api-doc-citations.py [JSON]"""
import json, os, re, sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.environ.get("CARGO_TARGET_DIR", os.path.join(root, "target")), "doc", "tower_redlock.json")
tests = set()
for top in ["tests", "src", "testkit", "cli", "examples"]:
    for d, _, fs in os.walk(os.path.join(root, top)):
        for f in fs:
            if not f.endswith(".rs"):
                continue
            p = os.path.join(d, f)
            text = open(p, encoding="utf-8", errors="replace").read()
            if os.path.relpath(p, root).startswith("tests" + os.sep) or f == "tests.rs":
                tests.update(re.findall(r"\bfn\s+([a-z0-9_]+)", text))
            else:
                tests.update(re.findall(
                    r"#\[(?:tokio::)?test[^\]]*\]\s*(?:#\[[^\]]*\]\s*)*(?:async\s+)?fn\s+([a-z0-9_]+)",
                    text))
index = json.load(open(path))["index"]
hits = []
for item in index.values():
    docs = item.get("docs") or ""
    where = (item.get("span") or {}).get("filename", "")
    if not docs or where in ("src/guide.rs", "src/lib.rs") or not where.startswith("src/"):
        continue
    for span in re.findall(r"`([^`\n]+)`", docs):
        for name in re.findall(r"\b([a-z][a-z0-9]*(?:_[a-z0-9]+){3,})\b", span):
            if name in tests:
                line = (item.get("span") or {}).get("begin", [0])[0]
                hits.append(f"{where}:{line} ({item.get('name')}): cites the test `{name}`")
for h in sorted(set(hits)):
    print(h)
if hits:
    print("Test names go in the guides (docs/*.md), beside the promise they try; the API docs "
          "state the promise.", file=sys.stderr)
sys.exit(1 if hits else 0)
