"""A route is its RouteId, its row and its kernel file (docs/architecture.md "Recipe: add a route").

Each kernel file registers its route's entry points itself::

    LATTICE_ROUTE_KERNELS(ConvKernels, conv_reference, {.forward = cpu::conv_reference_forward, ...});

and the build collects those lines into the kernel table's lookups (cmake/kernel_registry.cmake),
so no hand-written RouteId -> entry points table and no declaration-only header exist. These
source-level checks (no build needed; tests/cpp/test_kernel_registry.cpp checks the built
registry) prove that

* every route row is registered exactly once, by one of the row's kernel files, with its family's
  struct (read from backend/kernels.h), naming exactly the row's ``kernels`` on that device (for a
  "cpu, cuda" row: a subset, the rest defined elsewhere) with the file's own backend namespace;
  and every registration belongs to a row;
* the recipe has not grown back: src/backend/kernel_table.cpp / kernel_table.h name no route and
  include no route's header, and no backend header declares a registered entry point that only
  its own file and its registration use (a header kept "for the kernel table").

The last test plants each regression in a copy of src/backend and shows the check names it.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from lattice._core import core

REPO = Path(__file__).resolve().parents[2]

# A registration: the macro at the start of a line, up to the closing `});`.
_REGISTRATION = re.compile(r"^LATTICE_ROUTE_KERNELS\(\s*(\w+)\s*,\s*(\w+)\s*,\s*\{(.*?)\}\s*\)\s*;", re.M | re.S)
_ENTRY = re.compile(r"\.(\w+)\s*=\s*(\w+)::(\w+)")
_STRUCT = re.compile(r"struct\s+(\w+Kernels)\s*\{\s*static\s+constexpr\s+std::string_view\s+family\s*=\s*\"(\w+)\"")


def family_structs(root: Path) -> dict[str, str]:
    """family -> its entry-point struct, as backend/kernels.h declares them."""
    return {fam: struct for struct, fam in _STRUCT.findall((root / "src/backend/kernels.h").read_text())}


def registrations(root: Path) -> dict[str, list[dict]]:
    """route id spelling -> its registrations (file, struct, entries [(field, device, function)])."""
    out: dict[str, list[dict]] = {}
    for p in sorted((root / "src" / "backend").rglob("*")):
        if p.suffix not in (".cpp", ".cu"):
            continue
        text = p.read_text(errors="replace")
        for m in _REGISTRATION.finditer(text):
            struct, route, body = m.groups()
            entries = _ENTRY.findall(body)
            out.setdefault(route, []).append({
                "file": p.relative_to(root).as_posix(), "struct": struct, "entries": entries,
                # everything of the initializer that is not one `.field = device::function`
                "rest": _ENTRY.sub("", body).replace(",", "").strip()})
        # a line that starts the macro but does not parse is a registration the build rejects
        n_heads = len(re.findall(r"^LATTICE_ROUTE_KERNELS\(", text, re.M))
        assert n_heads == len(_REGISTRATION.findall(text)), f"{p}: a LATTICE_ROUTE_KERNELS line does not parse"
    return out


def registration_violations(rows: list[dict], regs: dict[str, list[dict]], structs: dict[str, str]) -> list[str]:
    out = []
    ids = set()
    for row in rows:
        key, rid = f"{row['family']}:{row['name']}", f"{row['family']}_{row['name']}"
        ids.add(rid)
        mine = regs.get(rid, [])
        if len(mine) != 1:
            out.append(f"{key}: registered {len(mine)} times (LATTICE_ROUTE_KERNELS(..., {rid}, ...))")
            continue
        reg = mine[0]
        files = [f for f, _ in row["files"]]
        if reg["file"] not in files:
            out.append(f"{key}: registered by {reg['file']}, not one of its row's files {files}")
        if reg["struct"] != structs.get(row["family"]):
            out.append(f"{key}: registered as {reg['struct']}, its family's struct is {structs.get(row['family'])}")
        device = reg["file"].split("/")[2]
        names = [f"{dev}::{fn}" for _, dev, fn in reg["entries"]]
        if not names or reg["rest"]:
            out.append(f"{key}: the initializer is not a list of `.field = {device}::function`: {reg['rest']!r}")
        if any(dev != device for _, dev, _ in reg["entries"]):
            out.append(f"{key}: {reg['file']} registers functions of another backend: {names}")
        listed = row["kernels"].split()
        if not set(names) <= set(listed):
            out.append(f"{key}: registers {sorted(set(names) - set(listed))}, which its row's kernels do not list")
        mine_dev = {k for k in listed if k.startswith(device + "::")}
        if "," not in row["device"] and set(names) != set(listed):
            out.append(f"{key}: its row lists {sorted(set(listed) - set(names))}, which its registration does not")
        elif "," in row["device"] and set(names) != mine_dev:
            out.append(f"{key}: its row lists {sorted(mine_dev - set(names))} on {device}, not registered")
    for rid, rs in sorted(regs.items()):
        if rid not in ids:
            out.append(f"{rid}: registered by {rs[0]['file']}, but no route row declares it")
    return out


def recipe_violations(root: Path) -> list[str]:
    """What would make "add a route" touch more than its RouteId, its row and its kernel file."""
    out = []
    enumerators = set(re.findall(r"^\s*(\w+),", re.search(r"enum class RouteId \{(.*?)\};",
                                 (root / "include/lattice/route/route.h").read_text(), re.S).group(1), re.M))
    assert len(enumerators) >= 20, enumerators  # not vacuous: the enum was read
    for name in ("src/backend/kernel_table.cpp", "src/backend/kernel_table.h"):
        text = (root / name).read_text()
        for m in re.finditer(r"RouteId::(\w+)", text):
            if m.group(1) in enumerators:
                out.append(f"{name}: names RouteId::{m.group(1)} (the kernel table is generated from registrations)")
        for m in re.finditer(r'#\s*include\s+"(backend/(?:cpu|cuda)/[^"]+)"', text):
            if not re.fullmatch(r"backend/cpu/caps\.h|backend/cuda/runtime/\w+\.h", m.group(1)):
                out.append(f"{name}: includes {m.group(1)} (kernel files register themselves)")
    regs = registrations(root)
    backend = root / "src" / "backend"
    sources = {p: p.read_text(errors="replace") for p in backend.rglob("*") if p.suffix in (".cpp", ".cu", ".h", ".cuh")}
    for route, rs in sorted(regs.items()):
        for reg in rs:
            for _, _, fn in reg["entries"]:
                call = re.compile(rf"\b{fn}\s*\(")
                headers = [p for p, t in sources.items() if p.suffix in (".h", ".cuh") and call.search(t)]
                if not headers:
                    continue
                # the files that define it or name it (registrations included), headers aside
                users = [p for p, t in sources.items() if p.suffix in (".cpp", ".cu") and re.search(rf"\b{fn}\b", t)]
                defining = [p for p in users if re.search(rf"^\S.*\b{fn}\s*\([^;]*$", sources[p], re.M)]
                others = [p for p in users if p not in defining]
                if not others:
                    for h in headers:
                        out.append(f"{h.relative_to(root).as_posix()}: declares {fn}, which only its own file "
                                   f"{[p.relative_to(root).as_posix() for p in defining]} uses (a declaration for the "
                                   "kernel table; the registration needs none)")
    return out


def test_every_row_is_registered_by_its_kernel_file():
    rows = core.route_table()
    regs = registrations(REPO)
    structs = family_structs(REPO)
    assert len(structs) == len({r["family"] for r in rows}), structs  # one struct per family
    assert len(regs) == len(rows) >= 30, sorted(regs)  # not vacuous: the parser finds every registration
    found = registration_violations(rows, regs, structs)
    assert not found, "\n  ".join(["route rows and registrations disagree:"] + found)


def test_the_recipe_has_not_grown_back():
    found = recipe_violations(REPO)
    assert not found, "\n  ".join(["'add a route' would touch more than RouteId, row and kernel file:"] + found)


def _plant(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    shutil.copytree(REPO / "src", root / "src")
    (root / "include/lattice/route").mkdir(parents=True)
    shutil.copy2(REPO / "include/lattice/route/route.h", root / "include/lattice/route/route.h")
    return root


def test_the_checks_name_each_planted_regression(tmp_path: Path):
    rows = core.route_table()
    root = _plant(tmp_path)
    # 1. the kernel table maps a route by hand again, through a declaration header
    table = root / "src/backend/kernel_table.cpp"
    table.write_text(table.read_text().replace(
        '#include "backend/cpu/caps.h"',
        '#include "backend/cpu/caps.h"\n#include "backend/cpu/pool/reference_routes.h"') +
        "\n// if (id == RouteId::pool_reference) return &reference;\n")
    (root / "src/backend/cpu/pool/reference_routes.h").write_text(
        "#pragma once\nnamespace lattice::backend::cpu {\nvoid pool_reference_forward(const PoolArgs& args);\n}\n")
    found = recipe_violations(root)
    assert any("kernel_table.cpp: names RouteId::pool_reference" in v for v in found), found
    assert any("kernel_table.cpp: includes backend/cpu/pool/reference_routes.h" in v for v in found), found
    assert any("reference_routes.h: declares pool_reference_forward" in v for v in found), found
    assert not any("conv_routes.h" in v for v in found), found  # a header other files need stays allowed

    # 2. a kernel file that forgot its registration, and one registering a misspelt route
    root = _plant(tmp_path / "b")
    f = root / "src/backend/cpu/pool/input_exclusive.cpp"
    f.write_text(f.read_text().replace("LATTICE_ROUTE_KERNELS(PoolKernels, pool_input_exclusive,",
                                       "LATTICE_ROUTE_KERNELS(PoolKernels, pool_input_exclusiv,"))
    found = registration_violations(rows, registrations(root), family_structs(root))
    assert any(v.startswith("pool:input_exclusive: registered 0 times") for v in found), found
    assert any(v.startswith("pool_input_exclusiv: registered by src/backend/cpu/pool/input_exclusive.cpp") for v in found)

    # 3. a registration naming a function its row does not list, with another family's struct
    root = _plant(tmp_path / "c")
    f = root / "src/backend/cpu/pool/csr_reduce.cpp"
    f.write_text(f.read_text().replace("LATTICE_ROUTE_KERNELS(PoolKernels, pool_csr_reduce, {",
                                       "LATTICE_ROUTE_KERNELS(ConvKernels, pool_csr_reduce, {.forward = cpu::other_forward, "))
    found = registration_violations(rows, registrations(root), family_structs(root))
    assert any(v.startswith("pool:csr_reduce: registered as ConvKernels") for v in found), found
    assert any(v.startswith("pool:csr_reduce: registers ['cpu::other_forward']") for v in found), found
