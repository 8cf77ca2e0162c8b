"""The layering of DESIGN.md ("Three layers"), checked on the sources and on the built libraries.

Imported by tests/python/test_architecture.py; also runnable as a script
(``python3 tests/python/archcheck.py [repo] [build]``) to print every violation.

What is checked (a failure always names ``file:line`` and, for reach rules, the include chain):

* **Transitive includes.** A file's layer is judged by everything it reaches through includes of
  project headers, quoted or angled, resolved the way the compiler resolves them (next to the file
  for quoted ones, then ``include/`` and ``src/``, the include roots of every CMake target). A
  computed ``#include MACRO`` is a violation (it cannot be judged).
* **Per-layer reach** (``ALLOWED``): core -> core; route -> core, route; semantic (tensor, ops) ->
  core, route, tensor(, ops), and from src/backend only the kernel table headers (kernel_table.h,
  kernels.h, args.h) and backend/common; the table headers themselves and backend/common stay free of backend
  implementation headers; backends never reach the semantic layer, io or the bindings; io -> core,
  io; bindings and examples -> public headers (include/lattice) only; public headers -> public
  headers and the standard library.
* **CUDA.** CUDA toolkit headers are reached only from src/backend/cuda; preprocessor
  conditionals on CUDA macros appear only under src/backend. Conditionals are read after line
  splicing (backslash continuations) and comment removal, and "CUDA macro" is closed under
  aliasing: a macro whose definition mentions a CUDA macro, or that is defined inside a CUDA
  conditional, or that CMake defines from / under ``LATTICE_HAS_CUDA``, is a CUDA macro too.
* **Backend names.** Outside src/backend nothing opens a ``backend`` namespace (no forward
  declarations of backend symbols), aliases one, or names ``backend::X`` where X is a backend
  sub-namespace (cpu, cuda, ...) or anything the kernel table headers do not declare.
* **The oracle.** tests/oracle imports numpy, the standard library and itself only (pytest in its
  test files), parsed with ``ast``; no dynamic imports.
* **Symbols** (needs a build folder). ``nm -C`` of liblattice_ops.a and liblattice_tensor.a: no
  undefined symbol is defined by a backend library (liblattice_backend_cpu.a,
  liblattice_backend_cuda.a) or belongs to the CUDA runtime/libraries, and every undefined
  ``lattice::backend::`` symbol is a kernel table entry point (a function of kernel_table.h defined
  in liblattice_backend.a). liblattice_io.a references nothing of route, tensor, ops or the
  backends; liblattice_tensor.a nothing of ops; the bindings' objects nothing of the backends.
"""
from __future__ import annotations

import ast
import functools
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Optional

SOURCE_SUFFIXES = {".h", ".hh", ".hpp", ".inl", ".ipp", ".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh"}
# Trees that hold C++/CUDA sources of the project.
SOURCE_TREES = ("include", "src", "python/bindings", "tests/cpp", "examples", "benchmarks")
# Include roots the scan resolves against (CMakeLists.txt gives each layer a view of these two).
INCLUDE_ROOTS = ("include", "src")
# Spellings that name a project header even when the file does not exist (judged by spelling).
PROJECT_PREFIXES = {"lattice": "include", "backend": "src", "ops": "src", "tensor": "src", "core": "src",
                    "route": "src", "io": "src"}

# C++20 standard library headers (and the C headers it keeps).
STD_HEADERS = set(
    """algorithm any array atomic barrier bit bitset charconv chrono codecvt compare complex concepts
    condition_variable coroutine deque exception execution expected filesystem format forward_list
    fstream functional future initializer_list iomanip ios iosfwd iostream istream iterator latch
    limits list locale map memory memory_resource mutex new numbers numeric optional ostream queue
    random ranges ratio regex scoped_allocator semaphore set shared_mutex source_location span
    sstream stack stdexcept stop_token streambuf string string_view syncstream system_error thread
    tuple type_traits typeindex typeinfo unordered_map unordered_set utility valarray variant vector
    version cassert cctype cerrno cfenv cfloat cinttypes climits clocale cmath csetjmp csignal
    cstdarg cstddef cstdint cstdio cstdlib cstring ctime cuchar cwchar cwctype""".split()
)
CUDA_HEADER = re.compile(
    r"^(cuda|cublas|cusparse|curand|cufft|cusolver|nvrtc|nvtx|nvToolsExt|cooperative_groups|mma\.h|"
    r"crt/|device_|sm_\d|vector_types|cub/|thrust/|cute/|cutlass/)")
