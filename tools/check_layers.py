#!/usr/bin/env python3
"""Checks that the library's folders form layers (docs/layers.md).

The order is the Makefile's SRC_DIRS, lowest first. A file in src/<dir> may
include headers of its own folder and of folders earlier in that order, never
of a later one (an "upward include"). The CUDA plugin (src/cuda, built apart
by src/cuda/Makefile) may include only the folders the Makefile's CUDA_USES names;
it sits in the layer of the highest of them (runtime: it implements the
runtime's backend), so that layer and those above may include its headers.
No include cycle: no header includes itself through others, and no two
units (x.c with x.h) of different folders include each other through others.
Cycles between the units of one folder are listed with --list, not refused.

Headers: a header named *_int.h is private to its folder and is included
by its bare name from that folder only (and by tests/ and bench/, which are
white-box); every other header is public and is included by its folder
path ("core/err.h"), from its own folder too. A public header does not
include a private one. daemon/ and tools/ include the library through its
one public header, src/autocompress.h, which includes every public header
of the SRC_DIRS folders. The Makefile gives each folder a compile line that
sees only the public headers of the folders it may use (build/inc/<dir>,
made by tools/make_views.sh), so the compiler refuses what this check
reports; the check says why.

    tools/check_layers.py [--root DIR] [--list] [--no-allow] [--fix]

Exit status 0 when the layers hold (breaks on the allow-list below are
reported but tolerated), 1 otherwise. --list prints every include edge
between folders; --no-allow ignores the allow-list (shows every break);
--fix rewrites includes to the form above (bare -> folder path; daemon/
and tools/ -> autocompress.h) and then checks.
"""
import argparse
import os
import re
import sys

# Known upward includes not mended yet, each as ("dir/file", "dir/header"),
# relative to src/, with a comment saying why it stays. The check fails on any
# upward include not listed here and on a listed one that is gone (so the list
# only shrinks). Empty: the nine breaks found when the check came in (issue 29)
# are mended; keep it so if you can.
ALLOW = set([
])

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def src_dirs(root):
    """The SRC_DIRS list from the Makefile, lowest layer first."""
    with open(os.path.join(root, "Makefile")) as f:
        for line in f:
            m = re.match(r"\s*SRC_DIRS\s*:?=\s*(.*)$", line)
            if m:
                return m.group(1).split()
    sys.exit("check_layers: no SRC_DIRS in %s/Makefile" % root)


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def cuda_dirs(root):
    """The library folders the CUDA plugin may use: the Makefile's CUDA_USES
    (src/cuda/Makefile compiles against their view, build/inc/cuda)."""
    if not os.path.isdir(os.path.join(root, "src", "cuda")):
        return None
    with open(os.path.join(root, "Makefile")) as f:
        m = re.search(r"^CUDA_USES\s*:?=\s*(.*)$", f.read(), re.M)
    return m.group(1).split() if m else None


PUBLIC_HEADER = "autocompress.h"
OUTSIDE = ("daemon", "tools")  # use the library through PUBLIC_HEADER only
WHITEBOX = ("tests", "tests/cuda_emu", "bench")  # may include any header, by folder path


def is_private(name):
    return name.endswith("_int.h")


def library_files(root, dirs, extra=()):
    """'dir/file' -> path for every .c, .h and .cu of the library's folders."""
    src = os.path.join(root, "src")
    files = {}
    for d in list(dirs) + list(extra):
        p = os.path.join(src, d)
        for name in sorted(os.listdir(p)):
            if name.endswith((".c", ".h", ".cu")):
                files[d + "/" + name] = os.path.join(p, name)
    return files


def resolve(inc, d, files, by_name):
    """The library header an include names, as 'dir/header', or None. A
    folder-path include names it directly; a bare one is the including
    folder's own file first, else (the old form, refused) the header of
    that name in any folder."""
    if "/" in inc:
        return inc if inc in files else None
    if d and d + "/" + inc in files:
        return d + "/" + inc
    return by_name.get(inc)


def includes(path):
    """(line, included string, match span) of every quoted include."""
    with open(path, encoding="utf-8", errors="replace") as f:
        raw = f.read()
    text = strip_comments(raw)
    out = []
    for m in INCLUDE_RE.finditer(text):
        out.append((text.count("\n", 0, m.start(1)) + 1, m.group(1)))
    return out


