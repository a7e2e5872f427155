#!/usr/bin/env python3
"""house-rules: the project's structural rules, checked on the whole tree.

Usage:
    python3 tools/house-rules.py [--root DIR]   check the tree (default: this repo)
    python3 tools/house-rules.py --self-test    check the checker on fixture trees

What is checked (Python 3 standard library only; the whole tree in about a
second):

* Every Rust source file under ``crates/*/src`` and ``fuzz/fuzz_targets``
  that is not test code has at most 1,000 lines (physical lines, the whole
  file, inline test modules included: a file that needs a long test module
  moves it to a ``tests.rs`` of its own).
* Every function with a body (free functions, methods, nested functions)
  outside test code is at most 120 lines, counted from the line of its
  ``fn`` keyword to the line of its closing brace (attributes and doc
  comments above the ``fn`` are not counted). Braces are matched by a small
  lexer that skips comments (nested block comments too), string literals
  (``"..."``, ``b"..."``, ``c"..."``, raw strings ``r#"..."#``, ``br"..."``)
  and char literals (told apart from lifetimes and labels), so a brace in a
  string or comment does not count.
* No import circle between the modules of one crate. A module here is one
  source file (an inline ``mod x { }`` belongs to the file it is written
  in). An edge A -> B is a ``use`` in A (``{...}`` groups expanded) or a
  path ``crate::...``, ``super::...``, ``self::...`` written in A's code,
  resolved to the file that *defines* the item: re-exports (``pub use``,
  also globs) in ``mod.rs``/``lib.rs`` are followed to where the item is
  defined. Edges between a module and its own ancestors or descendants are
  ignored (a parent re-exporting its children, a child using its parent's
  items: not a circle). Each strongly connected component of more than one
  module is one violation, listed with the file:line of every edge in it.
  Paths in ``use`` that start with neither ``crate``/``super``/``self`` nor
  a child module of the current module name other crates and are ignored;
  so are items carrying ``#[cfg(doc)]`` (imports for doc links only, not
  compiled). Modules are found from each crate root (``lib.rs``,
  ``main.rs``, ``bin/*.rs``, each fuzz target) through ``mod x;``
  declarations (``#[path = "..."]`` honoured).
* ``BENCHMARKS.md`` at the repository root has at most 700 lines.

What counts as test code (exempt from every check):

1. a file with a directory named ``tests`` or ``benches`` in its path below
   the crate (``crates/x/src/a/tests/b.rs``, ``crates/x/tests/...``);
2. a file named ``tests.rs``;
3. a file declared by a module declaration carrying ``#[cfg(test)]``
   (``#[cfg(test)] mod helpers;``), or whose inner attributes include
   ``#![cfg(test)]``;
4. in any other file, the whole extent of an item or statement carrying
   the attribute ``#[cfg(test)]`` exactly: ``#[cfg(test)] mod tests { ... }``
   (the usual case), ``#[cfg(test)] fn ...``, ``#[cfg(test)] use ...;``,
   ``#[cfg(test)] impl ... { }``. A function with a ``#[cfg(test)]``
   statement inside it is not test code; the statement is only left out of
   the import graph.

Output: one line per violation, ``path:line: what``, then
``house-rules: F files, N functions, M modules checked, V violations``.
The exit status is 1 when V > 0 (or when the self-test fails), else 0.
"""

import bisect
import os
import re
import sys
import tempfile

MAX_FILE_LINES = 1000
MAX_FN_LINES = 120
MAX_BENCHMARKS_LINES = 700

