"""The dependency direction of DESIGN.md, checked on the source tree (no build needed).

Layers: core <- route <- backend (kernels) ; core, route, backend *table* <- semantic (tensor, ops).
Each rule scans ``#include`` lines (or preprocessor conditionals, or file headers) and a failure
lists every offending ``file:line``. The checks are plain functions of a source root, so the last
tests run them on a small fake tree with known violations to show that they catch them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]

SOURCE_SUFFIXES = {".h", ".hh", ".hpp", ".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh"}
# Trees that hold C++/CUDA sources of the project (CMake files are allowed CUDA conditionals).
SOURCE_TREES = ("include", "src", "python/bindings", "tests/cpp", "examples", "benchmarks")
# Quoted includes are looked up next to the file, then in the two include roots of every target.
INCLUDE_ROOTS = ("include", "src")

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
CUDA_HEADER = re.compile(r"^(cuda|cublas|cusparse|curand|cufft|nvrtc|nvtx|cooperative_groups|mma\.h|cub/|thrust/|cute/|cutlass/)")
CUDA_MACROS = re.compile(r"\b(LATTICE_HAS_CUDA|LATTICE_BUILD_CUDA|__CUDACC__|__CUDA_ARCH__|__NVCC__)\b")
CONDITIONAL = re.compile(r"^\s*#\s*(if|ifdef|ifndef|elif|elifdef|elifndef)\b(.*)$")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
SEMANTIC_BACKEND_ALLOWED = ("backend/kernel_table.h", "backend/args.h")


@dataclass(frozen=True)
class Include:
    """One ``#include`` line: where it is and what it names."""

    file: str  # repository-relative, posix
    line: int
    target: str
    angled: bool
    owner: str  # see ``owner_of``

    def __str__(self) -> str:
        quote = "<>" if self.angled else '""'
        return f"{self.file}:{self.line}: #include {quote[0]}{self.target}{quote[1]}  ({self.owner})"


def source_files(root: Path, under: Iterable[str] = SOURCE_TREES) -> Iterator[Path]:
    for tree in under:
        base = root / tree
        if base.is_dir():
            yield from sorted(p for p in base.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file())


def _rel(root: Path, path: Path) -> str:
    return path.resolve().relative_to(root.resolve()).as_posix()


def owner_of(path: str) -> str:
    """The layer a repository-relative header belongs to.

    ``core``/``route``/``tensor``/``ops`` (public header or src folder), ``backend/kernel_table.h``,
    ``backend/args.h``, ``backend/common``, ``backend/cpu``, ``backend/cuda``, ``backend`` (other),
    ``bindings``, or ``other``.
    """
    parts = path.split("/")
    if parts[:2] == ["include", "lattice"]:
        return parts[2] if len(parts) > 3 else "umbrella"
    if parts[0] == "src" and len(parts) > 1:
        if parts[1] == "backend":
            rest = "/".join(parts[1:])
            if rest in SEMANTIC_BACKEND_ALLOWED:
                return rest
            return "backend/" + parts[2] if len(parts) > 3 else "backend"
        return parts[1]
    if parts[:2] == ["python", "bindings"]:
        return "bindings"
    return "other"


def includes(root: Path, file: Path) -> list[Include]:
    """The ``#include`` lines of ``file`` with their targets resolved to a layer."""
    out = []
    rel = _rel(root, file)
    for n, text in enumerate(file.read_text(errors="replace").splitlines(), start=1):
        m = INCLUDE.match(text)
        if not m:
            continue
        angled, target = m.group(1) == "<", m.group(2).strip()
        if angled:
            owner = "std" if target in STD_HEADERS else ("cuda" if CUDA_HEADER.match(target) else "external")
        else:
            owner = ""
            for base in (file.parent, *(root / r for r in INCLUDE_ROOTS)):
                cand = base / target
                if cand.is_file():
                    owner = owner_of(_rel(root, cand))
                    break
            if not owner:  # not found: judge by the spelling
                first = target.split("/")[0]
                if first == "lattice":
                    owner = owner_of("include/" + target)
                elif first in ("core", "route", "tensor", "ops", "io", "backend"):
                    owner = owner_of("src/" + target)
                else:
                    owner = "other"
        out.append(Include(rel, n, target, angled, owner))
    return out