BASE_CUDA_MACROS = {"LATTICE_HAS_CUDA", "LATTICE_BUILD_CUDA", "__CUDACC__", "__CUDA_ARCH__", "__NVCC__",
                    "__CUDACC_VER_MAJOR__", "__CUDA_ARCH_LIST__", "CUDART_VERSION", "CUDA_VERSION"}
CONDITIONALS = {"if", "ifdef", "ifndef", "elif", "elifdef", "elifndef"}
SEMANTIC_BACKEND_ALLOWED = ("backend/kernel_table.h", "backend/kernels.h", "backend/args.h")
TABLE = "table"  # owner of the three headers above

PUBLIC = {"core", "route", "tensor", "ops", "io", "umbrella"}
# What each layer may reach, transitively ("std": C++ standard headers; "external": other angled
# headers such as <omp.h>, <pybind11/...>; "cuda": CUDA toolkit headers). DESIGN.md, "Three
# layers": semantic -> core, route, backend *table*; route -> core vocabulary; backend -> core,
# shared index/geometry math. docs/architecture.md adds io (core only) and the bindings (the
# public `lattice` target). The vocabulary the backends share with the route layer (device
# capabilities, pool / point / algebra enums) lives in core (lattice/core/caps.h, vocab.h), so
# the backends reach no route header; CMakeLists.txt's per-layer include views enforce the same
# sets at compile time.
_SEMANTIC_BASE = {"core", "route", "tensor", TABLE, "backend/common", "std", "external"}
ALLOWED: dict[str, set[str]] = {
    "core": {"core", "std"},
    "route": {"core", "route", "std"},
    "tensor": set(_SEMANTIC_BASE),
    "ops": _SEMANTIC_BASE | {"ops"},
    TABLE: {"core", "route", TABLE, "backend/common", "std"},
    "backend/common": {"core", "backend/common", "std"},
    "backend/cpu": {"core", TABLE, "backend/common", "backend/cpu", "std", "external"},
    "backend/cuda": {"core", TABLE, "backend/common", "backend/cuda", "std", "external", "cuda"},
    # "backend": its own files, e.g. backend/kernel_registry.inc, generated into the build folder
    # from the kernel files' registrations (cmake/kernel_registry.cmake) and read by kernel_table.cpp
    "backend": {"core", "route", TABLE, "backend", "backend/common", "backend/cpu", "backend/cuda", "std",
                "external"},
    "io": {"core", "io", "std"},
    "bindings": PUBLIC | {"bindings", "std", "external"},
    "examples": PUBLIC | {"std", "external"},
    "runtime": PUBLIC | {"runtime", "std", "external"},  # src/runtime (issue 14): lattice::Runtime on the public API
    "umbrella": PUBLIC | {"std"},
}


# ---- reading sources ----------------------------------------------------------------------------


def source_files(root: Path, under: Iterable[str] = SOURCE_TREES) -> Iterator[Path]:
    for tree in under:
        base = root / tree
        if base.is_dir():
            yield from sorted(p for p in base.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file())


def rel(root: Path, path: Path) -> str:
    return Path(os.path.relpath(os.path.abspath(path), os.path.abspath(root))).as_posix()


def _splice(text: str) -> tuple[list[str], list[int]]:
    """Translation phase 2: a line ending in a backslash continues on the next one (trailing blanks
    after the backslash are tolerated, as GCC and Clang do). Returns the logical lines and the
    physical line number each one starts on."""
    lines, starts, buf, start = [], [], None, 1
    for n, line in enumerate(text.split("\n"), start=1):
        line = line.rstrip("\r")
        if buf is None:
            buf, start = "", n
        m = re.search(r"\\[ \t]*$", line)
        if m:
            buf += line[: m.start()]
            continue
        lines.append(buf + line)
        starts.append(start)
        buf = None
    if buf is not None:
        lines.append(buf)
        starts.append(start)
    return lines, starts


