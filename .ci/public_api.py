#!/usr/bin/env python3
"""The public API of the leasehold crate as text, one item a line, from rustdoc's JSON.

    public_api.py list JSON            print the listing
    public_api.py check JSON LISTING   fail if the API differs from LISTING, or if LISTING
                                       differs from the last release's and CHANGELOG.md's
                                       Unreleased section says nothing

Every public item reachable from the crate's root is listed under the path a user names it
by (a re-export under its re-exported name), with what a user's code depends on: a
function's whole signature, a struct's public fields, an enum's variants, a trait's items,
the traits a type implements (Send and Sync included), `#[non_exhaustive]`. Items hidden
from the docs (`#[doc(hidden)]`) are left out: they are no part of the API. The listing is
sorted, so that a change shows as a diff of the lines it touches.

CI runs `check` (.ci/run); after a deliberate change, `list` writes the new listing to
commit beside its CHANGELOG.md entry.
"""

import json
import re
import subprocess
import sys


# Traits the compiler implements that no user's code can name or depend on.
NOT_API = {"Freeze", "StructuralPartialEq", "UnsafeUnpin"}


class Api:
    def __init__(self, doc):
        self.index = doc["index"]
        self.paths = doc["paths"]
        self.lines = set()
        self.seen = set()
        # Every public path each item is reachable by; the shortest names it (see `named`).
        self.reachable = {}
        self.collecting = True

    def item(self, id_):
        return self.index.get(str(id_))

    # ----- types -----

    def path_of(self, path):
        """A resolved path's name: the crate's own items by their canonical path, others as
        rustdoc gives them (the last segment for the standard library's)."""
        id_ = path.get("id")
        name = path.get("path", "")
        known = self.paths.get(str(id_)) if id_ is not None else None
        if id_ is not None and self.named(id_):
            name = self.named(id_)
        elif known and known.get("crate_id") == 0:
            # a type of the crate no public path reaches: shown by where it lives, as a
            # signature that exposes it does
            name = "::".join(known["path"])
        elif known:
            name = known["path"][-1]
        return name + self.args(path.get("args"))

    def named(self, id_):
        """The path a user names the crate's item `id_` by: the shortest public one."""
        paths = self.reachable.get(id_)
        if not paths:
            return None
        return min(paths, key=lambda p: (p.count("::"), p))

    def args(self, args):
        if not args:
            return ""
        if "angle_bracketed" in args:
            ab = args["angle_bracketed"]
            parts = []
            for a in ab.get("args", []):
                if "type" in a:
                    parts.append(self.ty(a["type"]))
                elif "lifetime" in a:
                    parts.append(a["lifetime"])
                elif "const" in a:
                    parts.append(str(a["const"].get("expr", "_")))
                else:
                    parts.append("_")
            for c in ab.get("constraints", []):
                binding = c.get("binding", {})
                if "equality" in binding:
                    value = binding["equality"]
                    shown = self.ty(value["type"]) if "type" in value else "_"
                    parts.append(f"{c['name']} = {shown}")
                else:
                    parts.append(f"{c['name']}: {self.bounds(binding.get('constraint', []))}")
            return "<" + ", ".join(parts) + ">" if parts else ""
        if "parenthesized" in args:
            p = args["parenthesized"]
            inputs = ", ".join(self.ty(t) for t in p.get("inputs", []))
            out = p.get("output")
            return f"({inputs})" + (f" -> {self.ty(out)}" if out else "")
        return ""

    def bounds(self, bounds):
        shown = []
        for b in bounds:
            if "trait_bound" in b:
                tb = b["trait_bound"]
                modifier = "?" if tb.get("modifier") == "maybe" else ""
                shown.append(modifier + self.path_of(tb["trait"]))
            elif "outlives" in b:
                shown.append(b["outlives"])
            elif "use" in b:
                shown.append("use<" + ", ".join(str(u) for u in b["use"]) + ">")
        return " + ".join(shown)

    def ty(self, t):
        if t is None:
            return "()"
        if "resolved_path" in t:
            return self.path_of(t["resolved_path"])
        if "primitive" in t:
            return t["primitive"]
        if "generic" in t:
            return t["generic"]
        if "borrowed_ref" in t:
            r = t["borrowed_ref"]
            life = (r["lifetime"] + " ") if r.get("lifetime") else ""
            return "&" + life + ("mut " if r["is_mutable"] else "") + self.ty(r["type"])
        if "tuple" in t:
            return "(" + ", ".join(self.ty(x) for x in t["tuple"]) + ")"
        if "slice" in t:
            return "[" + self.ty(t["slice"]) + "]"
        if "array" in t:
            return "[" + self.ty(t["array"]["type"]) + "; " + t["array"]["len"] + "]"
        if "impl_trait" in t:
            return "impl " + self.bounds(t["impl_trait"])
        if "dyn_trait" in t:
            d = t["dyn_trait"]
            parts = [self.path_of(p["trait"]) for p in d["traits"]]
            if d.get("lifetime"):
                parts.append(d["lifetime"])
            return "dyn " + " + ".join(parts)
        if "raw_pointer" in t:
            p = t["raw_pointer"]
            return "*" + ("mut " if p["is_mutable"] else "const ") + self.ty(p["type"])
        if "qualified_path" in t:
            q = t["qualified_path"]
            trait = self.path_of(q["trait"]) if q.get("trait") else None
            base = self.ty(q["self_type"])
            return (f"<{base} as {trait}>" if trait else base) + "::" + q["name"]
        if "function_pointer" in t:
            f = t["function_pointer"]
            return "fn(" + ", ".join(self.ty(x[1]) for x in f["sig"]["inputs"]) + ")" + self.ret(f["sig"].get("output"))
        if "infer" in t or t == "infer":
            return "_"
        return json.dumps(t, sort_keys=True)

    def ret(self, out):
        return f" -> {self.ty(out)}" if out is not None else ""

    def generics(self, g):
        if not g:
            return "", ""
        params = []
        for p in g.get("params", []):
            kind = p["kind"]
            if "lifetime" in kind:
                params.append(p["name"])
            elif "type" in kind:
                if kind["type"].get("is_synthetic"):
                    continue  # an `impl Trait` argument, shown where it is
                b = self.bounds(kind["type"].get("bounds", []))
                params.append(p["name"] + (f": {b}" if b else ""))
            elif "const" in kind:
                params.append(f"const {p['name']}: {self.ty(kind['const']['type'])}")
        where = []
        for w in g.get("where_predicates", []):
            if "bound_predicate" in w:
                bp = w["bound_predicate"]
                where.append(f"{self.ty(bp['type'])}: {self.bounds(bp['bounds'])}")
            elif "eq_predicate" in w:
                where.append(json.dumps(w, sort_keys=True))
        return ("<" + ", ".join(params) + ">" if params else ""), (
            " where " + ", ".join(where) if where else ""
        )

    def fn(self, path, item, prefix="pub fn"):
        f = item["inner"]["function"]
        head = f.get("header", {})
        quals = "".join(
            q + " "
            for q, on in [("const", head.get("is_const")), ("async", head.get("is_async")), ("unsafe", head.get("is_unsafe"))]
            if on
        )
        params, where = self.generics(f.get("generics"))
        inputs = []
        for name, t in f["sig"]["inputs"]:
            if name == "self":
                shown = self.ty(t)
                inputs.append({"Self": "self", "&Self": "&self", "&mut Self": "&mut self"}.get(shown, "self: " + shown))
            else:
                inputs.append(f"{name}: {self.ty(t)}")
        self.add(f"{prefix} {quals}{path}{params}({', '.join(inputs)}){self.ret(f['sig'].get('output'))}{where}")

    # ----- items -----

    def add(self, line):
        if not self.collecting:
            self.lines.add(line)

    def marks(self, item):
        attrs = item.get("attrs", [])
        shown = []
        for a in attrs:
            text = a if isinstance(a, str) else json.dumps(a, sort_keys=True)
            if "non_exhaustive" in text:
                shown.append("#[non_exhaustive] ")
        return "".join(shown)

    def impls(self, path, impl_ids):
        for iid in impl_ids:
            impl = self.item(iid)
            if impl is None:
                continue
            i = impl["inner"]["impl"]
            if i.get("blanket_impl") is not None:
                continue
            if i.get("trait") is None:
                for mid in i["items"]:
                    m = self.item(mid)
                    if m is None or m.get("visibility") != "public":
                        continue
                    self.member(f"{path}::{m['name']}", m)
            else:
                trait = self.path_of(i["trait"])
                if trait.split("<")[0] in NOT_API:
                    continue
                params, where = self.generics(i.get("generics"))
                neg = "!" if i.get("is_negative") else ""
                self.add(f"impl{params} {neg}{trait} for {self.ty(i['for'])}{where}")

    def member(self, path, m):
        inner = m["inner"]
        if "function" in inner:
            self.fn(path, m)
        elif "assoc_const" in inner:
            self.add(f"pub const {path}: {self.ty(inner['assoc_const']['type'])}")
        elif "constant" in inner:
            self.add(f"pub const {path}: {self.ty(inner['constant']['type'])}")
        elif "assoc_type" in inner:
            self.add(f"type {path}")

    def walk(self, path, id_):
        item = self.item(id_)
        if item is None:
            return
        inner = item["inner"]
        key = (path, id_, self.collecting)
        if key in self.seen:
            return
        self.seen.add(key)
        if self.collecting:
            self.reachable.setdefault(id_, set()).add(path)
        elif "module" not in inner and self.named(id_) != path:
            # listed whole under the path that names it; here a re-export of it
            self.add(f"pub use {path} = {self.named(id_)}")
            return
        if "module" in inner:
            if path:
                self.add(f"pub mod {path}")
            for child in inner["module"]["items"]:
                c = self.item(child)
                if c is None or c.get("visibility") != "public":
                    continue
                if "use" in c["inner"]:
                    self.reexport(path, c)
                elif c.get("name"):
                    self.walk(f"{path}::{c['name']}" if path else c["name"], child)
        elif "struct" in inner:
            s = inner["struct"]
            params, where = self.generics(s.get("generics"))
            self.add(f"{self.marks(item)}pub struct {path}{params}{where}")
            kind = s["kind"]
            if isinstance(kind, dict) and "plain" in kind:
                for fid in kind["plain"]["fields"]:
                    f = self.item(fid)
                    if f and f.get("visibility") == "public":
                        self.add(f"pub {path}::{f['name']}: {self.ty(f['inner']['struct_field'])}")
            elif isinstance(kind, dict) and "tuple" in kind:
                for n, fid in enumerate(kind["tuple"]):
                    f = self.item(fid) if fid is not None else None
                    if f and f.get("visibility") == "public":
                        self.add(f"pub {path}::{n}: {self.ty(f['inner']['struct_field'])}")
            self.impls(path, s.get("impls", []))
        elif "enum" in inner:
            e = inner["enum"]
            params, where = self.generics(e.get("generics"))
            self.add(f"{self.marks(item)}pub enum {path}{params}{where}")
            for vid in e["variants"]:
                v = self.item(vid)
                if v is None:
                    continue
                vk = v["inner"]["variant"]["kind"]
                shown = ""
                if isinstance(vk, dict) and "tuple" in vk:
                    shown = "(" + ", ".join(self.ty(self.item(f)["inner"]["struct_field"]) if f is not None else "_" for f in vk["tuple"]) + ")"
                elif isinstance(vk, dict) and "struct" in vk:
                    fields = [self.item(f) for f in vk["struct"]["fields"]]
                    shown = " { " + ", ".join(f"{f['name']}: {self.ty(f['inner']['struct_field'])}" for f in fields if f) + " }"
                self.add(f"{self.marks(v)}pub {path}::{v['name']}{shown}")
            self.impls(path, e.get("impls", []))
        elif "union" in inner:
            self.add(f"pub union {path}")
        elif "trait" in inner:
            t = inner["trait"]
            params, where = self.generics(t.get("generics"))
            bounds = self.bounds(t.get("bounds", []))
            quals = ("unsafe " if t.get("is_unsafe") else "") + ("auto " if t.get("is_auto") else "")
            self.add(f"pub {quals}trait {path}{params}{': ' + bounds if bounds else ''}{where}")
            for mid in t["items"]:
                m = self.item(mid)
                if m is not None:
                    self.member(f"{path}::{m['name']}", m)
        elif "function" in inner:
            self.fn(path, item)
        elif "constant" in inner:
            self.add(f"pub const {path}: {self.ty(inner['constant']['type'])}")
        elif "static" in inner:
            self.add(f"pub static {path}: {self.ty(inner['static']['type'])}")
        elif "type_alias" in inner:
            ta = inner["type_alias"]
            params, where = self.generics(ta.get("generics"))
            self.add(f"pub type {path}{params} = {self.ty(ta['type'])}{where}")
        elif "macro" in inner or "proc_macro" in inner:
            self.add(f"macro {path}")

    def reexport(self, path, item):
        u = item["inner"]["use"]
        target = u.get("id")
        if u.get("is_glob"):
            t = self.item(target) if target is not None else None
            if t and "module" in t["inner"]:
                for child in t["inner"]["module"]["items"]:
                    c = self.item(child)
                    if c is not None and c.get("visibility") == "public" and c.get("name"):
                        self.walk(f"{path}::{c['name']}" if path else c["name"], child)
            return
        name = u["name"]
        full = f"{path}::{name}" if path else name
        if target is not None and self.item(target) is not None:
            self.walk(full, target)
        else:
            # another crate's item or module, re-exported whole: its version is the API
            self.add(f"pub use {full} = {u['source']}")