def _violations(root: Path, trees: Iterable[str], ok: Callable[[Include], bool]) -> list[str]:
    return [str(inc) for f in source_files(root, trees) for inc in includes(root, f) if not ok(inc)]


# ---- the rules ----------------------------------------------------------------------------------


def route_layer_violations(root: Path) -> list[str]:
    """src/route and include/lattice/route include only core and route headers (and std)."""
    return _violations(root, ("src/route", "include/lattice/route"), lambda i: i.owner in ("core", "route", "std"))


def core_layer_violations(root: Path) -> list[str]:
    """src/core and include/lattice/core include only core headers (and std)."""
    return _violations(root, ("src/core", "include/lattice/core"), lambda i: i.owner in ("core", "std"))


def backend_violations(root: Path) -> list[str]:
    """src/backend never includes the semantic layer (lattice/ops, lattice/tensor, src/ops, src/tensor)."""
    return _violations(root, ("src/backend",), lambda i: i.owner not in ("ops", "tensor"))


def semantic_violations(root: Path) -> list[str]:
    """src/ops and src/tensor reach the backend only through kernel_table.h, args.h and common/."""

    def ok(i: Include) -> bool:
        if not i.owner.startswith("backend"):
            return i.owner != "cuda"
        return i.owner in SEMANTIC_BACKEND_ALLOWED or i.owner == "backend/common"

    return _violations(root, ("src/ops", "src/tensor"), ok)


def public_header_violations(root: Path) -> list[str]:
    """include/lattice headers include only public lattice headers and std (they get installed)."""
    public = ("core", "route", "tensor", "ops", "io", "umbrella", "std")
    return _violations(root, ("include",), lambda i: i.owner in public)


def cuda_header_violations(root: Path) -> list[str]:
    """CUDA toolkit headers appear only under src/backend/cuda."""
    return [
        str(i) for f in source_files(root) for i in includes(root, f)
        if i.owner == "cuda" and not i.file.startswith("src/backend/cuda/")
    ]


def cuda_conditional_violations(root: Path) -> list[str]:
    """Preprocessor conditionals on CUDA macros appear only under src/backend (and CMake)."""
    out = []
    for f in source_files(root):
        rel = _rel(root, f)
        if rel.startswith("src/backend/"):
            continue
        for n, text in enumerate(f.read_text(errors="replace").splitlines(), start=1):
            m = CONDITIONAL.match(text)
            if m and CUDA_MACROS.search(m.group(2)):
                out.append(f"{rel}:{n}: {text.strip()}")
    return out


def route_files(root: Path) -> list[Path]:
    """Route implementations: sources in the op folders of src/backend/cpu and src/backend/cuda
    (runtime/ and common/ hold shared support code, not routes)."""
    files = []
    for backend in ("cpu", "cuda"):
        base = root / "src" / "backend" / backend
        if not base.is_dir():
            continue
        for op_dir in sorted(d for d in base.iterdir() if d.is_dir() and d.name not in ("runtime", "common")):
            files += sorted(p for p in op_dir.rglob("*") if p.suffix in {".cpp", ".cc", ".cu"})
    return files


def constraints_violations(root: Path) -> list[str]:
    """Every route file opens with a ``Constraints:`` comment (what its admit() checks)."""
    out = []
    for f in route_files(root):
        lines = f.read_text(errors="replace").splitlines()
        first = next(((n, t) for n, t in enumerate(lines, start=1) if t.strip()), (1, "<empty file>"))
        if not re.match(r"^\s*(//|/\*)\s*Constraints:", first[1]):
            out.append(f"{_rel(root, f)}:{first[0]}: first line is {first[1].strip()!r}, expected '// Constraints: ...'")
    return out


