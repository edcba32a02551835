#!/usr/bin/env python3
"""The crate's public API, one item per line, sorted: read from rustdoc's JSON.

    scripts/public-api.sh            # compare with the committed listing (api/public-api.txt)
    scripts/public-api.sh --bless    # write the listing after a deliberate change

This script only reads the JSON (`target/doc/tower_redlock.json`) that `scripts/public-api.sh`
builds, and prints the listing: every public path (modules, re-exports followed to what they
name), each function's signature, struct fields, enum variants, trait methods, and the
traits each public type implements (auto traits and blanket impls left out).
"""

import json
import sys


def main(path):
    doc = json.load(open(path))
    index = doc["index"]
    lines = set()

    def item(i):
        return index.get(str(i))

    def render(t):
        if t is None:
            return "()"
        if not isinstance(t, dict):
            return str(t)
        (kind, v), = t.items()
        if kind == "resolved_path":
            return v["path"] + render_args(v.get("args"))
        if kind == "generic":
            return v
        if kind == "primitive":
            return v
        if kind == "borrowed_ref":
            life = (v.get("lifetime") or "") + " " if v.get("lifetime") else ""
            mut = "mut " if v.get("is_mutable") else ""
            return "&" + life + mut + render(v["type"])
        if kind == "tuple":
            return "(" + ", ".join(render(x) for x in v) + ")"
        if kind == "slice":
            return "[" + render(v) + "]"
        if kind == "array":
            return "[" + render(v["type"]) + "; " + str(v["len"]) + "]"
        if kind == "impl_trait":
            return "impl " + " + ".join(render_bound(b) for b in v)
        if kind == "dyn_trait":
            traits = [render_path(p["trait"]) for p in v["traits"]]
            if v.get("lifetime"):
                traits.append(v["lifetime"])
            return "dyn " + " + ".join(traits)
        if kind == "qualified_path":
            trait = render_path(v["trait"]) if v.get("trait") else "?"
            return "<" + render(v["self_type"]) + " as " + trait + ">::" + v["name"]
        if kind == "raw_pointer":
            return ("*mut " if v.get("is_mutable") else "*const ") + render(v["type"])
        if kind == "function_pointer":
            sig = v["sig"]
            ins = ", ".join(render(x[1]) for x in sig["inputs"])
            return "fn(" + ins + ") -> " + render(sig.get("output"))
        return kind + ":" + json.dumps(v, sort_keys=True)

    def render_path(p):
        return p["path"] + render_args(p.get("args"))

    def render_args(args):
        if not args:
            return ""
        if "angle_bracketed" in args:
            a = args["angle_bracketed"]
            parts = []
            for x in a.get("args", []):
                if "type" in x:
                    parts.append(render(x["type"]))
                elif "lifetime" in x:
                    parts.append(x["lifetime"])
                elif "const" in x:
                    parts.append(json.dumps(x["const"], sort_keys=True))
                else:
                    parts.append(json.dumps(x, sort_keys=True))
            for c in a.get("constraints", []):
                binding = c.get("binding", {})
                if "equality" in binding:
                    eq = binding["equality"]
                    val = render(eq["type"]) if "type" in eq else json.dumps(eq)
                    parts.append(c["name"] + " = " + val)
                else:
                    parts.append(c["name"] + ": " + json.dumps(binding, sort_keys=True))
            return "<" + ", ".join(parts) + ">" if parts else ""
        if "parenthesized" in args:
            p = args["parenthesized"]
            out = " -> " + render(p["output"]) if p.get("output") else ""
            return "(" + ", ".join(render(x) for x in p["inputs"]) + ")" + out
        return ""

    def render_bound(b):
        if "trait_bound" in b:
            return render_path(b["trait_bound"]["trait"])
        if "outlives" in b:
            return b["outlives"]
        return json.dumps(b, sort_keys=True)

    def generics(g):
        if not g:
            return ""
        names = []
        for p in g.get("params", []):
            kind = p.get("kind", {})
            if "lifetime" in kind:
                names.append(p["name"])
            elif "type" in kind:
                if kind["type"].get("is_synthetic"):
                    continue
                bounds = kind["type"].get("bounds", [])
                b = ": " + " + ".join(render_bound(x) for x in bounds) if bounds else ""
                names.append(p["name"] + b)
            elif "const" in kind:
                names.append("const " + p["name"])
        return "<" + ", ".join(names) + ">" if names else ""

    def function(prefix, it):
        f = it["inner"]["function"]
        header = f.get("header", {})
        quals = ("const " if header.get("is_const") else "") + (
            "async " if header.get("is_async") else ""
        ) + ("unsafe " if header.get("is_unsafe") else "")
        ins = []
        for name, t in f["sig"]["inputs"]:
            if name == "self":
                ins.append(render(t).replace("Self", "self") if t != {"generic": "Self"} else "self")
            else:
                ins.append(name + ": " + render(t))
        out = f["sig"].get("output")
        ret = " -> " + render(out) if out is not None else ""
        return "%sfn %s%s(%s)%s" % (quals, prefix + it["name"], generics(f.get("generics")), ", ".join(ins), ret)

    def emit(line):
        lines.add(line)

    def deprecated(it):
        return " #[deprecated]" if it.get("deprecation") else ""

    def visit(i, path, seen):
        it = item(i)
        if it is None or (i, path) in seen:
            return
        seen.add((i, path))
        inner = it["inner"]
        (kind, v), = inner.items()
        if kind == "module":
            emit("pub mod " + path)
            for c in v["items"]:
                child = item(c)
                if child is None:
                    continue
                if "use" in child["inner"]:
                    u = child["inner"]["use"]
                    if u.get("is_glob"):
                        if u.get("id") is not None:
                            target = item(u["id"])
                            if target and "module" in target["inner"]:
                                for cc in target["inner"]["module"]["items"]:
                                    sub = item(cc)
                                    if sub and sub.get("visibility") == "public" and sub.get("name"):
                                        visit(cc, path + "::" + sub["name"], seen)
                        continue
                    if u.get("id") is not None and item(u["id"]) is not None:
                        visit(u["id"], path + "::" + u["name"], seen)
                    else:
                        emit("pub use " + path + "::" + u["name"] + " = " + u["source"])
                    continue
                if child.get("visibility") != "public" or not child.get("name"):
                    continue
                visit(c, path + "::" + child["name"], seen)
        elif kind == "struct":
            emit("pub struct " + path + generics(v.get("generics")) + deprecated(it))
            k = v["kind"]
            if isinstance(k, dict) and "plain" in k:
                for f in k["plain"]["fields"]:
                    field = item(f)
                    if field and field.get("visibility") == "public":
                        emit("pub struct field %s.%s: %s" % (path, field["name"], render(field["inner"]["struct_field"])))
                if k["plain"].get("has_stripped_fields"):
                    emit("pub struct %s has private fields" % path)
            elif isinstance(k, dict) and "tuple" in k:
                fields = [render(item(f)["inner"]["struct_field"]) if f is not None and item(f) and item(f).get("visibility") == "public" else "_" for f in k["tuple"]]
                emit("pub struct %s(%s)" % (path, ", ".join(fields)))
            impls(path, v.get("impls", []))
        elif kind == "enum":
            emit("pub enum " + path + generics(v.get("generics")) + deprecated(it))
            for var in v["variants"]:
                vi = item(var)
                vk = vi["inner"]["variant"]["kind"]
                shape = ""
                if isinstance(vk, dict) and "struct" in vk:
                    names = [item(f)["name"] + ": " + render(item(f)["inner"]["struct_field"]) for f in vk["struct"]["fields"]]
                    shape = " { " + ", ".join(names) + " }"
                elif isinstance(vk, dict) and "tuple" in vk:
                    shape = "(" + ", ".join(render(item(f)["inner"]["struct_field"]) if f is not None else "_" for f in vk["tuple"]) + ")"
                emit("pub enum variant %s::%s%s" % (path, vi["name"], shape))
            if v.get("has_stripped_variants"):
                emit("pub enum %s has private variants" % path)
            impls(path, v.get("impls", []))
        elif kind == "trait":
            emit("pub trait " + path + generics(v.get("generics")) + deprecated(it))
            for m in v["items"]:
                mi = item(m)
                if "function" in mi["inner"]:
                    body = " (provided)" if mi["inner"]["function"].get("has_body") else ""
                    emit("pub trait method " + function(path + "::", mi) + body)
                elif "assoc_type" in mi["inner"]:
                    emit("pub trait type %s::%s" % (path, mi["name"]))
                elif "assoc_const" in mi["inner"]:
                    emit("pub trait const %s::%s" % (path, mi["name"]))
        elif kind == "function":
            emit("pub " + function(path.rsplit("::", 1)[0] + "::", it) + deprecated(it))
        elif kind == "constant":
            emit("pub const %s: %s" % (path, render(v["type"])))
        elif kind == "static":
            emit("pub static %s: %s" % (path, render(v["type"])))
        elif kind == "type_alias":
            emit("pub type %s%s = %s" % (path, generics(v.get("generics")), render(v["type"])))
        elif kind == "macro":
            emit("pub macro " + path)
        else:
            emit("pub %s %s" % (kind, path))

    def impls(path, ids):
        for i in ids:
            imp = item(i)
            if imp is None:
                continue
            v = imp["inner"]["impl"]
            if v.get("is_synthetic") or v.get("blanket_impl") is not None:
                continue
            if v.get("trait") is not None:
                neg = "!" if v.get("is_negative") else ""
                emit("impl %s%s for %s" % (neg, render_path(v["trait"]), path))
                continue
            for m in v["items"]:
                mi = item(m)
                if mi is None or mi.get("visibility") != "public":
                    continue
                if "function" in mi["inner"]:
                    emit("pub " + function(path + "::", mi) + deprecated(mi))
                elif "assoc_const" in mi["inner"]:
                    emit("pub const %s::%s" % (path, mi["name"]))

    root = doc["root"]
    visit(root, item(root)["name"], set())
    for line in sorted(lines):
        print(line)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "target/doc/tower_redlock.json")
