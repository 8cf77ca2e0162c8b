"""The dependency direction of DESIGN.md ("Three layers"), checked so that it cannot be walked around.

The rules live in tests/python/archcheck.py (also a script: ``python3 tests/python/archcheck.py``):

* transitive includes: a file's layer is judged by every project header it reaches (quoted or
  angled includes, resolved like the compiler does), so an allowed header that includes a backend
  header taints everything that includes it;
* the bindings and examples reach public headers only, io reaches core only, the oracle imports
  numpy and the standard library only (``ast``);
* CUDA conditionals are read after backslash splicing and comment removal, and a macro defined
  from a CUDA macro (or inside a CUDA conditional, or by CMake under LATTICE_HAS_CUDA) is a CUDA
  macro too;
* outside src/backend nobody declares backend symbols (``namespace lattice::backend::cpu {...}``)
  or names a backend sub-namespace;
* the built static libraries: liblattice_ops.a and liblattice_tensor.a reference no symbol that a
  backend library defines, no CUDA runtime symbol, and from ``lattice::backend::`` only the kernel
  table's entry points (``nm -C``); io references nothing above core; the bindings nothing of the
  backends.

The last tests inject each of the six violations that walked around the old direct-include scan
(issue 20) into a copy of this tree and show that the check fails and names the file.

The tree follows DESIGN's rule: the vocabulary that the backends share with the route layer
(device capabilities, the pool / point / algebra enums) lives in core (lattice/core/caps.h,
vocab.h), so no backend reaches a route header and liblattice_backend_cuda.a calls
lattice::tier_for_sm from liblattice_core.a. CMakeLists.txt enforces the same sets when compiling
(each layer sees only its include view; ctest layer_view_* proves an include against the
direction fails to compile); this scan also catches what a view cannot (relative includes,
transitive reach through an allowed header, symbols).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import archcheck as A

REPO = Path(__file__).resolve().parents[2]


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
            out.append(f"{A.rel(root, f)}:{first[0]}: first line is {first[1].strip()!r}, expected '// Constraints: ...'")
    return out


# A row's kernel file in src/route/<family>_routes.cpp: {"src/backend/...", "text" "text" ...}.
_ROW_FILE = re.compile(r'\{"(src/backend/[^"]+)",\s*((?:"(?:[^"\\]|\\.)*"\s*)+)\}')
_LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')


def row_files(root: Path) -> dict[str, tuple[str, str]]:
    """The kernel files the route rows declare: path -> (constraints text, where the row is)."""
    out = {}
    for f in sorted((root / "src" / "route").glob("*_routes.cpp")):
        text = f.read_text(errors="replace")
        for m in _ROW_FILE.finditer(text):
            literal = "".join(_LITERAL.findall(m.group(2))).replace('\\"', '"').replace("\\\\", "\\")
            out[m.group(1)] = (literal, f"{A.rel(root, f)}:{text.count(chr(10), 0, m.start()) + 1}")
    return out


def constraints_paragraph(path: Path) -> str:
    """The text after ``// Constraints:`` up to the first empty comment line (or code), one line."""
    lines = path.read_text(errors="replace").splitlines()
    if not lines or not re.match(r"^\s*//\s*Constraints:", lines[0]):
        return ""
    words = [lines[0].split("Constraints:", 1)[1].strip()]
    for t in lines[1:]:
        if not t.startswith("//") or t.strip() == "//":
            break
        words.append(t[2:].strip())
    return " ".join(w for w in words if w)


def route_row_violations(root: Path) -> list[str]:
    """Each route is declared once, in its row: every file a row names exists and opens with the
    row's constraints text, and every route file is named by a row."""
    rows = row_files(root)
    out = []
    for path, (constraints, where) in rows.items():
        f = root / path
        if not f.is_file():
            out.append(f"{where}: the row names {path}, which does not exist")
            continue
        header = constraints_paragraph(f)
        if " ".join(constraints.split()) != header:
            out.append(f"{path}:1: the Constraints: header differs from its row ({where}):\n"
                       f"      header: {header!r}\n      row:    {' '.join(constraints.split())!r}")
    for f in route_files(root):
        if A.rel(root, f) not in rows:
            out.append(f"{A.rel(root, f)}:1: route file named by no row in src/route/*_routes.cpp")
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
            out.append(f"{A.rel(root, f)}:1: file name is not bind_<family>.cpp")
            continue
        if not re.search(rf"\bvoid\s+bind_{m.group(1)}\s*\(", f.read_text(errors="replace")):
            out.append(f"{A.rel(root, f)}:1: defines no function bind_{m.group(1)}(...)")
    return out