_TOKENS = re.compile(
    r"""(?P<line>//[^\n]*)"""
    r"""|(?P<block>/\*.*?(?:\*/|\Z))"""
    r"""|(?P<raw>(?<!\w)(?:u8|u|U|L)?R"(?P<delim>[^()\\\s]{0,16})\(.*?(?:\)(?P=delim)"|\Z))"""
    r"""|(?P<str>"(?:\\.|[^"\\\n])*"?)"""
    # not after a hex digit or _: 1'000'000 and 0xFF'FF are digit separators, not literals
    r"""|(?P<chr>(?<![0-9A-Fa-f_])'(?:\\.|[^'\\\n])*'?)""",
    re.S,
)


def _strip(text: str) -> tuple[str, str]:
    """Translation phase 3 on spliced text: comments become one blank (newlines inside block
    comments are kept). Returns (code, bare): ``code`` keeps literals, ``bare`` also blanks the
    contents of string and character literals (so names inside strings are not matched)."""
    code, bare, pos = [], [], 0
    for m in _TOKENS.finditer(text):
        kind = m.lastgroup if m.lastgroup != "delim" else "raw"
        plain = text[pos:m.start()]
        code.append(plain)
        bare.append(plain)
        tok = m.group(0)
        keep = "\n" * tok.count("\n")
        if kind in ("line", "block"):
            code.append(" " + keep)
            bare.append(" " + keep)
        else:
            code.append(tok)
            q = "'" if kind == "chr" else '"'
            bare.append(q + q + keep)
        pos = m.end()
    code.append(text[pos:])
    bare.append(text[pos:])
    return "".join(code), "".join(bare)


@dataclass(frozen=True)
class Directive:
    line: int  # physical line the directive starts on
    name: str  # include, if, define, ...
    arg: str  # the rest, spliced, comments removed
    text: str  # the spliced directive, for reports


@dataclass
class Source:
    rel: str
    starts: list[int]  # physical first line of each logical line
    code: str  # spliced, comments removed
    bare: str  # spliced, comments and literal contents removed
    directives: list[Directive] = field(default_factory=list)

    def line_of(self, offset: int) -> int:
        return self.starts[min(self.bare.count("\n", 0, offset), len(self.starts) - 1)]


@functools.lru_cache(maxsize=8192)
def _parse(text: str) -> tuple[tuple[int, ...], str, str, tuple[Directive, ...]]:
    """Splices, strips and finds the directives of one file's text (cached by content, so the
    injection tests re-read only the files they changed)."""
    lines, starts = _splice(text)
    code, bare = _strip("\n".join(lines))
    directives = []
    for idx, line in enumerate(code.split("\n")):
        m = re.match(r"\s*#\s*([A-Za-z_]\w*)\s*(.*)$", line)
        if m:
            directives.append(Directive(starts[idx], m.group(1), m.group(2).strip(), line.strip()))
    return tuple(starts), code, bare, tuple(directives)


def read_source(root: Path, path: Path) -> Source:
    starts, code, bare, directives = _parse(path.read_text(errors="replace"))
    return Source(rel(root, path), list(starts), code, bare, list(directives))