def scan(root, dirs, extra=()):
    """Map 'dir/file' -> list of (line, 'dir/header', as written) for every
    quoted include of a library header from a library file."""
    files = library_files(root, dirs, extra)
    by_name = {k.split("/", 1)[1]: k for k in files if k.endswith(".h")}
    graph = {}
    for rel, path in files.items():
        d = rel.split("/")[0]
        edges = []
        for line, inc in includes(path):
            cand = resolve(inc, d, files, by_name)
            if cand:
                edges.append((line, cand, inc))
        graph[rel] = edges
    return graph


def form_problems(graph):
    """Includes in the wrong form, private headers used outside their folder,
    public headers that include private ones: (file, line, message, fixed)."""
    out = []
    for rel in sorted(graph):
        d, name = rel.split("/", 1)
        for line, inc, written in graph[rel]:
            td, tname = inc.split("/", 1)
            if is_private(tname):
                if td != d:
                    out.append((rel, line, "includes %s, private to %s/" % (inc, td), None))
                elif name.endswith(".h") and not is_private(name):
                    out.append((rel, line, "a public header includes the private %s" % inc, None))
                elif written != tname:
                    out.append((rel, line, "includes its folder's private %s by a path; write \"%s\"" % (inc, tname), tname))
            elif written != inc:
                out.append((rel, line, "includes %s by its bare name; write \"%s\"" % (inc, inc), inc))
    return out


def outside_problems(root, dirs, files):
    """daemon/ and tools/ files that include a library header other than
    PUBLIC_HEADER: (path, line, message, 'header')."""
    by_name = {k.split("/", 1)[1]: k for k in files if k.endswith(".h")}
    out = []
    for o in OUTSIDE:
        p = os.path.join(root, o)
        if not os.path.isdir(p):
            continue
        for name in sorted(os.listdir(p)):
            if not name.endswith((".c", ".h")):
                continue
            rel = o + "/" + name
            for line, inc in includes(os.path.join(p, name)):
                if os.path.exists(os.path.join(p, inc)):
                    continue  # the folder's own header
                cand = resolve(inc, None, files, by_name)
                if cand:
                    out.append((rel, line, "includes %s; daemon/ and tools/ include \"%s\" only" % (cand, PUBLIC_HEADER), cand))
    return out


def public_header_problems(root, dirs, files):
    """src/autocompress.h must include every public header of SRC_DIRS."""
    p = os.path.join(root, "src", PUBLIC_HEADER)
    if not os.path.exists(p):
        return ["src/%s is missing" % PUBLIC_HEADER]
    have = set(inc for _, inc in includes(p))
    want = set(k for k in files if k.endswith(".h") and not is_private(k.split("/", 1)[1])
               and k.split("/")[0] in dirs)
    out = ["src/%s does not include the public header %s" % (PUBLIC_HEADER, h) for h in sorted(want - have)]
    out += ["src/%s includes %s, not a public header of the library" % (PUBLIC_HEADER, h) for h in sorted(have - want)]
    return out


def fix(root, dirs, extra):
    """Rewrite includes to the checked form; returns the number of files changed."""
    files = library_files(root, dirs, extra)
    graph = scan(root, dirs, extra)
    todo = {}
    for rel, line, _, new in form_problems(graph):
        if new:
            todo.setdefault(files[rel], {})[line] = new
    for rel, line, _, _ in outside_problems(root, dirs, files):
        todo.setdefault(os.path.join(root, rel), {})[line] = PUBLIC_HEADER
    by_name = {k.split("/", 1)[1]: k for k in files if k.endswith(".h")}
    for w in WHITEBOX:
        p = os.path.join(root, w)
        for name in sorted(os.listdir(p)) if os.path.isdir(p) else []:
            if name.endswith((".c", ".h", ".cc")):
                for line, inc in includes(os.path.join(p, name)):
                    if "/" not in inc and not os.path.exists(os.path.join(p, inc)) and inc in by_name:
                        todo.setdefault(os.path.join(p, name), {})[line] = by_name[inc]
    for path, lines in todo.items():
        with open(path) as f:
            text = f.read().split("\n")
        have_public = any(re.match(r'\s*#\s*include\s*"%s"' % re.escape(PUBLIC_HEADER), t) for t in text)
        out = []
        for i, t in enumerate(text, 1):
            new = lines.get(i)
            if new is None:
                out.append(t)
                continue
            if new == PUBLIC_HEADER:
                if have_public:
                    continue  # one include of the public header is enough
                have_public = True
            out.append(re.sub(r'"[^"]+"', '"%s"' % new, t, count=1))
        with open(path, "w") as f:
            f.write("\n".join(out))
    return len(todo)