def _report(found: list[str], rule: str) -> str:
    return f"{rule}: {len(found)} violation(s)\n  " + "\n  ".join(found)


def _all(found: dict[str, list[str]]) -> list[str]:
    return [v for vs in found.values() for v in vs]


# ---- the checks on this repository --------------------------------------------------------------


@pytest.fixture(scope="module")
def tree() -> A.Tree:
    return A.Tree(REPO)


def test_scanner_sees_the_layers(tree: A.Tree) -> None:
    """Guards against vacuous passes: the scan finds every layer, resolves includes transitively,
    closes CUDA macros under aliasing, and knows the backend namespaces and table names."""
    layers = {A.owner_of(r) for r in tree.sources}
    assert {"core", "route", "tensor", "ops", "io", "bindings", A.TABLE, "backend/common", "backend/cpu",
            "backend/cuda"} <= layers, layers
    reach = tree.reach("src/ops/conv.cpp")
    # conv.cpp -> ops/common.h -> backend/args.h -> backend/common/coord_hash.h (two levels down)
    assert {"src/backend/kernel_table.h", "src/backend/args.h", "src/backend/common/coord_hash.h"} <= set(reach)
    assert len(reach["src/backend/common/coord_hash.h"]) >= 2, reach["src/backend/common/coord_hash.h"]
    assert any(e.owner == "cuda" for r in tree.sources if r.startswith("src/backend/cuda/") for e in tree.edges(r))
    # backend/common/geometry.h defines LATTICE_HD inside `#if defined(__CUDACC__)`
    assert "LATTICE_HD" in A.cuda_macros(tree)
    assert {"cpu", "cuda"} <= A.backend_subnamespaces(tree)
    assert {"find_conv_kernels", "ConvArgs", "device_caps"} <= A.table_names(tree)
    assert any(True for _ in (REPO / "tests" / "oracle").glob("*.py"))
    assert any(f.parent.name == "conv" for f in route_files(REPO))


def test_no_computed_includes(tree: A.Tree) -> None:
    found = A.computed_include_violations(tree)
    assert not found, _report(found, "#include MACRO cannot be judged")


def test_every_layer_reaches_only_what_design_allows(tree: A.Tree) -> None:
    """Transitive: core -> core; route -> core, route; tensor/ops -> core, route, tensor(, ops),
    kernel_table.h, args.h, backend/common; the table headers and backend/common reach no backend
    implementation; backends never reach ops/tensor/io/bindings (nor cpu <-> cuda); io -> core;
    bindings and examples -> include/lattice; include/lattice -> include/lattice and std."""
    found = A.layer_violations(tree)
    assert not found, _report(found, "layer reach (transitive includes, archcheck.ALLOWED)")


def test_cuda_headers_only_in_the_cuda_backend(tree: A.Tree) -> None:
    found = A.cuda_header_violations(tree)
    assert not found, _report(found, "CUDA toolkit headers are reached only from src/backend/cuda")


def test_cuda_conditionals_only_in_the_backend(tree: A.Tree) -> None:
    found = A.cuda_conditional_violations(tree)
    assert not found, _report(found, "#if on CUDA macros (aliases included) belongs in src/backend (or CMake)")


def test_no_backend_declarations_outside_the_backend(tree: A.Tree) -> None:
    found = A.backend_name_violations(tree)
    assert not found, _report(found, "outside src/backend only kernel_table.h/args.h names of lattice::backend")


def test_oracle_imports_numpy_and_the_standard_library_only() -> None:
    found = A.oracle_import_violations(REPO)
    assert not found, _report(found, "tests/oracle imports numpy, the standard library (and pytest in tests)")