class Tree:
    """The parsed C++/CUDA sources of one repository root (parsed once, shared by all rules)."""

    def __init__(self, root: Path):
        self.root = root
        self.sources: dict[str, Source] = {}
        for p in source_files(root):
            s = read_source(root, p)
            self.sources[s.rel] = s
        self._edges: dict[str, list[Edge]] = {}

    def get(self, relpath: str) -> Optional[Source]:
        if relpath not in self.sources:
            p = self.root / relpath
            if not p.is_file():
                return None
            self.sources[relpath] = read_source(self.root, p)
        return self.sources[relpath]

    def under(self, *prefixes: str) -> list[Source]:
        return [s for r, s in sorted(self.sources.items()) if r.startswith(prefixes)]

    def edges(self, relpath: str) -> list["Edge"]:
        if relpath not in self._edges:
            src = self.get(relpath)
            self._edges[relpath] = [] if src is None else [e for d in src.directives if (e := self._edge(src, d))]
        return self._edges[relpath]

    def _edge(self, src: Source, d: Directive) -> Optional["Edge"]:
        if d.name not in ("include", "include_next", "import"):
            return None
        m = re.match(r'([<"])([^>"]+)[>"]', d.arg)
        if not m:
            return Edge(src.rel, d.line, d.arg, None, "computed")
        angled, target = m.group(1) == "<", m.group(2).strip()
        bases = ([] if angled else [Path(src.rel).parent.as_posix()]) + list(INCLUDE_ROOTS)
        for base in bases:
            cand = os.path.normpath(os.path.join(base, target)).replace(os.sep, "/")
            if not cand.startswith("../") and (self.root / cand).is_file():
                return Edge(src.rel, d.line, target, cand, owner_of(cand))
        first = target.split("/")[0]
        if CUDA_HEADER.match(target):
            return Edge(src.rel, d.line, target, None, "cuda")
        if target in STD_HEADERS:
            return Edge(src.rel, d.line, target, None, "std")
        if first in PROJECT_PREFIXES and "/" in target:  # a project header that does not exist
            return Edge(src.rel, d.line, target, None, owner_of(PROJECT_PREFIXES[first] + "/" + target))
        return Edge(src.rel, d.line, target, None, "external")

    def reach(self, relpath: str) -> dict[str, list["Edge"]]:
        """Every header reached from ``relpath`` -> the include chain (first one found, breadth
        first, so the shortest). Keys are repository paths, or ``<target>`` for headers outside
        the tree."""
        seen: dict[str, list[Edge]] = {}
        frontier = [(relpath, [])]
        visited = {relpath}
        while frontier:
            nxt = []
            for node, chain in frontier:
                for e in self.edges(node):
                    key = e.resolved or f"<{e.target}>"
                    if key in seen or key == relpath:
                        continue
                    seen[key] = chain + [e]
                    if e.resolved and e.resolved not in visited:
                        visited.add(e.resolved)
                        nxt.append((e.resolved, chain + [e]))
            frontier = nxt
        return seen


@dataclass(frozen=True)
class Edge:
    """One include directive: where it is, what it names, what it resolved to."""

    file: str
    line: int
    target: str
    resolved: Optional[str]  # repository path when it is a file of the tree
    owner: str  # see owner_of; or std / external / cuda / computed


def owner_of(path: str) -> str:
    """The layer of a repository-relative path: core, route, tensor, ops, io, umbrella (public
    headers / src folders), table (kernel_table.h, kernels.h, args.h), backend/common, backend/cpu,
    backend/cuda, backend (kernel_table.cpp, other files directly in src/backend), bindings,
    examples, or other."""
    parts = path.split("/")
    if parts[:2] == ["include", "lattice"]:
        return parts[2] if len(parts) > 3 else "umbrella"
    if parts[0] == "src" and len(parts) > 2:
        if parts[1] == "backend":
            if "/".join(parts[1:]) in SEMANTIC_BACKEND_ALLOWED:
                return TABLE
            return "backend/" + parts[2] if len(parts) > 3 else "backend"
        return parts[1]
    if parts[:2] == ["python", "bindings"]:
        return "bindings"
    if parts[0] == "examples":
        return "examples"
    return "other"


def _chain(src: str, chain: list[Edge]) -> str:
    return " -> ".join([src] + [e.resolved or f"<{e.target}>" for e in chain])


# ---- include rules ------------------------------------------------------------------------------


def computed_include_violations(tree: Tree) -> list[str]:
    """An ``#include`` whose operand is a macro cannot be judged, so it is not allowed."""
    return [f"{e.file}:{e.line}: computed #include {e.target}" for r in sorted(tree.sources)
            for e in tree.edges(r) if e.owner == "computed" and owner_of(r) != "other"]


def layer_violations(tree: Tree) -> list[str]:
    """Every file of a layer reaches (transitively) only what ``ALLOWED`` lists for its layer;
    public headers additionally only public headers and std. A source under src/ or include/ that
    belongs to no known layer (a new folder, a file directly in src/) is a violation itself, so a
    file cannot escape the rules by living somewhere new."""
    out = []
    for r in sorted(tree.sources):
        layer = owner_of(r)
        if r.startswith(("src/", "include/")) and layer not in ALLOWED:
            out.append(f"{r}:1: belongs to no layer of DESIGN.md ({layer}); known: {', '.join(sorted(ALLOWED))}")
            continue
        rules = []
        if layer in ALLOWED:
            rules.append((layer, ALLOWED[layer]))
        if r.startswith("include/"):
            rules.append(("public header", PUBLIC | {"std"}))
        for name, allowed in rules:
            for key, chain in tree.reach(r).items():
                owner = chain[-1].owner
                if owner == "computed" or owner in allowed:
                    continue
                out.append(f"{r}:{chain[0].line}: {name} file reaches {key} ({owner}): {_chain(r, chain)}")
    return out


