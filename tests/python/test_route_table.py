"""The route table is the one declaration of every route (issue 11, "a route is declared once").

Each row of src/route/<family>_routes.cpp (id, family, name, device, tier, rank, kernel entry
points, kernel files with their constraints text) is read through ``core.route_table()``; these
tests prove that what is derived from the rows agrees with them and with the tree:

* every kernel file a row names exists and opens with the row's constraints text, and every
  kernel entry point it names is defined in that device's backend;
* the route table in docs/architecture.md is exactly the rendering of the rows;
* an unknown route name raises with the family's complete list of names, CUDA routes included
  (the hand-written lists this replaced omitted them), for every family;
* the route lists the tests iterate over (``lattice.routes.route_names``) follow the rows.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from lattice import routes
from lattice._core import core

REPO = Path(__file__).resolve().parents[2]
FAMILIES = ("conv", "quantize", "point_voxel", "pool", "algebra", "coords", "quantized", "relation", "pool_edges",
            "point_index", "dequantize", "batch_norm")


def _constraints_paragraph(path: Path) -> str:
    lines = path.read_text().splitlines()
    assert lines[0].startswith("// Constraints:"), path
    words = [lines[0][len("// Constraints:"):].strip()]
    for t in lines[1:]:
        if not t.startswith("//") or t.strip() == "//":
            break
        words.append(t[2:].strip())
    return " ".join(words)


def test_the_table_has_every_family_and_unique_names():
    rows = routes.route_table()
    assert tuple(routes.route_families()) == FAMILIES
    assert len(rows) == 35, [(r["family"], r["name"]) for r in rows]
    keys = [(r["family"], r["name"]) for r in rows]
    assert len(set(keys)) == len(keys)
    for fam in FAMILIES:
        ranks = [r["rank"] for r in rows if r["family"] == fam]
        assert ranks == sorted(ranks), fam
        assert routes.route_names(fam) == [r["name"] for r in rows if r["family"] == fam]
        # every family keeps a scalar CPU reference as the last resort
        assert any(r["device"].startswith("cpu") for r in rows if r["family"] == fam), fam


@pytest.mark.parametrize("row", core.route_table(), ids=lambda r: f"{r['family']}:{r['name']}")
def test_each_row_names_existing_files_with_its_constraints_and_defined_kernels(row):
    assert row["files"], row
    for path, constraints in row["files"]:
        f = REPO / path
        assert f.is_file(), path
        assert _constraints_paragraph(f) == " ".join(constraints.split()), path
    assert row["device"] in ("cpu", "cuda", "cpu, cuda")
    assert (row["tier"] == "none") == (row["device"] == "cpu"), row
    for entry in row["kernels"].split():
        device, name = entry.split("::")
        assert device in row["device"], entry
        defined = [p for p in (REPO / "src" / "backend" / device).rglob("*")
                   if p.suffix in (".cpp", ".cu") and re.search(rf"^\S.*\b{name}\s*\(", p.read_text(), re.M)]
        assert defined, f"{entry}: no definition under src/backend/{device}"


def test_the_documented_route_table_is_the_rows():
    doc = (REPO / "docs" / "architecture.md").read_text()
    documented = routes.documented_table(doc)
    assert documented is not None, "docs/architecture.md has no route-table markers"
    assert documented == routes.markdown_table(), (
        "docs/architecture.md's route table is stale: run `python3 -m lattice.routes --write docs/architecture.md`")
    # not vacuous: the rendering has one line per row
    assert documented.count("\n") == len(core.route_table()) + 2


def test_the_doc_check_fails_on_a_stale_table():
    doc = (REPO / "docs" / "architecture.md").read_text()
    stale = doc.replace("| `implicit_gemm_sm80` |", "| `implicit_gemm_sm90` |")
    assert stale != doc
    assert routes.documented_table(stale) != routes.markdown_table()


def test_unknown_conv_route_lists_every_conv_route_cuda_included():
    """The bindings' one parse (python/bindings/module.cpp) lists the family's names from the rows;
    the per-family messages are checked where each family's errors are tested (test_validation,
    test_point_voxel, test_pool, test_algebra, test_coords, test_quantized_ops)."""
    names = routes.route_names("conv")
    assert {"implicit_gemm_sm80", "cuda_gather_gemm_scatter"} <= set(names)
    expected = "one of " + ", ".join(f"'{n}'" for n in names)
    problem = dict(op="subm_conv3d", relation="submanifold", dtype="float32", device="cpu", n_in=8, n_out=8,
                   c_in=2, c_out=2, kernel_volume=27, n_edges=16)
    with pytest.raises(ValueError, match=rf"^\[subm_conv3d\] route: expected {re.escape(expected)}, got 'nope'$"):
        core.explain_conv_problem(problem, {}, "nope")


def test_route_names_filter_by_device():
    assert routes.route_names("point_voxel", device="cpu") == ["parallel", "reference"]
    assert routes.route_names("conv", device="cuda") == ["cuda_pointwise_matmul", "implicit_gemm_sm80",
                                                          "cuda_gather_gemm_scatter"]
    assert "dequant_reference" in routes.route_names("quantized", device="cuda")
    with pytest.raises(ValueError, match=r"^\[route_names\] family: expected one of conv, "):
        routes.route_names("convolution")


def test_the_hand_written_admission_table_names_exactly_the_rows():
    """tests/python/cuda_admission.py stays an independent, hand-written oracle of admission; a
    route row it does not cover (or a route it names that no row declares) fails here."""
    import cuda_admission as adm
    for family in FAMILIES:
        assert tuple(adm.ROUTES[family]) == tuple(routes.route_names(family)), family
        cpu_only = tuple(r["name"] for r in routes.route_table() if r["family"] == family and r["device"] == "cpu")
        assert tuple(adm.CPU_ROUTES[family]) == cpu_only, family