def test_built_libraries_reach_the_backend_only_through_the_kernel_table() -> None:
    """nm -C of the build folder (LATTICE_BUILD_DIR, default <repo>/build; `make test` builds it
    first): the semantic layer's objects reference backend code only through kernel table entry
    points. Skipped only when there is no build folder at all."""
    build = A.build_dir(REPO)
    if not build.is_dir():
        pytest.skip(f"no build folder at {build} (set LATTICE_BUILD_DIR or run `make build`)")
    found = A.symbol_violations(build, REPO / "src" / "backend" / "kernel_table.h")
    assert not found, _report(found, f"symbols of {build}")
    # not vacuous: the semantic layer does call the table
    used = {s.name for s in A.nm(build / "liblattice_ops.a", False) if s.name.startswith("lattice::backend::")}
    assert any("find_conv_kernels" in n for n in used), sorted(used)


def test_every_route_file_opens_with_its_constraints() -> None:
    found = constraints_violations(REPO)
    assert not found, _report(found, "route files open with a 'Constraints:' comment matching admit()")


def test_every_route_file_matches_its_row() -> None:
    """The rows of src/route/*_routes.cpp and the route files agree (file, Constraints: text)."""
    assert len(row_files(REPO)) >= 20, row_files(REPO)  # not vacuous: the row parser finds the rows
    found = route_row_violations(REPO)
    assert not found, _report(found, "each route file is its row's file, with the row's constraints text")


def omp_violations(root: Path) -> list[str]:
    """``#pragma omp`` lines in src/ops and src/tensor (comments included: a commented-out loop is
    a loop waiting to come back)."""
    out = []
    for layer in ("ops", "tensor"):
        for f in sorted((root / "src" / layer).rglob("*")):
            if f.suffix not in {".cpp", ".h", ".cc", ".hpp"}:
                continue
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), start=1):
                if re.search(r"#\s*pragma\s+omp\b", line):
                    out.append(f"{A.rel(root, f)}:{n}: {line.strip()}")
    return out


def test_no_openmp_loops_in_the_semantic_and_tensor_layers(tmp_path: Path) -> None:
    """issue 11: src/ops and src/tensor orchestrate and validate; compute loops (OpenMP ones
    above all) run from a route's file under src/backend/<device>/<family>/. The check is shown
    to fire on a copy with one injected loop."""
    found = omp_violations(REPO)
    assert not found, _report(found, "no '#pragma omp' in src/ops or src/tensor (move the loop to a route)")
    assert any("pragma omp" in f.read_text() for f in (REPO / "src" / "backend" / "cpu").rglob("*.cpp"))
    for layer in ("ops", "tensor"):
        (tmp_path / "src" / layer).mkdir(parents=True)
    (tmp_path / "src" / "tensor" / "bad.cpp").write_text("void f() {\n#pragma omp parallel for\n}\n")
    assert omp_violations(tmp_path) == ["src/tensor/bad.cpp:2: #pragma omp parallel for"]


def test_binding_files_are_named_by_family() -> None:
    found = binding_name_violations(REPO)
    assert not found, _report(found, "python/bindings: module.cpp + bind_<family>.cpp")


# ---- every rule on a small fake tree (known violations, file and line) --------------------------


@pytest.fixture()
def bad_tree(tmp_path: Path) -> Path:
    files = {
        "include/lattice/core/array.h": '#include <vector>\n#include "lattice/route/caps.h"\n',
        "include/lattice/route/caps.h": '#pragma once\n#include "lattice/core/array.h"\n',
        "src/route/conv_routes.cpp": (
            '    {.files = {{{"src/backend/cpu/conv/reference.cpp",\n          "CPU."}}}},\n'
            '    {.files = {{{"src/backend/cpu/conv/fast_sm80.cu",\n          "CUDA."}}}},\n'
            '    {.files = {{{"src/backend/cpu/conv/slow.cpp",\n          "CPU; " "slow."}}}},\n'
        ),
        "src/backend/cpu/conv/slow.cpp": "// Constraints: CPU; fast.\n",
        "include/lattice/ops/conv.h": '#include "backend/kernel_table.h"\n',
        "src/route/route.cpp": '#include "lattice/route/route.h"\n#include "lattice/tensor/relation.h"\n#include <omp.h>\n',
        "src/core/array.cpp": '#include <string>\n#include "backend/kernel_table.h"\n',
        "src/backend/kernel_table.h": "#pragma once\n",
        "src/backend/args.h": "#pragma once\n",
        "src/backend/cpu/conv/reference.cpp": '// Constraints: CPU.\n#include "../../../ops/common.h"\n',
        "src/backend/cpu/conv/fast.cpp": '// Fast route.\n#include "lattice/ops/conv.h"\n',
        "src/backend/cpu/conv/routes.h": "#pragma once\n",
        "src/backend/cuda/conv/tiled.cu": '#include <cuda_runtime.h>\n#if __CUDA_ARCH__ >= 800\n#endif\n',
        "src/ops/common.h": "#pragma once\n",
        "src/ops/conv.cpp": (
            '#include "backend/kernel_table.h"\n#include "backend/cpu/conv/routes.h"\n'
            '#ifdef LATTICE_HAS_CUDA\n#include <cuda_runtime.h>\n#endif\n#include INCLUDE_ME\n'
        ),
        "src/tensor/index.cpp": '#include "backend/common/hash.h"\n#  if defined(__CUDACC__)\n#endif\n',
        "python/bindings/module.cpp": "",
        "python/bindings/bind_conv.cpp": "void bind_conv(int& m) {}\n",
        "python/bindings/conv_bindings.cpp": "",
        "python/bindings/bind_pool.cpp": "void bind_pooling(int& m) {}\n",
        "tests/oracle/ok.py": "import math\nimport numpy as np\nfrom . import ok\n",
        "tests/oracle/test_ok.py": "import pytest\n",
        "tests/oracle/bad.py": "import pytest\nfrom torch import nn\nfrom ..python import lattice\n\ndef f():\n    __import__('x')\n",
    }
    for name, text in files.items():
        _write(tmp_path / name, text)
    return tmp_path