def cuda_header_violations(tree: Tree) -> list[str]:
    """CUDA toolkit headers are reached (directly or through project headers) only from
    src/backend/cuda."""
    out = []
    for r in sorted(tree.sources):
        if r.startswith("src/backend/cuda/"):
            continue
        for key, chain in tree.reach(r).items():
            if chain[-1].owner == "cuda":
                out.append(f"{r}:{chain[0].line}: reaches CUDA header {key}: {_chain(r, chain)}")
    return out


# ---- CUDA conditionals --------------------------------------------------------------------------

_IDENT = re.compile(r"[A-Za-z_]\w*")


def _mentions(cond: str, macros: set[str]) -> bool:
    if any(t in macros for t in _IDENT.findall(cond)):
        return True
    # __has_include(<cuda_runtime.h>) and friends
    return any(CUDA_HEADER.match(h.strip()) for h in re.findall(r"__has_include(?:_next)?\s*\(\s*[<\"]([^>\"]+)", cond))


def cmake_cuda_macros(root: Path) -> set[str]:
    """Macros CMake defines from a CUDA setting or inside ``if(...CUDA...)``."""
    out: set[str] = set()
    files = [root / "CMakeLists.txt", *sorted((root / "cmake").glob("*.cmake"))] if (root / "cmake").is_dir() \
        else [root / "CMakeLists.txt"]
    for f in files:
        if not f.is_file():
            continue
        text = re.sub(r"#[^\n]*", "", f.read_text(errors="replace"))
        stack: list[str] = []
        for m in re.finditer(r"\b(if|elseif|else|endif|target_compile_definitions|add_compile_definitions|"
                             r"add_definitions)\s*\(((?:[^()]|\([^()]*\))*)\)", text, flags=re.I):
            word, args = m.group(1).lower(), m.group(2)
            if word == "if":
                stack.append(args)
            elif word == "elseif" and stack:
                stack[-1] += " " + args
            elif word == "endif" and stack:
                stack.pop()
            elif word not in ("else",):
                under_cuda = any("CUDA" in s for s in stack)
                if word == "target_compile_definitions":
                    args = args.split(None, 1)[1] if len(args.split(None, 1)) > 1 else ""  # drop the target
                for tok in re.findall(r"(?:-D)?([A-Za-z_]\w*)(=\S*)?", args):
                    name, value = tok
                    if name in ("PRIVATE", "PUBLIC", "INTERFACE"):
                        continue
                    if under_cuda or "CUDA" in value:
                        out.add(name)
    return out


def cuda_macros(tree: Tree) -> set[str]:
    """The CUDA macros: the base set, CMake's, and the closure under aliasing over every source
    (``#define X ...CUDA macro...`` or a ``#define`` inside a CUDA conditional)."""
    defines: list[tuple[str, str, list[str]]] = []  # (name, body, enclosing conditions)
    for src in tree.sources.values():
        stack: list[str] = []
        for d in src.directives:
            if d.name in ("if", "ifdef", "ifndef"):
                stack.append(d.arg)
            elif d.name in ("elif", "elifdef", "elifndef") and stack:
                stack[-1] += " " + d.arg
            elif d.name == "endif" and stack:
                stack.pop()
            elif d.name == "define":
                m = re.match(r"([A-Za-z_]\w*)(\([^)]*\))?\s*(.*)$", d.arg)
                if m:
                    defines.append((m.group(1), m.group(3), list(stack)))
    macros = set(BASE_CUDA_MACROS) | cmake_cuda_macros(tree.root)
    changed = True
    while changed:
        changed = False
        for name, body, stack in defines:
            if name not in macros and (_mentions(body, macros) or any(_mentions(c, macros) for c in stack)):
                macros.add(name)
                changed = True
    return macros


