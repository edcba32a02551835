#!/usr/bin/env python3
"""One table per fact: two tables in the docs that list mostly the same rows (the same things
in their cells) state one fact twice, and drift apart — as the gRPC status table did in
src/grpc.rs and docs/grpc.md. Reads the markdown tables of README.md, CONTRIBUTING.md,
BENCHMARKS.md, docs/*.md, cli/README.md and the doc comments (///, //!) under src/, and prints
each pair of tables that share at least 4 of their short cells (8 to 60 characters, words in
them) and at least 40 % of the smaller table's. Exits 1 if there is one: keep the table in one
place and link to it.
usage: scripts/one-table-per-fact.py"""
import os, re, sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
os.chdir(root)


def lines_of(path):
    text = open(path, encoding="utf-8", errors="replace").read().splitlines()
    if not path.endswith(".rs"):
        return list(enumerate(text, 1))
    out = []
    for n, line in enumerate(text, 1):
        s = line.strip()
        if s.startswith(("///", "//!")):
            out.append((n, s[3:].strip()))
        else:
            out.append((n, ""))
    return out


def tables(path):
    found, rows, start = [], [], None
    for n, line in lines_of(path) + [(0, "")]:
        if line.startswith("|"):
            if start is None:
                start = n
            rows.append(line)
            continue
        if len(rows) >= 3 and re.match(r"^\|[\s:|-]+\|?$", rows[1]):
            keys = set()
            for r in rows[2:]:
                for cell in r.strip("|").split("|"):
                    key = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", cell)
                    key = re.sub(r"[`*_]", "", key).strip().lower()
                    # A short value that says something (`ABORTED (10) + retry hint`); not a
                    # bare status, number or yes/no, which many tables share.
                    if 8 <= len(key) <= 60 and re.search(r"[a-z]{3}", key):
                        keys.add(key)
            found.append((f"{path}:{start}", keys))
        rows, start = [], None
    return found


paths = [p for p in ["README.md", "CONTRIBUTING.md", "BENCHMARKS.md", "cli/README.md"]
         if os.path.exists(p)]
paths += sorted(os.path.join("docs", f) for f in os.listdir("docs") if f.endswith(".md"))
for d, _, fs in os.walk("src"):
    paths += sorted(os.path.join(d, f) for f in fs if f.endswith(".rs"))
all_tables = [t for p in paths for t in tables(p)]
problems = []
for i, (a, ka) in enumerate(all_tables):
    for b, kb in all_tables[i + 1:]:
        shared = ka & kb
        if len(shared) >= 4 and len(shared) >= 0.4 * min(len(ka), len(kb)):
            sample = ", ".join(sorted(shared)[:4])
            problems.append(f"{a} and {b}: {len(shared)} cells in common ({sample}, …)")
for p in problems:
    print(f"one fact, two tables: {p}")
print(f"{len(all_tables)} tables read, {len(problems)} pairs that repeat one another",
      file=sys.stderr)
sys.exit(1 if problems else 0)