def test_checks_report_each_violation_with_file_and_line(bad_tree: Path) -> None:
    def where(found: list[str]) -> list[str]:
        return sorted(set(v.split(": ")[0] for v in found))

    tree = A.Tree(bad_tree)
    assert where(A.layer_violations(tree)) == [
        "include/lattice/core/array.h:2",  # core reaches route
        "include/lattice/ops/conv.h:1",  # a public header reaches src/backend
        "src/backend/cpu/conv/fast.cpp:2",  # backend reaches ops (and, through it, the table: allowed)
        "src/backend/cpu/conv/reference.cpp:2",  # a relative include is resolved before it is judged
        "src/core/array.cpp:2",  # core reaches the kernel table
        "src/ops/conv.cpp:2", "src/ops/conv.cpp:4",  # a backend header; a CUDA header
        "src/route/route.cpp:2", "src/route/route.cpp:3",  # tensor; an external header
    ]
    assert where(A.computed_include_violations(tree)) == ["src/ops/conv.cpp:6"]
    assert where(A.cuda_header_violations(tree)) == ["src/ops/conv.cpp:4"]
    assert where(A.cuda_conditional_violations(tree)) == ["src/ops/conv.cpp:3", "src/tensor/index.cpp:2"]
    assert where(A.oracle_import_violations(bad_tree)) == [
        "tests/oracle/bad.py:1", "tests/oracle/bad.py:2", "tests/oracle/bad.py:3", "tests/oracle/bad.py:6"]
    assert where(constraints_violations(bad_tree)) == ["src/backend/cpu/conv/fast.cpp:1", "src/backend/cuda/conv/tiled.cu:1"]
    assert where(route_row_violations(bad_tree)) == [
        "src/backend/cpu/conv/fast.cpp:1",  # a route file no row names
        "src/backend/cpu/conv/slow.cpp:1",  # the header says "fast.", the row "slow."
        "src/backend/cuda/conv/tiled.cu:1",  # a route file no row names
        "src/route/conv_routes.cpp:3",  # the row names a file that does not exist
    ]
    assert where(binding_name_violations(bad_tree)) == [
        "python/bindings/bind_pool.cpp:1", "python/bindings/conv_bindings.cpp:1"]


# ---- the six violations of issue 20, injected into a copy of this tree --------------------------

# What the source rules read; tests/cpp and benchmarks have no layer of their own.
COPIED = ("include", "src", "python/bindings", "examples", "tests/oracle", "CMakeLists.txt")


def _copy_tree(dst: Path) -> Path:
    for name in COPIED:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / name)
    return dst


def _insert_after_includes(path: Path, text: str) -> None:
    """Puts ``text`` after the last #include of ``path`` (or at the top when it has none)."""
    lines = path.read_text().split("\n")
    last = max((n for n, t in enumerate(lines) if re.match(r"\s*#\s*include\b", t)), default=-1)
    lines[last + 1:last + 1] = text.split("\n")
    path.write_text("\n".join(lines))


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


