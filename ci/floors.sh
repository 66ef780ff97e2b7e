#!/usr/bin/env bash
# The floors of src/ (issue 27, item 3). The table is the contributor comment
# in src/lib.rs (lines `// floor N name: modules...`), read here; each file of
# src/ gets the floor of the longest module path that names it (`driver`
# covers src/driver/, `team` src/team/). Fails, naming what to fix, when
#   - a file imports a module of a higher floor (`use crate::...` lines and any
#     other `crate::`/`super::` path in code: not comments, strings or
#     `#[cfg(test)] mod tests`; a root re-export counts as the module it
#     re-exports);
#   - files of src/ import each other in a circle (same floor or not);
#   - src/ has a `thread_local!`;
#   - a file of src/ is over 900 lines;
#   - src/team/ makes a raw driver call (`.driver()`).
# Run from anywhere: `bash ci/floors.sh`. Needs python3 only.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 - "$@" <<'PY'
import os, re, sys

MAX_LINES = 900
SRC = "src"

def strip(text):
    """Code only: comments and string/char literals blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i): depth += 1; i += 2
                elif text.startswith("*/", i): depth -= 1; i += 2
                else:
                    if text[i] == "\n": out.append("\n")
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'r(#*)"', text[i:])
            end = text.find('"' + m.group(1), i + len(m.group(0)))
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""' + "\n" * text.count("\n", i, end)); i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j)); i = j + 1
        elif c == "'":
            m = re.match(r"'(\\.[^']*|[^\\'])'", text[i:])
            if m: out.append("' '"); i += len(m.group(0))
            else: out.append(c); i += 1
        else:
            out.append(c); i += 1
    return "".join(out)

def drop_test_modules(code):
    """`#[cfg(test)] mod NAME { ... }` (or `cfg(all(test, ..))`) removed, by brace matching."""
    while True:
        m = re.search(r"#\[cfg\((?:all\()?test\b[^\]]*\]\s*(pub(\([^)]*\))?\s*)?mod\s+\w+\s*\{", code)
        if not m: return code
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0); j += 1
        code = code[:m.start()] + "\n" * code.count("\n", m.start(), j) + code[j:]

def expand(tree):
    """A use tree (`a::{b, c::{d, e}}`) as its paths."""
    tree = re.sub(r"\s+", "", tree)
    depth, start = 0, None
    for k, ch in enumerate(tree):
        if ch == "{":
            if depth == 0: start = k
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                head, inner, rest = tree[:start], tree[start + 1:k], tree[k + 1:]
                parts, d, s = [], 0, 0
                for q, c2 in enumerate(inner):
                    d += {"{": 1, "}": -1}.get(c2, 0)
                    if c2 == "," and d == 0: parts.append(inner[s:q]); s = q + 1
                parts.append(inner[s:])
                return [p for part in parts if part for p in expand(head + part + rest)]
    return [re.sub(r"\bas\b.*$", "", tree).replace("::self", "")] if tree else []

# Files and their module paths ("team/probe", "error" for src/error/mod.rs).
files = {}
for root, dirs, names in os.walk(SRC):
    dirs[:] = [d for d in dirs if d != "bin"]
    for name in names:
        if name.endswith(".rs"):
            p = os.path.join(root, name)
            m = p[len(SRC) + 1:-3]
            m = m[:-4] if m.endswith("/mod") else m
            if m != "lib": files[m] = p  # lib.rs: the face, above every floor
lib = strip(open(os.path.join(SRC, "lib.rs")).read())
raw_lib = open(os.path.join(SRC, "lib.rs")).read()

# `#[path = "x.rs"] mod name;` in lib.rs: the module `name` is the file `x`.
alias = {}
for pth, name in re.findall(r'#\[path\s*=\s*"([^"]+)"\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)', raw_lib):
    m = pth[:-3]
    alias[name] = m[:-4] if m.endswith("/mod") else m
# Root re-exports, and those of lib.rs's inline modules: `Context` is
# `context::Context`, `bounds::Kind` is `kind::Kind`.
reexport = {}
def scan_uses(code, prefix):
    for m in re.finditer(r"\buse\s+([^;]+);", code):
        for path in expand(m.group(1)):
            path = path[len("crate::"):] if path.startswith("crate::") else path
            if path.startswith("super::"): path = path[len("super::"):]
            last = path.split("::")[-1]
            if last != "*": reexport[prefix + last] = path
depth, top = 0, []
for m in re.finditer(r"(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*\{|[{}]", lib):
    if m.group(1):
        depth_at, k = 1, m.end()
        while k < len(lib) and depth_at:
            depth_at += {"{": 1, "}": -1}.get(lib[k], 0); k += 1
        scan_uses(lib[m.end():k - 1], m.group(1) + "::")
scan_uses(re.sub(r"(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{(?:[^{}]|\{[^{}]*\})*\}", "", lib), "")

def resolve(path, seen=0):
    """The file a crate path (`a::b::c`, from the root) lands in, or None."""
    parts = [p for p in path.split("::") if p]
    if not parts or seen > 8: return None
    if parts[0] in alias: parts = alias[parts[0]].split("/") + parts[1:]
    for k in range(len(parts), 0, -1):
        m = "/".join(parts[:k])
        if m in files: return m
    for k in range(min(len(parts), 2), 0, -1):
        key = "::".join(parts[:k])
        if key in reexport and reexport[key] != key:
            return resolve(reexport[key] + "::" + "::".join(parts[k:]), seen + 1)
    return None

# The floors table.
table = re.findall(r"^//\s*floor\s+(\d+)\s+[^:]*:\s*(.*)$", raw_lib, flags=re.M)
if not table:
    sys.exit("ci/floors.sh: no `// floor N name: modules` lines in src/lib.rs")
floor_of_module, names = {}, {}
for num, mods in table:
    for mod in mods.split():
        floor_of_module[mod.replace("::", "/")] = int(num)
for line in re.findall(r"^//\s*(floor\s+\d+\s+[^:]*):", raw_lib, flags=re.M):
    names[int(line.split()[1])] = line
def floor(m):
    parts = m.split("/")
    for k in range(len(parts), 0, -1):
        key = "/".join(parts[:k])
        if key in floor_of_module: return floor_of_module[key]
    return None

problems = []
unplaced = sorted(m for m in files if floor(m) is None)
for m in unplaced:
    problems.append(f"{files[m]}: no floor; add `{m.split('/')[0]}` to a `// floor N` line of src/lib.rs")

# Imports: every `crate::` path in code, and `super::` at file level.
edges, uses, n_paths = {m: {} for m in files}, 0, 0
for m, p in sorted(files.items()):
    code = drop_test_modules(strip(open(p, errors="replace").read()))
    paths = []
    for u in re.finditer(r"\buse\s+([^;]+);", code):
        for path in expand(u.group(1)):
            paths.append(path)
    body = re.sub(r"\buse\s+[^;]+;", " ", code)
    paths += re.findall(r"(?:\$?\bcrate|\bsuper(?:::super)*)::[A-Za-z_][A-Za-z0-9_:]*", body)
    parent = m.split("/")[:-1] if not p.endswith("mod.rs") else m.split("/")[:-1]
    for path in paths:
        path = path.lstrip("$").rstrip(":")
        if path.startswith("crate::"):
            rest = path[len("crate::"):]
        elif path.startswith("super::"):
            up = m.split("/")
            while path.startswith("super::"):
                path = path[len("super::"):]; up = up[:-1]
            rest = "::".join(up + [path])
        else:
            continue
        n_paths += 1
        target = resolve(rest)
        if not target or target == m or target.startswith(m + "/") or m.startswith(target + "/"):
            continue
        edges[m].setdefault(target, set()).add("crate::" + rest)

upward = []
for m in sorted(edges):
    for t in sorted(edges[m]):
        fm, ft = floor(m), floor(t)
        if fm is not None and ft is not None and ft > fm:
            what = ", ".join(sorted(edges[m][t]))
            upward.append(f"{files[m]} (floor {fm}) imports {t} (floor {ft}): {what}")

# Circles (Tarjan).
sys.setrecursionlimit(10000)
idx, low, stack, on, circles, counter = {}, {}, [], set(), [], [0]
def connect(v):
    idx[v] = low[v] = counter[0]; counter[0] += 1; stack.append(v); on.add(v)
    for w in edges[v]:
        if w not in idx: connect(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: circles.append(sorted(comp))
for v in sorted(files):
    if v not in idx: connect(v)

thread_locals, raw_calls, long_files = [], [], []
for root, _, names_ in os.walk(SRC):
    for name in sorted(names_):
        if not name.endswith(".rs"): continue
        p = os.path.join(root, name)
        text = open(p, errors="replace").read()
        n = text.count("\n")
        if n > MAX_LINES: long_files.append(f"{p}: {n} lines (at most {MAX_LINES}): split it into a folder")
        code = strip(text)
        for k, line in enumerate(code.split("\n"), 1):
            if "thread_local!" in line: thread_locals.append(f"{p}:{k}: thread_local!")
            if p.startswith(os.path.join(SRC, "team") + os.sep) and ".driver()" in line:
                raw_calls.append(f"{p}:{k}: raw driver call `.driver()`: use a typed method of Context")

print(f"floors: {len(files)} files of src/, {len(table)} floors (src/lib.rs), "
      f"{n_paths} crate paths read, {sum(len(e) for e in edges.values())} ties between files")
for f in sorted(names):
    tops = sorted({m.split("/")[0] for m in files if floor(m) == f})
    row = [t + (f"/ ({sum(1 for m in files if m.split('/')[0] == t)} files)"
                if any(m.startswith(t + "/") for m in files) else "") for t in tops]
    print(f"  {names[f]}: " + ", ".join(row))
stale = sorted(m for m in floor_of_module if not any(f == m or f.startswith(m + "/") for f in files))
if stale: print("  (the table names modules with no file: " + ", ".join(stale) + ")")
def report(title, rows):
    print(f"{title}: {len(rows) if rows else 'none'}")
    for r in rows: print(f"  {r}")
report("files without a floor", [x for x in problems])
report("imports of a higher floor", upward)
circle_rows = []
for comp in circles:
    ties = sum(1 for a in comp for b in edges[a] if b in comp)
    circle_rows.append(f"{', '.join(comp)} ({ties} ties)")
    for a in comp:
        for b in sorted(edges[a]):
            if b in comp: circle_rows.append(f"    {a} -> {b}: {', '.join(sorted(edges[a][b]))}")
print(f"import circles: {len(circles) if circles else 'none'}")
for r in circle_rows: print(f"  {r}")
report("thread_local! in src/", thread_locals)
report(f"files of src/ over {MAX_LINES} lines", long_files)
report("raw driver calls in src/team/", raw_calls)
failed = problems or upward or circles or thread_locals or long_files or raw_calls
print("floors: FAILED" if failed else "floors: ok")
sys.exit(1 if failed else 0)
PY