# ---------------------------------------------------------------- the lexer

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<line>//[^\n]*)
  | (?P<block>/\*)
  | (?P<raw>(?:br|cr|r)(?P<hashes>\#*)")
  | (?P<str>(?:b|c)?"(?:[^"\\]|\\.)*")
  | (?P<chr>b?'(?:[^'\\\n]|\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F_]*\}|.))')
  | (?P<life>'[A-Za-z_][A-Za-z0-9_]*)
  | (?P<rawid>r\#[A-Za-z_][A-Za-z0-9_]*)
  | (?P<id>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<num>[0-9][A-Za-z0-9_]*)
  | (?P<path>::)
  | (?P<p>.)
    """,
    re.VERBOSE | re.DOTALL,
)


class Tok:
    """One token: kind ('id', 'p', 'str', 'chr', 'life', 'num'), text, line."""

    __slots__ = ("kind", "text", "line", "pos")

    def __init__(self, kind, text, line, pos):
        self.kind = kind
        self.text = text
        self.line = line
        self.pos = pos

    def __repr__(self):
        return f"{self.text}@{self.line}"


def lex(src):
    """The tokens of `src`, comments and whitespace left out."""
    newlines = [i for i, c in enumerate(src) if c == "\n"]

    def line_of(pos):
        return bisect.bisect_right(newlines, pos) + 1

    toks = []
    pos = 0
    n = len(src)
    match = _TOKEN.match
    while pos < n:
        m = match(src, pos)
        kind = m.lastgroup
        if kind == "hashes":  # lastgroup names the innermost group
            kind = "raw"
        if kind in ("ws", "line"):
            pos = m.end()
            continue
        if kind == "block":
            depth, i = 1, pos + 2
            while depth and i < n:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            pos = i
            continue
        if kind == "raw":
            close = '"' + m.group("hashes")
            end = src.find(close, m.end())
            end = n if end < 0 else end + len(close)
            toks.append(Tok("str", src[pos:end], line_of(pos), pos))
            pos = end
            continue
        text = m.group(kind)
        if kind == "rawid":
            kind, text = "id", text[2:]
        elif kind == "path":
            kind = "p"
        toks.append(Tok(kind, text, line_of(pos), pos))
        pos = m.end()
    return toks


def match_close(toks, i):
    """Index of the token closing the bracket at toks[i] (or the last)."""
    pairs = {"{": "}", "(": ")", "[": "]"}
    opener = toks[i].text
    closer = pairs[opener]
    depth = 0
    for j in range(i, len(toks)):
        t = toks[j]
        if t.kind != "p":
            continue
        if t.text == opener:
            depth += 1
        elif t.text == closer:
            depth -= 1
            if depth == 0:
                return j
    return len(toks) - 1


def item_end(toks, i):
    """Index of the last token of the item or statement starting at toks[i]:
    the first `;` at bracket depth 0, or the `}` closing the first `{` met
    at depth 0."""
    depth = 0
    for j in range(i, len(toks)):
        t = toks[j]
        if t.kind != "p":
            continue
        if t.text in "([":
            depth += 1
        elif t.text in ")]":
            depth -= 1
        elif t.text == "{" and depth == 0:
            return match_close(toks, j)
        elif t.text == ";" and depth == 0:
            return j
    return len(toks) - 1


# ---------------------------------------------------- a parsed source file


class Source:
    """One Rust file, lexed, with its test regions, functions and modules."""

    def __init__(self, path, rel, text):
        self.path = path
        self.rel = rel
        self.lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        self.toks = lex(text)
        self.test = [False] * len(self.toks)
        self.doc_only = [False] * len(self.toks)  # `#[cfg(doc)]` items
        self.whole_file_test = False
        self.test_mod_decls = set()  # names of `#[cfg(test)] mod x;`
        self._mark_tests()
        self.path_attrs = {}  # index of `mod` -> the `#[path = "..."]` it has
        t = self.toks
        for i in range(len(t) - 5):
            if t[i].text == "#" and t[i + 1].text == "[" and t[i + 2].text == "path" and t[i + 4].kind == "str":
                k = i + 6
                while k < len(t) and t[k].text in ("pub", "(", "crate", "super", ")", "in"):
                    k += 1
                if k < len(t) and t[k].text == "mod":
                    self.path_attrs[k] = t[i + 4].text.strip('"')

    def _attr_at(self, i):
        """(end index, is exactly cfg(test), inner) for an attribute at i."""
        toks = self.toks
        inner = i + 1 < len(toks) and toks[i + 1].text == "!"
        j = i + 2 if inner else i + 1
        if j >= len(toks) or toks[j].text != "[":
            return None
        end = match_close(toks, j)
        body = [t.text for t in toks[j + 1 : end]]
        if body == ["cfg", "(", "doc", ")"]:
            return end, "doc", inner
        return end, body == ["cfg", "(", "test", ")"], inner

    def _mark_tests(self):
        toks = self.toks
        i = 0
        while i < len(toks):
            if toks[i].text != "#" or toks[i].kind != "p":
                i += 1
                continue
            a = self._attr_at(i)
            if a is None:
                i += 1
                continue
            end, is_test, inner = a
            if is_test == "doc" and not inner:
                last = item_end(self.toks, end + 1)
                for m in range(i, last + 1):
                    self.doc_only[m] = True
                i = last + 1
                continue
            if is_test is not True:
                i = end + 1
                continue
            if inner:
                self.whole_file_test = True
                return
            # skip the other attributes of the item
            j = end + 1
            while j < len(toks) and toks[j].text == "#":
                b = self._attr_at(j)
                if b is None:
                    break
                j = b[0] + 1
            last = item_end(toks, j)
            k = j
            while k < len(toks) and toks[k].text in ("pub", "(", "crate", "super", ")", "in"):
                k += 1
            if (
                k + 2 < len(toks)
                and toks[k].text == "mod"
                and toks[k + 2].text == ";"
            ):
                self.test_mod_decls.add(toks[k + 1].text)
            for m in range(i, last + 1):
                self.test[m] = True
            i = last + 1

    def functions(self):
        """(name, first line, last line) of each non-test fn with a body."""
        toks = self.toks
        out = []
        for i, t in enumerate(toks):
            if t.kind != "id" or t.text != "fn" or self.test[i]:
                continue
            if i + 1 >= len(toks) or toks[i + 1].kind != "id":
                continue  # `fn(u8) -> u8`, a pointer type
            depth = 0
            for j in range(i + 2, len(toks)):
                u = toks[j]
                if u.kind != "p":
                    continue
                if u.text in "([":
                    depth += 1
                elif u.text in ")]":
                    depth -= 1
                elif depth == 0 and u.text == ";":
                    break
                elif depth == 0 and u.text == "{":
                    end = match_close(toks, j)
                    out.append((toks[i + 1].text, t.line, toks[end].line))
                    break
        return out


# --------------------------------------------------------- module graph


class Module:
    """A module: a file, or an inline `mod x { }` inside one."""

    def __init__(self, path, src, file_mod):
        self.path = path  # tuple of names from the crate root
        self.src = src
        self.file_mod = file_mod if file_mod is not None else self  # the file's module
        self.children = {}  # name -> Module
        self.items = set()  # names defined here
        self.imports = {}  # name -> (segments, line) of module-level `use`
        self.globs = []  # segments of module-level `use x::*`


def parse_use_tree(toks, i, prefix, out):
    """Parse a use tree at toks[i]; append (segments, alias, glob, line);
    return the index after it."""
    segs = list(prefix)
    line = toks[i].line if i < len(toks) else 0
    if i < len(toks) and toks[i].text == "::":
        i += 1  # a leading `::`: an external crate
        segs.append("::")
    while i < len(toks):
        t = toks[i]
        if t.kind == "id" and t.text != "as":
            segs.append(t.text)
            i += 1
            if i < len(toks) and toks[i].text == "::":
                i += 1
                continue
            break
        if t.text == "{":
            i += 1
            while i < len(toks) and toks[i].text != "}":
                if toks[i].text == ",":
                    i += 1
                    continue
                i = parse_use_tree(toks, i, segs, out)
            return i + 1
        if t.text == "*":
            out.append((segs, None, True, line))
            return i + 1
        if t.text == "$":  # $crate
            i += 1
            continue
        break
    alias = segs[-1] if segs else None
    if i < len(toks) and toks[i].text == "as":
        alias = toks[i + 1].text
        i += 2
    if segs and segs[-1] == "self":
        segs = segs[:-1]
        if alias == "self":
            alias = segs[-1] if segs else None
    out.append((segs, alias, False, line))
    return i


class Crate:
    """The modules of one crate (one root file) and their references."""

    def __init__(self, name, root_src, sources_by_path):
        self.name = name
        self.by_path = sources_by_path
        self.modules = {}  # path tuple -> Module
        self.file_modules = []  # Modules that are files
        self.refs = []  # (from Module, segments, line, kind)
        self._load(root_src, (), None)

    def _child_file(self, src, mod_path, name):
        base = os.path.basename(src.path)
        d = os.path.dirname(src.path)
        if base not in ("mod.rs", "lib.rs", "main.rs") and src.path.endswith(".rs"):
            if mod_path:  # a non-root file module `a.rs`: children live in a/
                d = os.path.join(d, base[:-3])
        return d

    def _load(self, src, path, _parent):
        if src is None:
            return
        mod = Module(path, src, None)
        self.modules[path] = mod
        self.file_modules.append(mod)
        toks = src.toks
        # stack of (Module, brace depth of its body, directory of its children)
        base_dir = self._child_file(src, path, None)
        stack = [(mod, 0, base_dir)]
        depth = 0
        i = 0
        n = len(toks)
        while i < n:
            t = toks[i]
            cur, cur_depth, cur_dir = stack[-1]
            if t.kind == "p":
                if t.text == "{":
                    depth += 1
                elif t.text == "}":
                    depth -= 1
                    if len(stack) > 1 and depth < stack[-1][1]:
                        stack.pop()
                i += 1
                continue
            if t.kind != "id":
                i += 1
                continue
            at_item = depth == cur_depth
            word = t.text
            if src.test[i] or (src.doc_only[i] and word in ("use", "crate", "super", "self")):
                i += 1
                continue
            if at_item and word == "mod" and i + 2 < n and toks[i + 1].kind == "id":
                name = toks[i + 1].text
                nxt = toks[i + 2].text
                cur.items.add(name)
                if nxt == ";":
                    f1 = os.path.join(cur_dir, name + ".rs")
                    f2 = os.path.join(cur_dir, name, "mod.rs")
                    child_src = self.by_path.get(f1) or self.by_path.get(f2)
                    if i in src.path_attrs:  # relative to the declaring file
                        f3 = os.path.join(os.path.dirname(src.path), src.path_attrs[i])
                        child_src = self.by_path.get(os.path.normpath(f3))
                    if child_src is not None and (cur.path + (name,)) not in self.modules:
                        self._load(child_src, cur.path + (name,), cur)
                        cur.children[name] = self.modules[cur.path + (name,)]
                    i += 3
                    continue
                if nxt == "{":
                    inner = Module(cur.path + (name,), src, mod)
                    self.modules[inner.path] = inner
                    cur.children[name] = inner
                    depth += 1
                    stack.append((inner, depth, os.path.join(cur_dir, name)))
                    i += 3
                    continue
            if at_item and word in (
                "fn", "struct", "enum", "trait", "type", "const", "static", "union",
            ) and i + 1 < n and toks[i + 1].kind == "id":
                cur.items.add(toks[i + 1].text)
            if at_item and word == "macro_rules" and i + 2 < n and toks[i + 2].kind == "id":
                cur.items.add(toks[i + 2].text)
            if word == "use" and not (i > 0 and toks[i - 1].text in (".", "::")):
                trees = []
                j = parse_use_tree(toks, i + 1, [], trees)
                while j < n and toks[j].text != ";":
                    j += 1
                for segs, alias, glob, _line in trees:
                    if not segs:
                        continue
                    if at_item:
                        if glob:
                            cur.globs.append(segs)
                        elif alias and alias != "_":
                            cur.imports[alias] = (segs, t.line)
                        elif alias == "_":
                            pass
                    self.refs.append((cur, segs, t.line, "use"))
                i = j + 1
                continue
            if word in ("crate", "super", "self") and i + 2 < n and toks[i + 1].text == "::":
                if i > 0 and toks[i - 1].text == "::":
                    i += 1
                    continue
                segs = [word]
                j = i + 1
                while j + 1 < n and toks[j].text == "::" and toks[j + 1].kind == "id":
                    segs.append(toks[j + 1].text)
                    j += 2
                self.refs.append((cur, segs, t.line, "path"))
                i = j
                continue
            i += 1

    # ---- resolution

    def _start(self, mod, segs):
        """(module, remaining segments) a path starts from, or None."""
        if not segs:
            return None
        first = segs[0]
        if first == "crate":
            return self.modules[()], segs[1:]
        if first == "super" or first == "self":
            path = mod.path
            k = 0
            while k < len(segs) and segs[k] in ("super", "self"):
                if segs[k] == "super":
                    if not path:
                        return None
                    path = path[:-1]
                k += 1
            m = self.modules.get(path)
            return (m, segs[k:]) if m else None
        if first in mod.children:
            return mod, segs
        if first in mod.imports and mod.imports[first][0][0] != first:
            return mod, segs
        return None

    def resolve(self, mod, segs, seen=None):
        """('mod', Module) or ('item', Module) for a path used in `mod`."""
        seen = set() if seen is None else seen
        key = (mod.path, tuple(segs))
        if key in seen:
            return None
        seen.add(key)
        start = self._start(mod, segs)
        if start is None:
            return None
        cur, rest = start
        return self._walk(cur, list(rest), seen)

    def _walk(self, cur, rest, seen):
        for k, seg in enumerate(rest):
            if seg in cur.children:
                cur = cur.children[seg]
                continue
            if seg in cur.items:
                return ("item", cur)
            if seg in cur.imports:
                r = self.resolve(cur, cur.imports[seg][0], seen)
                if r is None:
                    return ("item", cur)
                if r[0] == "mod" and k + 1 < len(rest):
                    return self._walk(r[1], rest[k + 1 :], seen)
                return r
            for g in cur.globs:
                r = self.resolve(cur, list(g), seen)
                if r is not None and r[0] == "mod" and self._names(r[1], seg, set()):
                    return self._walk(r[1], rest[k:], seen)
            return ("item", cur)
        return ("mod", cur)

    def _names(self, mod, name, seen):
        """Whether `name` is a child, item or import of `mod` (or of a
        module it glob-imports)."""
        if mod.path in seen:
            return False
        seen.add(mod.path)
        if name in mod.children or name in mod.items or name in mod.imports:
            return True
        for g in mod.globs:
            r = self.resolve(mod, list(g))
            if r is not None and r[0] == "mod" and self._names(r[1], name, seen):
                return True
        return False

    def edges(self):
        """{(from file path, to file path): [(line, kind)]} for the graph."""
        out = {}
        for mod, segs, line, kind in self.refs:
            r = self.resolve(mod, segs)
            if r is None:
                continue
            a = mod.file_mod.path
            b = r[1].file_mod.path
            if a == b or a[: len(b)] == b or b[: len(a)] == a:
                continue
            out.setdefault((a, b), []).append((line, kind))
        return out


def sccs(nodes, succ):
    """Tarjan's strongly connected components (iterative)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(succ.get(root, ())))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(succ.get(w, ()))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(comp)
    return out


# ------------------------------------------------------------- the checks


def is_test_path(rel_in_crate):
    parts = rel_in_crate.replace(os.sep, "/").split("/")
    return any(p in ("tests", "benches") for p in parts[:-1]) or parts[-1] == "tests.rs"


def collect(root):
    """[(crate dir, [root files], {abs path: rel in crate})] to check."""
    groups = []
    crates = os.path.join(root, "crates")
    if os.path.isdir(crates):
        for c in sorted(os.listdir(crates)):
            src = os.path.join(crates, c, "src")
            if not os.path.isdir(src):
                continue
            files = []
            for d, _dirs, names in os.walk(src):
                for nm in sorted(names):
                    if nm.endswith(".rs"):
                        files.append(os.path.join(d, nm))
            roots = [os.path.join(src, r) for r in ("lib.rs", "main.rs")]
            bind = os.path.join(src, "bin")
            if os.path.isdir(bind):
                roots += [os.path.join(bind, f) for f in sorted(os.listdir(bind)) if f.endswith(".rs")]
            groups.append((os.path.join(crates, c), [r for r in roots if os.path.exists(r)], sorted(files)))
    fuzz = os.path.join(root, "fuzz", "fuzz_targets")
    if os.path.isdir(fuzz):
        files = sorted(os.path.join(fuzz, f) for f in os.listdir(fuzz) if f.endswith(".rs"))
        groups.append((os.path.join(root, "fuzz"), files, files))
    return groups


def check(root, out=None):
    """Run every check under `root`; return (violations, summary counts)."""
    violations = []
    n_files = n_fns = n_mods = 0
    for crate_dir, roots, files in collect(root):
        sources = {}
        for f in files:
            rel_crate = os.path.relpath(f, crate_dir)
            if is_test_path(rel_crate):
                continue
            with open(f, encoding="utf-8") as fh:
                text = fh.read()
            sources[f] = Source(f, os.path.relpath(f, root), text)
        # files declared by `#[cfg(test)] mod x;` or marked `#![cfg(test)]`
        test_files = set()
        for f, s in sources.items():
            if s.whole_file_test:
                test_files.add(f)
            for name in s.test_mod_decls:
                d = os.path.dirname(f)
                base = os.path.basename(f)
                if base not in ("mod.rs", "lib.rs", "main.rs"):
                    d = os.path.join(d, base[:-3])
                test_files.add(os.path.join(d, name + ".rs"))
                test_files.add(os.path.join(d, name, "mod.rs"))
        for f in test_files:
            sources.pop(f, None)
        for f, s in sorted(sources.items()):
            n_files += 1
            if s.lines > MAX_FILE_LINES:
                violations.append(
                    f"{s.rel}:{MAX_FILE_LINES + 1}: file is {s.lines} lines (at most {MAX_FILE_LINES})"
                )
            for name, first, last in s.functions():
                n_fns += 1
                length = last - first + 1
                if length > MAX_FN_LINES:
                    violations.append(
                        f"{s.rel}:{first}: fn `{name}` is {length} lines (at most {MAX_FN_LINES})"
                    )
        for r in roots:
            if r not in sources:
                continue
            crate = Crate(os.path.relpath(r, root), sources[r], sources)
            n_mods += len(crate.file_modules)
            file_of = {m.path: m.src.rel for m in crate.file_modules}
            edges = crate.edges()
            succ = {}
            for (a, b) in edges:
                succ.setdefault(a, []).append(b)
            for comp in sccs(sorted(file_of), succ):
                if len(comp) < 2:
                    continue
                members = set(comp)
                evidence = []
                for (a, b), where in sorted(edges.items()):
                    if a in members and b in members:
                        lines = ", ".join(f"{file_of[a]}:{ln}" for ln in sorted({ln for ln, _k in where}))
                        evidence.append((file_of[a], where[0][0], f"{file_of[a]} -> {file_of[b]} ({lines})"))
                evidence.sort()
                names = " <-> ".join(sorted(file_of[m] for m in comp))
                violations.append(
                    f"{evidence[0][0]}:{evidence[0][1]}: import circle {names}: "
                    + "; ".join(e[2] for e in evidence)
                )
    bench = os.path.join(root, "BENCHMARKS.md")
    if os.path.exists(bench):
        with open(bench, encoding="utf-8") as fh:
            n = sum(1 for _ in fh)
        if n > MAX_BENCHMARKS_LINES:
            violations.append(
                f"BENCHMARKS.md:{MAX_BENCHMARKS_LINES + 1}: {n} lines (at most {MAX_BENCHMARKS_LINES}; "
                "move history and detail to docs/benchmarks-history.md)"
            )
    return violations, (n_files, n_fns, n_mods)


def report(root):
    violations, (f, n, m) = check(root)
    for v in violations:
        print(v)
    print(f"house-rules: {f} files, {n} functions, {m} modules checked, {len(violations)} violations")
    return 1 if violations else 0


# --------------------------------------------------------------- self-test


def _write(root, rel, text):
    p = os.path.join(root, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w", encoding="utf-8") as fh:
        fh.write(text)


def _long_fn(name, body_lines, tricky=True):
    """A fn `body_lines + 2` lines long, with braces in strings/comments."""
    lines = [f"pub fn {name}() -> usize {{", "    let mut n = 0;"]
    tricks = [
        '    let _s = "}}}";',
        "    let _r = r#\"} \" }\"#;",
        "    let _b = b'}';",
        "    let _c = '{';",
        "    // }",
        "    /* } /* nested } */ } */",
        "    let _l: &'static str = \"{\";",
        "    let _e = \"\\\"}\";",
    ]
    k = 0
    while len(lines) < body_lines:
        if tricky and k < len(tricks):
            lines.append(tricks[k])
            k += 1
        else:
            lines.append("    n += 1;")
    lines.append("    n")
    lines.append("}")
    return "\n".join(lines) + "\n"


def self_test():
    failures = []

    def expect(cond, what):
        if not cond:
            failures.append(what)

    # the lexer on its own
    toks = lex("fn a() { let s = \"}\"; let c = '}'; /* { /* } */ */ 'a: loop {} r#\"}\"#; }")
    braces = [t.text for t in toks if t.text in "{}"]
    expect(braces == ["{", "{", "}", "}"], f"lexer braces: {braces}")
    expect(any(t.kind == "life" and t.text == "'a" for t in toks), "lexer: label 'a")

    with tempfile.TemporaryDirectory() as root:
        src = "crates/demo/src"
        _write(root, f"{src}/lib.rs", "//! demo\npub mod big;\npub mod fns;\npub mod config;\npub mod family;\nmod fine;\n#[cfg(test)]\nmod tests;\n")
        # a long file: 1,001 lines
        _write(root, f"{src}/big.rs", "//! big\n" + "pub const X: u8 = 0;\n" * 1000)
        # a file of exactly 1,000 lines: fine
        _write(root, f"{src}/fine.rs", "//! fine\n" + "// line\n" * 999)
        # functions: one 121 lines long (tricky), one 120 (fine), one nested
        # 121-line fn inside a short-enough outer?  No: outer grows too.
        fns = _long_fn("too_long", 119) + _long_fn("just_right", 118)
        fns += "pub struct S;\nimpl S {\n" + _long_fn("method_long", 119).replace("pub fn", "    pub fn") + "}\n"
        fns += "#[cfg(test)]\nmod tests {\n" + _long_fn("test_fn_long", 200) + "}\n"
        fns += "#[cfg(test)]\n" + _long_fn("test_helper_long", 200)
        fns += "pub fn ptr(f: fn(u8) -> u8) -> u8 { f(1) }\n"
        _write(root, f"{src}/fns.rs", fns)
        # a circle through a re-export: error.rs uses `super::Release`,
        # which config/mod.rs re-exports from release.rs; release.rs uses error.rs
        _write(root, f"{src}/config/mod.rs", "mod error;\nmod release;\npub use error::ConfigError;\npub use release::Release;\n")
        _write(root, f"{src}/config/error.rs", "use super::Release;\npub struct ConfigError(pub Release);\n")
        _write(root, f"{src}/config/release.rs", "/// x\npub enum Release { A }\npub fn f() -> Option<super::error::ConfigError> { None }\n")
        # a parent/child pair that is not a circle: family/mod.rs re-exports
        # its child, the child uses the parent's item
        _write(root, f"{src}/family/mod.rs", "mod kid;\npub use kid::Kid;\npub struct Parent;\n")
        _write(root, f"{src}/family/kid.rs", "use super::Parent;\npub struct Kid(pub Parent);\nfn g() -> crate::family::Parent { crate::family::Parent }\n")
        # a test module that is exempt, however long and circular
        _write(root, f"{src}/tests.rs", "use crate::config::Release;\n" + _long_fn("huge_test", 300) + "// x\n" * 1000)
        # a second crate: files under tests/ are exempt
        _write(root, "crates/other/src/lib.rs", "pub mod a;\npub mod b;\n")
        _write(root, "crates/other/src/a.rs", "#[cfg(test)]\nuse crate::b::B;\n#[cfg(doc)]\nuse crate::b::B as B2;\npub struct A;\n")
        _write(root, "crates/other/src/b.rs", "use crate::a::A;\npub struct B(pub A);\n")
        _write(root, "crates/other/tests/long.rs", _long_fn("t", 500))
        _write(root, "BENCHMARKS.md", "line\n" * 701)

        violations, (f, n, m) = check(root)
        text = "\n".join(violations)
        expect(any("big.rs:1001: file is 1001 lines" in v for v in violations), "long file not found")
        expect(not any("fine.rs" in v for v in violations), "1,000-line file flagged")
        expect(any("fn `too_long` is 121 lines" in v for v in violations), "121-line fn not found (braces in strings/comments?)")
        expect(any("fn `method_long` is 121 lines" in v for v in violations), "long method not found")
        expect(not any("just_right" in v for v in violations), "120-line fn flagged")
        expect(not any("test_fn_long" in v or "test_helper_long" in v or "huge_test" in v for v in violations), "test code not exempt")
        expect(not any("tests.rs" in v for v in violations), "tests.rs flagged")
        expect(not any("long.rs" in v for v in violations), "tests/ folder flagged")
        circles = [v for v in violations if "import circle" in v]
        expect(
            any("config/error.rs <-> " in v and "config/release.rs" in v for v in circles),
            "circle through a re-export not found",
        )
        expect(
            any("error.rs:1" in v and "release.rs:3" in v for v in circles),
            f"circle evidence lines wrong: {circles}",
        )
        expect(not any("family" in v for v in circles), "parent/child pair reported as a circle")
        expect(not any("other/src" in v for v in circles), "a #[cfg(test)] use made a circle")
        expect(len(circles) == 1, f"expected one circle, got {circles}")
        expect(any(v.startswith("BENCHMARKS.md:701") for v in violations), "BENCHMARKS.md cap not checked")
        expect(len(violations) == 5, f"expected 5 violations, got {len(violations)}:\n{text}")
        expect(f == 12, f"expected 12 files checked, got {f}")
        expect(m == 12, f"expected 12 modules, got {m}")
        expect(n == 6, f"expected 6 functions checked, got {n}")

    for what in failures:
        print(f"house-rules self-test: FAIL: {what}")
    if failures:
        return 1
    print("house-rules self-test: ok")
    return 0


def main(argv):
    if "--self-test" in argv:
        return self_test()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if "--root" in argv:
        root = argv[argv.index("--root") + 1]
    return report(root)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
