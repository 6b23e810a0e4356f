#!/usr/bin/env python3
"""Module dependency cycles of a Rust crate: each source file is a module; an edge A -> B when
A names an item path inside B (`crate::b::..`, `super::..`, `self::..`, or a child module's path).
Test-only code (`#[cfg(test)]` items) is left out. Prints the strongly connected components with
more than one module."""
import os, re, sys

def modules(src):
    mods = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith('.rs'):
                continue
            p = os.path.join(root, f)
            rel = os.path.relpath(p, src)[:-3].split(os.sep)
            if rel[-1] in ('lib', 'main', 'mod'):
                rel = rel[:-1]
            if rel and rel[0] in ('bin',):
                continue
            mods['::'.join(rel)] = p
    return mods

def strip(text):
    text = re.sub(r'/\*.*?\*/', '', text, flags=re.S)
    text = re.sub(r'"(\\.|[^"\\])*"', '""', text)
    text = re.sub(r'//[^\n]*', '', text)
    # drop #[cfg(test)] items (brace-matched)
    out, i = [], 0
    for m in re.finditer(r'#\[cfg\(test\)\]', text):
        pass
    while True:
        m = re.search(r'#\[cfg\(test\)\]', text[i:])
        if not m:
            out.append(text[i:]); break
        s = i + m.start()
        out.append(text[i:s])
        j = s + len(m.group(0))
        # item ends at the first ';' before any '{', or at the matching '}'
        k = j
        while k < len(text) and text[k] not in '{;':
            k += 1
        if k < len(text) and text[k] == ';':
            i = k + 1; continue
        depth = 0
        while k < len(text):
            if text[k] == '{': depth += 1
            elif text[k] == '}':
                depth -= 1
                if depth == 0: break
            k += 1
        i = k + 1
    return ''.join(out)

def expand(path):
    """a::{b, c::{d, e}} -> [a::b, a::c::d, a::c::e] (best effort)"""
    m = re.search(r'\{', path)
    if not m:
        return [path]
    head = path[:m.start()]
    depth, k = 0, m.start()
    while k < len(path):
        if path[k] == '{': depth += 1
        elif path[k] == '}':
            depth -= 1
            if depth == 0: break
        k += 1
    inner = path[m.start()+1:k]
    parts, depth, cur = [], 0, ''
    for ch in inner:
        if ch == ',' and depth == 0:
            parts.append(cur); cur = ''; continue
        if ch == '{': depth += 1
        if ch == '}': depth -= 1
        cur += ch
    parts.append(cur)
    res = []
    for p in parts:
        p = p.strip()
        if not p: continue
        res += expand(head + p)
    return res

PATH = r'(?:crate|super|self|[a-z_][a-z0-9_]*)(?:\s*::\s*(?:\{[^;]*?\}|[A-Za-z_][A-Za-z0-9_]*))+'

def graph(src):
    mods = modules(src)
    edges = {m: set() for m in mods}
    for mod, p in mods.items():
        text = strip(open(p).read())
        segs = mod.split('::') if mod else []
        children = {k.split('::')[-1] for k in mods if k.startswith(mod + '::' if mod else '') and k != mod and len(k.split('::')) == len(segs) + 1}
        for m in re.finditer(PATH, text):
            raw = re.sub(r'\s+', '', m.group(0))
            for path in expand(raw):
                parts = [x for x in path.split('::') if x]
                if not parts: continue
                if parts[0] == 'crate':
                    base, rest = [], parts[1:]
                elif parts[0] == 'super':
                    base, rest = list(segs), parts
                    while rest and rest[0] == 'super':
                        base = base[:-1]; rest = rest[1:]
                elif parts[0] == 'self':
                    base, rest = list(segs), parts[1:]
                elif parts[0] in children:
                    base, rest = list(segs), parts
                else:
                    continue
                full = base + rest
                best = None
                for n in range(len(full), -1, -1):
                    cand = '::'.join(full[:n])
                    if cand in mods:
                        best = cand; break
                if best is not None and best != mod:
                    edges[mod].add(best)
    return mods, edges

def tarjan(edges):
    idx, low, on, st, out, c = {}, {}, set(), [], [], [0]
    sys.setrecursionlimit(10000)
    def visit(v):
        idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
        for w in edges[v]:
            if w not in idx:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = st.pop(); on.discard(w); comp.append(w)
                if w == v: break
            out.append(comp)
    for v in edges:
        if v not in idx: visit(v)
    return out

def main(argv):
    """module-cycles.py [--no-cycles] [--leaf MOD[:ALLOWED,...]]... SRC...

    --no-cycles: exit 1 when SRC has a cycle. --leaf: exit 1 when MOD or a module under it
    names a module outside MOD other than the ALLOWED ones."""
    no_cycles, leaves, srcs, ok = False, [], [], True
    args = iter(argv)
    for a in args:
        if a == '--no-cycles':
            no_cycles = True
        elif a == '--leaf':
            mod, _, allowed = next(args).partition(':')
            leaves.append((mod, [x for x in allowed.split(',') if x]))
        else:
            srcs.append(a)
    for src in srcs:
        mods, edges = graph(src)
        sccs = [sorted(s) for s in tarjan(edges) if len(s) > 1]
        print(f'{src}: {len(mods)} modules, {sum(map(len, edges.values()))} edges, '
              f'{len(sccs)} cycle group(s)')
        for s in sorted(sccs, key=len, reverse=True):
            print(f'  {len(s)}: ' + ', '.join(x or '<root>' for x in s))
        if '-v' in os.environ.get('MODCYCLES', ''):
            for m in sorted(edges):
                print(' ', m or '<root>', '->', ', '.join(sorted(x or '<root>' for x in edges[m])))
        if no_cycles and sccs:
            ok = False
        under = lambda m, p: m == p or m.startswith(p + '::')
        for mod, allowed in leaves:
            for m in sorted(edges):
                if not under(m, mod):
                    continue
                bad = [d for d in sorted(edges[m])
                       if not under(d, mod) and not any(under(d, a) for a in allowed)]
                if bad:
                    print(f'  {m} is a leaf but uses ' + ', '.join(x or '<root>' for x in bad))
                    ok = False
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