FORWARD_DECLARED_CALL = """\
#include "backend/kernel_table.h"
namespace lattice::backend::cpu {
void conv_reference(const ConvArgs& args);
}
namespace lattice::ops {
void run_reference(const backend::ConvArgs& args) { backend::cpu::conv_reference(args); }
}  // namespace lattice::ops
"""
FORWARD_DECLARED_NESTED = """\
#include "backend/kernel_table.h"
namespace lattice {
namespace backend { namespace cpu { void conv_reference(const ConvArgs&); } }
namespace ops {
using namespace lattice::backend;
void run_reference(const ConvArgs& args) { cpu::conv_reference(args); }
}  // namespace ops
}  // namespace lattice
"""


def _inject(root: Path, case: str) -> list[str]:
    """Applies one violation to the copy at ``root``; returns the files the check must name."""
    if case == "a: forward-declared backend call from src/ops":
        _write(root / "src/ops/x.cpp", FORWARD_DECLARED_CALL)
        return ["src/ops/x.cpp"]
    if case == "a: forward declaration in nested namespace blocks, called through using namespace":
        _write(root / "src/ops/x.cpp", FORWARD_DECLARED_NESTED)
        return ["src/ops/x.cpp"]
    if case == "b: kernel_table.h includes a backend header":
        _insert_after_includes(root / "src/backend/kernel_table.h", '#include "backend/cpu/conv/conv_routes.h"')
        # the header itself, and a semantic file that reaches it
        return ["src/backend/kernel_table.h", "src/ops/conv.cpp"]
    if case == "b: args.h includes a backend header":
        _insert_after_includes(root / "src/backend/args.h", '#include "cpu/pool/pool_routes.h"')
        return ["src/backend/args.h", "src/tensor/coord_index.h"]
    if case == "b: backend/common includes a backend header":
        _insert_after_includes(root / "src/backend/common/geometry.h", '#include "../cpu/caps.h"')
        return ["src/backend/common/geometry.h", "src/tensor/relation.cpp"]
    if case == "c: bindings include a backend header":
        _insert_after_includes(root / "python/bindings/bind_conv.cpp", '#include "backend/cpu/conv/conv_routes.h"')
        return ["python/bindings/bind_conv.cpp"]
    if case == "c: bindings include the kernel table with angle brackets":
        _insert_after_includes(root / "python/bindings/common.h", "#include <backend/kernel_table.h>")
        return ["python/bindings/common.h", "python/bindings/bind_core.cpp"]
    if case == "d: io includes a backend header":
        _insert_after_includes(root / "src/io/kitti.cpp", '#include "backend/cpu/caps.h"')
        return ["src/io/kitti.cpp"]
    if case == "d: io includes the kernel table by a relative path":
        _insert_after_includes(root / "src/io/common.h", '#include "../backend/kernel_table.h"')
        return ["src/io/common.h", "src/io/ply.cpp"]
    if case == "e: CUDA #if through an alias macro":
        _insert_after_includes(root / "src/ops/conv.cpp", "#define HAVE_GPU LATTICE_HAS_CUDA\n#if HAVE_GPU\n#endif")
        return ["src/ops/conv.cpp"]
    if case == "e: alias defined in a backend header, chained, used in src/tensor":
        _insert_after_includes(root / "src/backend/args.h",
                               "#define LATTICE_GPU_ON LATTICE_HAS_CUDA\n#define LATTICE_FAST (LATTICE_GPU_ON && 1)")
        _insert_after_includes(root / "src/tensor/relation.cpp", "#if LATTICE_FAST\n#endif")
        return ["src/tensor/relation.cpp"]
    if case == "e: macro defined under #ifdef __CUDACC__ tested with #ifdef":
        # LATTICE_HD is defined by backend/common/geometry.h in both branches of `#if defined(__CUDACC__)`
        _insert_after_includes(root / "src/ops/pool.cpp", "#ifdef LATTICE_HD\n#endif")
        return ["src/ops/pool.cpp"]
    if case == "f: #if continued on a second line":
        _insert_after_includes(root / "src/ops/conv.cpp", "#if defined(FOO) || \\\n    defined(LATTICE_HAS_CUDA)\n#endif")
        return ["src/ops/conv.cpp"]
    if case == "f: macro name split by a continuation":
        _insert_after_includes(root / "src/ops/coords.cpp", "#ifdef LATTICE_HAS_\\\nCUDA\n#endif")
        return ["src/ops/coords.cpp"]
    if case == "f: comments inside the directive":
        _insert_after_includes(root / "src/ops/algebra.cpp", "# /* x */ if /* y */ defined(__CUDA_ARCH__) // z\n#endif")
        return ["src/ops/algebra.cpp"]
    if case == "e: alias defined by CMake from LATTICE_HAS_CUDA":
        cm = root / "CMakeLists.txt"
        cm.write_text(cm.read_text() + "\ntarget_compile_definitions(lattice_ops PRIVATE "
                      "LATTICE_GPU_BUILD=$<BOOL:${LATTICE_HAS_CUDA}>)\n")
        _insert_after_includes(root / "src/ops/quantize.cpp", "#if LATTICE_GPU_BUILD\n#endif")
        return ["src/ops/quantize.cpp"]
    if case == "a: forward declaration in an inline namespace":
        _write(root / "src/tensor/y.cpp", "namespace lattice::inline backend::cuda { void build(); }\n")
        return ["src/tensor/y.cpp"]
    if case == "a file outside every layer (new src folder, new backend folder)":
        _write(root / "src/gpu/kernels.cpp", '#include "backend/cuda/runtime/check.h"\n')
        _write(root / "src/backend/hip/conv.cpp", "// Constraints: none.\n")
        return ["src/gpu/kernels.cpp", "src/backend/hip/conv.cpp"]
    if case == "oracle imports lattice":
        _insert_after_includes(root / "tests/oracle/conv.py", "import lattice.ops")
        return ["tests/oracle/conv.py"]
    if case == "oracle imports torch dynamically":
        _insert_after_includes(root / "tests/oracle/pool.py", "import importlib\n_t = importlib.import_module('torch')")
        return ["tests/oracle/pool.py"]
    raise AssertionError(case)