def listing(json_path):
    doc = json.load(open(json_path))
    api = Api(doc)
    root = doc["index"][str(doc["root"])]
    api.walk(root["name"], doc["root"])
    api.collecting, api.seen = False, set()
    api.walk(root["name"], doc["root"])
    return "\n".join(sorted(api.lines)) + "\n"


def unreleased_says_something(changelog):
    text = open(changelog).read()
    m = re.search(r"^## \[Unreleased\]\n(.*?)(?=^## \[|\Z)", text, re.S | re.M)
    return bool(m and re.search(r"^- ", m.group(1), re.M))


def last_release_listing(listing_path):
    try:
        tag = subprocess.run(["git", "describe", "--tags", "--abbrev=0", "--match", "v*"],
                             capture_output=True, text=True, check=True).stdout.strip()
        return tag, subprocess.run(["git", "show", f"{tag}:{listing_path}"],
                                   capture_output=True, text=True, check=True).stdout
    except subprocess.CalledProcessError:
        return None, None


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "list":
        sys.stdout.write(listing(sys.argv[2]))
        return 0
    if len(sys.argv) == 4 and sys.argv[1] == "check":
        now, committed = listing(sys.argv[2]), open(sys.argv[3]).read()
        if now != committed:
            sys.stdout.writelines(__import__("difflib").unified_diff(
                committed.splitlines(True), now.splitlines(True), sys.argv[3], "the code"))
            print(f"\nThe public API differs from {sys.argv[3]}. If the change is meant, write the "
                  f"new listing (.ci/public_api.py list) and say what users must do in "
                  f"CHANGELOG.md's Unreleased section.", file=sys.stderr)
            return 1
        tag, released = last_release_listing(sys.argv[3])
        if released is not None and released != committed and not unreleased_says_something("CHANGELOG.md"):
            print(f"The public API changed since {tag}, and CHANGELOG.md's Unreleased section "
                  f"has no entry: say what changed and what users must do.", file=sys.stderr)
            return 1
        print(f"public API: {len(now.splitlines())} items, as listed in {sys.argv[3]}"
              + (f" (changed since {tag}, and CHANGELOG.md says so)" if released not in (None, committed) else ""))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