def cuda_conditional_violations(tree: Tree) -> list[str]:
    """Preprocessor conditionals on CUDA macros (after splicing, comments removed, aliases
    followed) appear only under src/backend (and CMake)."""
    macros = cuda_macros(tree)
    out = []
    for r, src in sorted(tree.sources.items()):
        if r.startswith("src/backend/"):
            continue
        for d in src.directives:
            if d.name in CONDITIONALS and _mentions(d.arg, macros):
                names = sorted(set(_IDENT.findall(d.arg)) & macros) or ["__has_include(<cuda...>)"]
                out.append(f"{r}:{d.line}: #{d.name} {d.arg}  (CUDA macro: {', '.join(names)})")
    return out


# ---- backend names outside src/backend ----------------------------------------------------------

NON_BACKEND_TREES = ("include/", "src/core/", "src/route/", "src/tensor/", "src/ops/", "src/io/", "python/bindings/",
                     "examples/")


def backend_subnamespaces(tree: Tree) -> set[str]:
    """Namespaces nested in lattice::backend by src/backend (cpu, cuda, ...)."""
    out = {"cpu", "cuda"}
    for src in tree.under("src/backend/"):
        for m in re.finditer(r"\bnamespace\s+lattice\s*::\s*backend\s*::\s*(\w+)", src.bare):
            out.add(m.group(1))
        for m in re.finditer(r"\bnamespace\s+backend\s*\{\s*namespace\s+(\w+)", src.bare):
            out.add(m.group(1))
    return out


def table_names(tree: Tree) -> set[str]:
    """Identifiers the kernel table headers (kernel_table.h, kernels.h, args.h) declare or use."""
    names: set[str] = set()
    for h in SEMANTIC_BACKEND_ALLOWED:
        src = tree.get("src/" + h)
        if src is not None:
            names |= set(_IDENT.findall(src.bare))
    return names


def backend_name_violations(tree: Tree) -> list[str]:
    """Outside src/backend: no ``namespace ...backend`` block or declaration (a forward
    declaration of a backend function), no alias of a backend namespace, no ``using namespace``
    of a backend sub-namespace, and ``backend::X`` only for X declared by the kernel table headers
    and not a backend sub-namespace (``backend::cpu::conv_reference`` is a direct call)."""
    subns = backend_subnamespaces(tree)
    allowed = table_names(tree) - subns
    out = []
    for src in tree.under(*NON_BACKEND_TREES):
        b = src.bare
        for m in re.finditer(r"\bnamespace\s+(?:(?:inline\s+)?\w+\s*::\s*)*(?:inline\s+)?backend\b[\w:\s]*", b):
            out.append(f"{src.rel}:{src.line_of(m.start())}: opens namespace {m.group(0)[10:].strip()} "
                       "outside src/backend (declares backend symbols)")
        for m in re.finditer(r"\bnamespace\s+\w+\s*=\s*[\w:\s]*\bbackend\b[\w:]*", b):
            out.append(f"{src.rel}:{src.line_of(m.start())}: aliases a backend namespace: {' '.join(m.group(0).split())}")
        for m in re.finditer(r"\bbackend\s*::\s*(\w+)", b):
            name = m.group(1)
            if name in subns or name not in allowed:
                out.append(f"{src.rel}:{src.line_of(m.start())}: names backend::{name}, which is not in "
                           "kernel_table.h/kernels.h/args.h")
        for m in re.finditer(r"(?<![\w:])\s*(" + "|".join(sorted(subns)) + r")\s*::\s*\w+", b):
            # cpu::x / cuda::x reached through `using namespace lattice::backend`
            if re.search(r"\busing\s+namespace\s+(?:lattice\s*::\s*)?backend\b|\bnamespace\s+backend\b", b):
                out.append(f"{src.rel}:{src.line_of(m.start())}: names {' '.join(m.group(0).split())} "
                           "(a backend sub-namespace)")
    return out


# ---- the oracle ---------------------------------------------------------------------------------

ORACLE_THIRD_PARTY = {"numpy"}
ORACLE_TEST_EXTRA = {"pytest"}  # test_*.py files of tests/oracle only
DYNAMIC_IMPORT = {"__import__", "import_module", "importlib", "exec", "eval", "compile", "runpy", "ctypes",
                  "imp", "zipimport", "pkgutil", "subprocess"}