CASES = [
    "a: forward-declared backend call from src/ops",
    "a: forward declaration in nested namespace blocks, called through using namespace",
    "b: kernel_table.h includes a backend header",
    "b: args.h includes a backend header",
    "b: backend/common includes a backend header",
    "c: bindings include a backend header",
    "c: bindings include the kernel table with angle brackets",
    "d: io includes a backend header",
    "d: io includes the kernel table by a relative path",
    "e: CUDA #if through an alias macro",
    "e: alias defined in a backend header, chained, used in src/tensor",
    "e: macro defined under #ifdef __CUDACC__ tested with #ifdef",
    "f: #if continued on a second line",
    "f: macro name split by a continuation",
    "f: comments inside the directive",
    "oracle imports lattice",
    "oracle imports torch dynamically",
    # beyond the six of issue 20: other ways around the same rules
    "e: alias defined by CMake from LATTICE_HAS_CUDA",
    "a: forward declaration in an inline namespace",
    "a file outside every layer (new src folder, new backend folder)",
]


def test_the_copied_tree_passes(tmp_path: Path) -> None:
    """The baseline of the injection tests: an untouched copy has no violation, so each failure
    below comes from its injection alone."""
    found = _all(A.source_violations(_copy_tree(tmp_path)))
    assert not found, _report(found, "untouched copy")


@pytest.mark.parametrize("case", CASES)
def test_each_injected_violation_fails_the_check(tmp_path: Path, case: str) -> None:
    root = _copy_tree(tmp_path)
    named = _inject(root, case)
    found = _all(A.source_violations(root))
    assert found, f"{case}: the check passed"
    for f in named:
        assert any(v.startswith(f + ":") for v in found), f"{case}: {f} not named in\n  " + "\n  ".join(found)


def test_comments_and_strings_are_not_violations(tmp_path: Path) -> None:
    """The reader removes comments and string contents before judging, so prose about the
    backend (and the `}  // namespace lattice::backend::cpu` lines of the backend) is not a
    false positive in the semantic layer."""
    root = _copy_tree(tmp_path)
    _insert_after_includes(root / "src/ops/conv.cpp", (
        '// #include "backend/cpu/conv/conv_routes.h"\n/* namespace lattice::backend::cpu { } */\n'
        'static const char* kNote = "backend::cpu::conv_reference #if LATTICE_HAS_CUDA";\n'
        "// #if LATTICE_HAS_CUDA\nstatic const int kSep = 1'000'000;"))
    found = _all(A.source_violations(root))
    assert not found, _report(found, "comments and strings")