def cycles(graph):
    """Strongly connected components with more than one file (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for _, w, *_ in graph.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or any(w == v for _, w, *_ in graph.get(v, [])):
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def units(graph):
    """The graph over units: x.c and x.h of one folder are one node."""
    u = {}
    for f, edges in graph.items():
        k = f.rsplit(".", 1)[0]
        u.setdefault(k, [])
        for line, t, _ in edges:
            tk = t.rsplit(".", 1)[0]
            if tk != k:
                u[k].append((line, tk))
    return u


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--no-allow", action="store_true")
    ap.add_argument("--fix", action="store_true")
    a = ap.parse_args()
    dirs = src_dirs(a.root)
    rank = {d: i for i, d in enumerate(dirs)}
    cdirs = cuda_dirs(a.root)
    extra = ["cuda"] if cdirs is not None else []
    if a.fix:
        print("check_layers: --fix rewrote includes in %d file(s)" % fix(a.root, dirs, extra))
    graph = scan(a.root, dirs, extra)
    if cdirs is not None:
        rank["cuda"] = max(rank[d] for d in cdirs)
    allow = set() if a.no_allow else ALLOW
    bad, allowed, seen = [], [], set()
    for rel in sorted(graph):
        for line, inc, _ in graph[rel]:
            fd, td = rel.split("/")[0], inc.split("/")[0]
            if a.list and fd != td:
                print("edge     src/%s:%d -> src/%s" % (rel, line, inc))
            if fd == "cuda":
                up = td != "cuda" and td not in cdirs
            else:
                up = rank[td] > rank[fd]
            if up:
                key = (rel, inc)
                why = "not in the Makefile's CUDA_USES" if fd == "cuda" else "%s is above %s" % (td, fd)
                msg = "src/%s:%d includes %s (%s)" % (rel, line, inc, why)
                if key in allow:
                    allowed.append(msg)
                    seen.add(key)
                else:
                    bad.append(msg)
    for m in allowed:
        print("allowed  " + m)
    for m in bad:
        print("UPWARD   " + m)
    stale = sorted(allow - seen)
    for f, h in stale:
        print("STALE    allow-list entry src/%s -> %s no longer occurs; remove it" % (f, h))
    files = library_files(a.root, dirs, extra)
    form = [("src/" + f, l, m) for f, l, m, _ in form_problems(graph)]
    form += [(f, l, m) for f, l, m, _ in outside_problems(a.root, dirs, files)]
    for f, l, m in form:
        print("FORM     %s:%d %s" % (f, l, m))
    pub = public_header_problems(a.root, dirs, files)
    for m in pub:
        print("PUBLIC   " + m)
    cyc = cycles(graph)
    for c in cyc:
        print("CYCLE    " + " <-> ".join("src/" + x for x in c))
    for c in cycles(units(graph)):
        if len(set(x.split("/")[0] for x in c)) > 1:
            print("CYCLE    units " + " <-> ".join("src/" + x for x in c))
            cyc.append(c)
        elif a.list:
            print("note     units of one folder include each other: " + ", ".join("src/" + x for x in c))
    print("check_layers: order %s (cuda: %s); %d upward include(s) (%d allow-listed), %d cycle(s), "
          "%d include(s) in the wrong form, %d public-header problem(s)"
          % (" < ".join(dirs), " ".join(cdirs or ["-"]), len(bad) + len(allowed), len(allowed), len(cyc),
             len(form), len(pub)))
    return 1 if bad or stale or cyc or form or pub else 0


if __name__ == "__main__":
    sys.exit(main())