def route_id_file_violations(root: Path) -> list[str]:
    """Each RouteId names its implementation file in a comment, and that file exists."""
    header = root / "include" / "lattice" / "route" / "route.h"
    out = []
    lines = header.read_text().splitlines()
    start = next(n for n, t in enumerate(lines) if re.match(r"\s*enum class RouteId\b", t))
    for n in range(start + 1, len(lines)):
        text = lines[n]
        if text.strip().startswith("}"):
            break
        m = re.match(r"\s*(\w+)\s*(?:=\s*\w+\s*)?,?\s*(?://\s*(\S+))?", text)
        if not m or not m.group(1):
            continue
        path = m.group(2)
        where = f"{_rel(root, header)}:{n + 1}: RouteId::{m.group(1)}"
        if not path:
            out.append(f"{where} names no implementation file (expected '// src/backend/...')")
        elif not (root / path).is_file():
            out.append(f"{where} names {path}, which does not exist")
    return out


def binding_name_violations(root: Path) -> list[str]:
    """python/bindings holds module.cpp and one bind_<family>.cpp per op family defining bind_<family>()."""
    out = []
    base = root / "python" / "bindings"
    for f in sorted(base.glob("*.cpp")):
        if f.name == "module.cpp":
            continue
        m = re.fullmatch(r"bind_([a-z][a-z0-9_]*)\.cpp", f.name)
        if not m:
            out.append(f"{_rel(root, f)}:1: file name is not bind_<family>.cpp")
            continue
        if not re.search(rf"\bvoid\s+bind_{m.group(1)}\s*\(", f.read_text(errors="replace")):
            out.append(f"{_rel(root, f)}:1: defines no function bind_{m.group(1)}(...)")
    return out


def _report(found: list[str], rule: str) -> str:
    return f"{rule}: {len(found)} violation(s)\n  " + "\n  ".join(found)


# ---- the checks on this repository --------------------------------------------------------------


def test_scanner_sees_the_layers() -> None:
    """Guards against vacuous passes: the scan finds the files and includes it judges."""
    route_cpp = includes(REPO, REPO / "src" / "route" / "route.cpp")
    assert any(i.target == "lattice/route/route.h" and i.owner == "route" for i in route_cpp), route_cpp
    assert any(True for _ in source_files(REPO, ("src/core",)))
    assert any(f.parent.name == "conv" for f in route_files(REPO))


def test_route_layer_includes_only_core_and_route_headers() -> None:
    found = route_layer_violations(REPO)
    assert not found, _report(found, "route layer may include only lattice/core, lattice/route and std")


def test_core_layer_includes_only_core_headers() -> None:
    found = core_layer_violations(REPO)
    assert not found, _report(found, "core layer may include only lattice/core and std")


def test_backend_never_includes_the_semantic_layer() -> None:
    found = backend_violations(REPO)
    assert not found, _report(found, "src/backend must not include lattice/ops, lattice/tensor, src/ops, src/tensor")


def test_semantic_layer_uses_only_the_backend_table() -> None:
    found = semantic_violations(REPO)
    assert not found, _report(
        found, "src/ops and src/tensor may include from backend/ only kernel_table.h, args.h and common/*"
    )


def test_public_headers_include_only_public_headers() -> None:
    found = public_header_violations(REPO)
    assert not found, _report(found, "include/lattice may include only include/lattice headers and std")


def test_cuda_headers_only_in_the_cuda_backend() -> None:
    found = cuda_header_violations(REPO)
    assert not found, _report(found, "CUDA toolkit headers belong in src/backend/cuda")


def test_cuda_conditionals_only_in_the_backend() -> None:
    found = cuda_conditional_violations(REPO)
    assert not found, _report(found, "#if/#ifdef on CUDA macros belongs in src/backend (or CMake)")


def test_every_route_file_opens_with_its_constraints() -> None:
    found = constraints_violations(REPO)
    assert not found, _report(found, "route files open with a 'Constraints:' comment matching admit()")


def test_every_route_id_names_an_existing_file() -> None:
    found = route_id_file_violations(REPO)
    assert not found, _report(found, "RouteId comments name the route's file")