def oracle_import_violations(root: Path) -> list[str]:
    """tests/oracle imports numpy, the standard library and its own modules (relative, or as
    ``oracle``); its test files may import pytest; nothing imports dynamically."""
    out = []
    for f in sorted((root / "tests" / "oracle").rglob("*.py")):
        r = rel(root, f)
        is_test = f.name.startswith("test_") or f.name == "conftest.py"
        out += [f"{r}:{line}: {what}" for line, what in _oracle_file(f.read_text(errors="replace"), r, is_test)]
    return out


@functools.lru_cache(maxsize=1024)
def _oracle_file(text: str, r: str, is_test: bool) -> tuple[tuple[int, str], ...]:
    stdlib = set(sys.stdlib_module_names) - DYNAMIC_IMPORT
    allowed = stdlib | ORACLE_THIRD_PARTY | {"oracle"} | (ORACLE_TEST_EXTRA if is_test else set())
    try:
        mod = ast.parse(text, filename=r)
    except SyntaxError as e:
        return ((e.lineno or 1, f"does not parse: {e.msg}"),)
    out = []
    for node in ast.walk(mod):
        if isinstance(node, ast.Import):
            out += [(node.lineno, f"import {a.name}") for a in node.names if a.name.split(".")[0] not in allowed]
        elif isinstance(node, ast.ImportFrom):
            if node.level > 1:
                out.append((node.lineno, f"from {'.' * node.level}{node.module or ''} import ... (leaves tests/oracle)"))
            elif node.level == 0 and (node.module or "").split(".")[0] not in allowed:
                out.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Name) and node.id in DYNAMIC_IMPORT:
            out.append((node.lineno, f"uses {node.id} (dynamic import/execution)"))
        elif isinstance(node, ast.Attribute) and node.attr in ("import_module", "__import__"):
            out.append((node.lineno, f"uses .{node.attr} (dynamic import)"))
    return tuple(out)


# ---- all source rules ---------------------------------------------------------------------------


def source_violations(root: Path) -> dict[str, list[str]]:
    """Every source rule on ``root`` -> its violations."""
    tree = Tree(root)
    return {
        "computed includes": computed_include_violations(tree),
        "layer reach (transitive includes)": layer_violations(tree),
        "CUDA headers only in src/backend/cuda": cuda_header_violations(tree),
        "CUDA conditionals only in src/backend": cuda_conditional_violations(tree),
        "backend names outside src/backend": backend_name_violations(tree),
        "oracle imports numpy and the standard library only": oracle_import_violations(root),
    }


# ---- symbols of the built libraries -------------------------------------------------------------

STRONG = set("TDBRGS")  # strong definitions (W/V/u are weak/unique: inline functions, templates)
CUDA_SYMBOL = re.compile(r"^(cuda|cublas|cusparse|curand|cufft|cusolver|nvrtc|__cuda|__nv|cub::|thrust::)")
_NM_LINE = re.compile(r"^(?P<lib>[^:]+):(?P<obj>[^:]+):\s*(?:[0-9a-fA-F]+\s+)?(?P<type>\S)\s+(?P<name>.+)$")
_SPECIAL = re.compile(r"^(?:vtable|typeinfo|typeinfo name|VTT|construction vtable|guard variable|"
                      r"reference temporary #\d+|TLS init function|TLS wrapper function|"
                      r"non-virtual thunk to|virtual thunk to) for ")


@dataclass(frozen=True)
class Symbol:
    lib: str
    obj: str
    type: str
    name: str  # demangled


def nm(lib: Path, defined: bool) -> list[Symbol]:
    tool = shutil.which("nm")
    if tool is None:
        raise RuntimeError("nm (binutils) is not on PATH; the symbol check needs it")
    flag = "--defined-only" if defined else "--undefined-only"
    res = subprocess.run([tool, "-C", "-A", flag, str(lib)], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"nm {flag} {lib} failed: {res.stderr.strip()}")
    out = []
    for line in res.stdout.splitlines():
        m = _NM_LINE.match(line)
        if m:
            out.append(Symbol(Path(m["lib"]).name, m["obj"], m["type"], m["name"].strip()))
    return out


def strong_defs(lib: Path) -> set[str]:
    return {s.name for s in nm(lib, True) if s.type in STRONG} if lib.is_file() else set()


def _qualified(name: str) -> str:
    return _SPECIAL.sub("", name)


def _base_name(name: str) -> str:
    """``lattice::backend::find_conv_kernels(lattice::RouteId)`` -> ``find_conv_kernels``."""
    head = _qualified(name).split("(")[0]
    return head.split("::")[-1]


