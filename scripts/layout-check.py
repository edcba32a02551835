#!/usr/bin/env python3
"""CONTRIBUTING's layout against the tree: the `## Layout` block must name every folder and
file at the top of src/ (and of tests/ and examples/ by their own lines), every path it names
must exist, and every file a folder's entry names (`view.rs`, `acquire/`) must be in that
folder. Each `.rs` file of src/ other than mod.rs and tests.rs is named (`view.rs`, or `view` as a
word) in its folder's entry.
Exits 1 with what drifted.  usage: scripts/layout-check.py"""
import os, re, sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
os.chdir(root)
text = open("CONTRIBUTING.md").read()
m = re.search(r"## Layout\s+```text\n(.*?)```", text, re.S)
if not m:
    sys.exit("CONTRIBUTING.md: no ```text block under '## Layout'")
# Entries: a line starting at column 0 opens one; indented lines continue it.
entries = []
for line in m.group(1).splitlines():
    if line and not line[0].isspace():
        entries.append([line])
    elif entries:
        entries[-1].append(line)

problems = []
named_top = set()
for entry in entries:
    head = entry[0].split()[0].rstrip(",")
    # `src/key.rs, src/policy.rs` heads: every leading path is an entry's own.
    paths = [p.rstrip(",") for p in re.findall(r"(?:^|(?<=, ))([\w.-]+/(?:[\w.-]+/?)*)", entry[0])]
    body = " ".join(entry)
    for p in paths or [head]:
        if not os.path.exists(p):
            problems.append(f"the layout names {p}, which does not exist")
            continue
        named_top.add(os.path.normpath(p))
    folder = paths[0] if paths else head
    if not os.path.isdir(folder):
        continue
    # Every `name.rs` or `name/` the entry mentions must be somewhere in that folder.
    have = set()
    for d, ds, fs in os.walk(folder):
        have.update(fs)
        have.update(x + "/" for x in ds)
    for name in set(re.findall(r"(?<![\w/.])([a-z_][\w]*\.rs|[a-z_][\w]*/)(?![\w])", body)):
        if name not in have and not os.path.exists(name.rstrip("/")) and not name.startswith(("src/", "tests/", "docs/", "examples/", "bench/", "cli/", "testkit/")):
            problems.append(f"{folder}: the layout names {name}, which is not in it")
    if folder.startswith("src/"):
        for d, _, fs in os.walk(folder):
            for f in fs:
                stem = f[:-3]
                if f.endswith(".rs") and stem not in ("mod", "tests") and not re.search(
                    rf"(?<![\w-]){re.escape(stem)}(?![\w-])", body
                ):
                    problems.append(f"{folder}: {os.path.join(d, f)} is not named in its entry")

for top in sorted(os.listdir("src")):
    p = os.path.normpath(os.path.join("src", top))
    if p not in named_top:
        problems.append(f"src/{top}{'/' if os.path.isdir(p) else ''} has no entry in the layout")

for p in problems:
    print(f"CONTRIBUTING.md layout: {p}")
sys.exit(1 if problems else 0)