def test_binding_files_are_named_by_family() -> None:
    found = binding_name_violations(REPO)
    assert not found, _report(found, "python/bindings: module.cpp + bind_<family>.cpp")


# ---- the checks catch violations (a fake tree) --------------------------------------------------


@pytest.fixture()
def bad_tree(tmp_path: Path) -> Path:
    files = {
        "include/lattice/core/array.h": '#include <vector>\n#include "lattice/route/caps.h"\n',
        "include/lattice/route/caps.h": '#pragma once\n#include "lattice/core/array.h"\n',
        "include/lattice/route/route.h": (
            "enum class RouteId {\n  conv_reference,  // src/backend/cpu/conv/reference.cpp\n"
            "  conv_fast,  // src/backend/cpu/conv/fast_sm80.cu\n  conv_orphan,\n};\n"
        ),
        "include/lattice/ops/conv.h": '#include "backend/kernel_table.h"\n',
        "src/route/route.cpp": '#include "lattice/route/route.h"\n#include "lattice/tensor/relation.h"\n#include <omp.h>\n',
        "src/core/array.cpp": '#include "lattice/core/array.h"\n#include "backend/kernel_table.h"\n',
        "src/backend/kernel_table.h": "#pragma once\n",
        "src/backend/args.h": "#pragma once\n",
        "src/backend/cpu/conv/reference.cpp": '// Constraints: CPU.\n#include "../../../ops/common.h"\n',
        "src/backend/cpu/conv/fast.cpp": '// Fast route.\n#include "lattice/ops/conv.h"\n',
        "src/backend/cpu/conv/routes.h": "#pragma once\n",
        "src/backend/cuda/conv/tiled.cu": '#include <cuda_runtime.h>\n#if __CUDA_ARCH__ >= 800\n#endif\n',
        "src/ops/common.h": "#pragma once\n",
        "src/ops/conv.cpp": (
            '#include "backend/kernel_table.h"\n#include "backend/cpu/conv/routes.h"\n'
            '#ifdef LATTICE_HAS_CUDA\n#include <cuda_runtime.h>\n#endif\n'
        ),
        "src/tensor/index.cpp": '#include "backend/common/hash.h"\n#  if defined(__CUDACC__)\n#endif\n',
        "python/bindings/module.cpp": "",
        "python/bindings/bind_conv.cpp": "void bind_conv(int& m) {}\n",
        "python/bindings/conv_bindings.cpp": "",
        "python/bindings/bind_pool.cpp": "void bind_pooling(int& m) {}\n",
    }
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_checks_report_each_violation_with_file_and_line(bad_tree: Path) -> None:
    def where(found: list[str]) -> list[str]:
        return sorted(v.split(": ")[0] for v in found)

    assert where(route_layer_violations(bad_tree)) == ["src/route/route.cpp:2", "src/route/route.cpp:3"]
    assert where(core_layer_violations(bad_tree)) == [
        "include/lattice/core/array.h:2", "src/core/array.cpp:2"]
    # A relative include is resolved before it is judged.
    assert where(backend_violations(bad_tree)) == [
        "src/backend/cpu/conv/fast.cpp:2", "src/backend/cpu/conv/reference.cpp:2"]
    assert where(semantic_violations(bad_tree)) == ["src/ops/conv.cpp:2", "src/ops/conv.cpp:4"]
    assert where(public_header_violations(bad_tree)) == ["include/lattice/ops/conv.h:1"]
    assert where(cuda_header_violations(bad_tree)) == ["src/ops/conv.cpp:4"]
    assert where(cuda_conditional_violations(bad_tree)) == ["src/ops/conv.cpp:3", "src/tensor/index.cpp:2"]
    assert where(constraints_violations(bad_tree)) == ["src/backend/cpu/conv/fast.cpp:1", "src/backend/cuda/conv/tiled.cu:1"]
    assert where(route_id_file_violations(bad_tree)) == [
        "include/lattice/route/route.h:3", "include/lattice/route/route.h:4"]
    assert where(binding_name_violations(bad_tree)) == [
        "python/bindings/bind_pool.cpp:1", "python/bindings/conv_bindings.cpp:1"]