# ---- the symbol check on a small fake build -----------------------------------------------------

FAKE_OBJECTS = {
    "backend_cpu/conv.cpp": (
        "namespace lattice::backend::cpu { void conv_reference(int) {} }\n"
        'extern "C" void lattice_cpu_conv(int) {}\n'
        "namespace lattice::ops { void sneaky(int) {} }\n"),
    "backend/kernel_table.cpp": (
        "namespace lattice::backend { void* find_conv_kernels(int) { return nullptr; }\n"
        "void* table_helper() { return nullptr; } }\n"),
    "ops/ok.cpp": "namespace lattice::backend { void* find_conv_kernels(int); }\nvoid* ok() { return lattice::backend::find_conv_kernels(1); }\n",
    "ops/forward_declared.cpp": "namespace lattice::backend::cpu { void conv_reference(int); }\nvoid f() { lattice::backend::cpu::conv_reference(1); }\n",
    "ops/extern_c.cpp": 'extern "C" void lattice_cpu_conv(int);\nvoid g() { lattice_cpu_conv(1); }\n',
    "ops/other_namespace.cpp": "namespace lattice::ops { void sneaky(int); }\nvoid h() { lattice::ops::sneaky(1); }\n",
    "ops/cuda.cpp": 'extern "C" int cudaDeviceSynchronize();\nint k() { return cudaDeviceSynchronize(); }\n',
    "tensor/helper.cpp": "namespace lattice::backend { void* table_helper(); }\nvoid* t() { return lattice::backend::table_helper(); }\n",
    "io/reader.cpp": "namespace lattice::backend { void* find_conv_kernels(int); }\nvoid* r() { return lattice::backend::find_conv_kernels(2); }\n",
    "core/core.cpp": "int core_fn() { return 0; }\n",
    "route/route.cpp": "int route_fn() { return 0; }\n",
}
FAKE_LIBS = {"backend_cpu": "liblattice_backend_cpu.a", "backend": "liblattice_backend.a", "ops": "liblattice_ops.a",
             "tensor": "liblattice_tensor.a", "io": "liblattice_io.a", "core": "liblattice_core.a",
             "route": "liblattice_route.a"}


def test_symbol_check_catches_backend_calls_that_bypass_the_table(tmp_path: Path) -> None:
    """Tiny static libraries compiled here: every way of calling backend code that the source
    rules might miss (a forward declaration, extern "C", a backend function put in another
    namespace, a table helper that is not an entry point, a CUDA runtime call, io reaching the
    table) is reported with its object, and the one legal table call is not."""
    cxx = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++") or shutil.which("clang++")
    ar = shutil.which("ar")
    if cxx is None or ar is None:
        pytest.skip("no C++ compiler/ar on PATH (the project cannot be built here either)")
    srcs = []
    for name, text in FAKE_OBJECTS.items():
        path = tmp_path / "src" / name
        _write(path, text)
        srcs.append(path)
    build = tmp_path / "build"
    build.mkdir()
    for folder, lib in FAKE_LIBS.items():
        objs = []
        for src in srcs:
            if src.parent.name == folder:
                obj = build / f"{src.stem}.cpp.o"
                subprocess.run([cxx, "-std=c++20", "-c", str(src), "-o", str(obj)], check=True)
                objs.append(str(obj))
        subprocess.run([ar, "rcs", str(build / lib), *objs], check=True)
    header = tmp_path / "kernel_table.h"
    header.write_text("namespace lattice::backend {\nvoid* find_conv_kernels(int id);\n}\n")

    found = A.symbol_violations(build, header)
    by_object = {}
    for v in found:
        m = re.match(r"build/(\S+)\((\S+)\): references (.*?): ", v)
        assert m, v
        by_object.setdefault(m.group(2), []).append(m.group(3))
    assert set(by_object) == {"forward_declared.cpp.o", "extern_c.cpp.o", "other_namespace.cpp.o", "cuda.cpp.o",
                              "helper.cpp.o", "reader.cpp.o"}, "\n".join(found)
    assert by_object["forward_declared.cpp.o"] == ["lattice::backend::cpu::conv_reference(int)"]
    assert by_object["helper.cpp.o"] == ["lattice::backend::table_helper()"]
