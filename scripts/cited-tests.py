#!/usr/bin/env python3
"""Every test name the docs cite exists. Scans README.md, CONTRIBUTING.md, docs/*.md, cli/README.md
and the doc comments (///, //!) under src/ for backticked snake_case names with at least three
underscores (test names read as sentences; metric names redlock_* are skipped), and looks for
`fn NAME` anywhere in the workspace's Rust sources. Prints the missing ones; exit 1 if any.
usage: scripts/cited-tests.py [REPO]   (CI runs it: a guide that cites a renamed or removed
test fails the build)"""
import os, re, sys

root = sys.argv[1] if len(sys.argv) > 1 else "."
docs = []
for f in ["README.md", "CONTRIBUTING.md", "BENCHMARKS.md", "cli/README.md"]:
    p = os.path.join(root, f)
    if os.path.exists(p):
        docs.append(open(p, encoding="utf-8", errors="replace").read())
for d, _, fs in os.walk(os.path.join(root, "docs")):
    docs += [open(os.path.join(d, f), encoding="utf-8", errors="replace").read() for f in fs if f.endswith(".md")]
rs_files = []
for top in ["src", "tests", "testkit", "cli", "bench", "examples"]:
    for d, _, fs in os.walk(os.path.join(root, top)):
        rs_files += [os.path.join(d, f) for f in fs if f.endswith(".rs")]
defined = set()
for f in rs_files:
    text = open(f, encoding="utf-8", errors="replace").read()
    defined.update(re.findall(r"\bfn\s+([a-z0-9_]+)", text))
    if f.startswith(os.path.join(root, "src")):
        docs.append("\n".join(l for l in text.splitlines() if l.lstrip().startswith(("///", "//!"))))
cited = set()
for text in docs:
    for span in re.findall(r"`([^`\n]+)`", text):
        # a method of a type (`Router::into_make_service…`, `.h1_allow…(`) is an API, not a test
        if re.search(r"[A-Z][A-Za-z0-9]*::[a-z_0-9]+|\.[a-z_0-9]+\(|\([^)]*\)$", span):
            continue
        for name in re.findall(r"(?:^|::|\s)([a-z][a-z0-9]*(?:_[a-z0-9]+){3,})\b", span):
            if not name.startswith("redlock_"):
                cited.add(name)
missing = sorted(n for n in cited if n not in defined)
print(f"{len(cited)} cited, {len(missing)} missing" + (": " + " ".join(missing[:12]) if missing else ""))
sys.exit(1 if missing else 0)