SEMANTIC_LIBS = ("liblattice_ops.a", "liblattice_tensor.a")
BACKEND_LIBS = ("liblattice_backend_cpu.a", "liblattice_backend_cuda.a")  # cuda: when built
TABLE_LIB = "liblattice_backend.a"
REQUIRED_LIBS = SEMANTIC_LIBS + ("liblattice_backend_cpu.a", TABLE_LIB, "liblattice_io.a", "liblattice_core.a",
                                 "liblattice_route.a")


def symbol_violations(build: Path, kernel_table_h: Path) -> list[str]:
    """The rules on the static libraries of ``build`` (see the module docstring)."""
    missing = [lib for lib in REQUIRED_LIBS if not (build / lib).is_file()]
    if missing:
        return [f"{build}: missing {', '.join(missing)} (build the tree first: make build)"]
    backend = set().union(*(strong_defs(build / lib) for lib in BACKEND_LIBS))
    header_ids = set(_IDENT.findall(_strip("\n".join(_splice(kernel_table_h.read_text())[0]))[1]))
    entry = {n for n in strong_defs(build / TABLE_LIB)
             if n.startswith("lattice::backend::") and _base_name(n) in header_ids}
    if not backend or not entry:
        return [f"{build}: found no backend definitions ({len(backend)}) or kernel table entry points "
                f"({len(entry)}); the libraries are not what this check expects"]
    route = strong_defs(build / "liblattice_route.a")
    tensor = strong_defs(build / "liblattice_tensor.a")
    ops = strong_defs(build / "liblattice_ops.a")
    table_all = strong_defs(build / TABLE_LIB)

    out = []

    def judge(sym: Symbol, why: Optional[str]) -> None:
        if why:
            out.append(f"{build.name}/{sym.lib}({sym.obj}): references {sym.name}: {why}")

    for lib in SEMANTIC_LIBS:
        for s in nm(build / lib, False):
            q = _qualified(s.name)
            if s.name in backend:
                judge(s, "defined by a backend library (call it through the kernel table)")
            elif CUDA_SYMBOL.match(q):
                judge(s, "a CUDA runtime/library symbol (only src/backend/cuda calls CUDA)")
            elif q.startswith("lattice::backend::") and s.name not in entry:
                judge(s, "a backend symbol that is not a kernel table entry point")
            elif lib == "liblattice_tensor.a" and s.name in ops:
                judge(s, "defined by liblattice_ops.a (the tensor layer sits below ops)")
    for s in nm(build / "liblattice_io.a", False):
        if s.name in backend | table_all | route | tensor | ops or _qualified(s.name).startswith("lattice::backend::"):
            judge(s, "io depends on core only")
    for obj in sorted((build / "CMakeFiles" / "_lattice.dir").rglob("*.o")) if (build / "CMakeFiles").is_dir() else []:
        for s in _nm_object(obj):
            if s.name in backend | table_all or _qualified(s.name).startswith("lattice::backend::"):
                judge(s, "the bindings use the public lattice API only")
    return out


def _nm_object(obj: Path) -> list[Symbol]:
    tool = shutil.which("nm")
    res = subprocess.run([tool or "nm", "-C", "--undefined-only", str(obj)], capture_output=True, text=True)
    out = []
    for line in res.stdout.splitlines():
        m = re.match(r"^\s*(\S)\s+(.+)$", line)
        if m:
            out.append(Symbol("_lattice", obj.name, m.group(1), m.group(2).strip()))
    return out


def build_dir(repo: Path) -> Path:
    env = os.environ.get("LATTICE_BUILD_DIR")
    return Path(env) if env else repo / "build"


def main(argv: list[str]) -> int:
    repo = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[2]
    build = Path(argv[2]) if len(argv) > 2 else build_dir(repo)
    bad = 0
    for rule, found in source_violations(repo).items():
        print(f"{rule}: {len(found)}")
        for v in found:
            print("  " + v)
        bad += len(found)
    if build.is_dir():
        found = symbol_violations(build, repo / "src" / "backend" / "kernel_table.h")
        print(f"symbols ({build}): {len(found)}")
        for v in found:
            print("  " + v)
        bad += len(found)
    else:
        print(f"symbols: no build folder at {build}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
