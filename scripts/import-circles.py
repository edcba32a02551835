#!/usr/bin/env python3
"""Import circles among the Rust files under a source folder (e.g. src, or src/lock).

Each file is a module (src/a/b.rs and src/a/b/mod.rs are `a::b`; lib.rs/main.rs the root).
An edge A -> B when A names B's module by a path (`crate::a::b::…`, `super::b::…`,
`self::b::…`, also inside `use …::{…}` groups). A path to one's own ancestor (a child using its
parent's items) or descendant (a parent declaring its children) is not an edge: only
modules that are neither may not name each other both ways. Prints each circle (a strongly
connected set of 2+ files) with one reference per edge; exits 1 if there is one.
usage: scripts/import-circles.py [DIR=src] (CI runs it on src)"""
import os, re, sys

root_dir = (sys.argv[1] if len(sys.argv) > 1 else "src").rstrip("/")
# The crate root is the nearest folder upwards that holds lib.rs or main.rs (for src/lock: src).
crate_root = root_dir
while not any(os.path.exists(os.path.join(crate_root, f)) for f in ("lib.rs", "main.rs")):
    up = os.path.dirname(crate_root)
    if up == crate_root or not up:
        crate_root = root_dir
        break
    crate_root = up


def module_of(path):
    rel = os.path.relpath(path, crate_root)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


files = {}
for d, _, fs in os.walk(root_dir):
    for f in fs:
        if f.endswith(".rs"):
            p = os.path.join(d, f)
            files[module_of(p)] = p
modules = set(files)


def expand(path):
    """`a::{b, c::d}` -> ['a::b', 'a::c::d'] (one level of braces, enough for use lists)."""
    m = re.match(r"^(.*?)::\{(.*)\}$", path, re.S)
    if not m:
        return [path]
    head, body = m.group(1), m.group(2)
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        p = p.strip()
        if p:
            out += expand(head + "::" + p) if "{" not in p else expand(head + "::" + p)
    return out


def resolve(me, path):
    segs = [s.strip() for s in path.split("::") if s.strip()]
    if not segs:
        return None
    if segs[0] == "crate":
        base, rest = (), segs[1:]
    elif segs[0] in ("super", "self"):
        base = me
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
        rest = segs
    else:
        return None
    best = None
    cur = base
    if cur in modules:
        best = cur
    for s in rest:
        s = re.sub(r"\W.*$", "", s)
        if not s:
            break
        cur = cur + (s,)
        if cur in modules:
            best = cur
        else:
            break
    return best


path_re = re.compile(r"\b(?:crate|super|self)(?:::(?:\w+|\{[^;]*?\}))+", re.S)
edges = {m: {} for m in modules}
for me, p in files.items():
    text = re.sub(r"//[^\n]*", "", open(p, encoding="utf-8", errors="replace").read())
    for raw in path_re.findall(text):
        for path in expand(re.sub(r"\s+", "", raw)):
            target = resolve(me, path)
            if target is None or target == me:
                continue
            if target == me[: len(target)] or me == target[: len(me)]:
                continue  # ancestor or descendant
            edges[me].setdefault(target, path)

idx, low, on, st, out, n = {}, {}, set(), [], [], [0]


def sc(v):
    idx[v] = low[v] = n[0]
    n[0] += 1
    st.append(v)
    on.add(v)
    for w in edges[v]:
        if w not in idx:
            sc(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            out.append(sorted(comp))


sys.setrecursionlimit(10000)
for v in sorted(modules):
    if v not in idx:
        sc(v)
for c in out:
    names = {m: os.path.relpath(files[m]) for m in c}
    print("circle: " + ", ".join(names[m] for m in c))
    for a in c:
        for b, why in edges[a].items():
            if b in c:
                print(f"  {names[a]} -> {names[b]}: {why}")
sys.exit(1 if out else 0)
