"""Every validation message thrown in src/ops/*.cpp is matched by a test.

The semantic layer raises its argument errors through ``throw_value_error`` /
``throw_type_error`` (src/core/error.cpp), which format ``[op] argument: expected E, got G``.
This test parses every such call in src/ops/*.cpp (a small tokenizer: nested parentheses,
string literals, calls spread over several lines), resolves what it can statically:

* op: a string literal, a ``constexpr ... kName = "..."`` constant of the file, or (a variable
  such as ``op`` / ``plan.op``) any public op name that reaches the file (FILE_OPS below);
* argument: a string literal, or a parameter of the enclosing helper resolved through the
  string literals its callers in the same file pass at that position (``check_feats(op,
  "feats", ...)``); unresolved only when no caller passes a literal;
* expected / got: the first string literal of each expression (the fixed part of the message);

and asserts that each call site is matched by one test block (a pytest function with its
decorators, or a GoogleTest ``TEST``/``TEST_P`` body) in tests/python or tests/cpp that
contains the op name, the argument name, the word "expected" and the expected / got
fragments. Backslashes are dropped from the test text first, so ``match=r"\\(C_out=4,\\)"`` counts.

Limitation, by construction: call sites whose op, argument and fixed message text are all
identical cannot be told apart by text; each still needs its own test (they exist), but this
check alone would not notice one of them going untested.

The extractor itself is unit-tested on a fake source string below, and the matcher on a fake
test corpus, so this file can fail.
"""
from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
OPS_DIR = ROOT / "src" / "ops"
TEST_DIRS = (ROOT / "tests" / "python", ROOT / "tests" / "cpp")

# The public op names whose calls reach each src/ops file with a *variable* op name (the
# semantic functions take the op from their caller: the Python front end or the one-call C++
# API). A variable-op message is covered by a test of any of these ops.
FILE_OPS = {
    "algebra.cpp": ["sparse_add", "sparse_sub", "sparse_mul", "sparse_maximum", "sparse_minimum",
                    "sparse_cat_aligned", "union_coords", "intersection_coords"],
    "common.cpp": ["conv3d", "subm_conv3d", "conv_transpose3d", "generative_conv_transpose3d",
                   "pool3d", "sum_pool3d", "avg_pool3d", "max_pool3d", "pool_transpose3d",
                   "trilinear_upsample3d"],
    "conv.cpp": ["conv3d", "subm_conv3d", "conv_transpose3d", "generative_conv_transpose3d"],
    "coords.cpp": ["lookup_coords", "morton_codes", "morton_order", "downsample_coords", "crop",
                   "prune", "from_dense", "sparse_collate", "dense", "union_coords",
                   "intersection_coords"],
    "batch_norm.cpp": ["fused_batch_norm", "BatchNorm", "batch_norm"],
    "point_voxel.cpp": ["voxelize", "devoxelize", "build_point_voxel_map"],
    "pool.cpp": ["pool3d", "sum_pool3d", "avg_pool3d", "max_pool3d", "global_sum_pool",
                 "global_avg_pool", "global_max_pool", "pool_transpose3d", "trilinear_upsample3d"],
    "quantize.cpp": ["sparse_quantize", "voxelize", "build_point_voxel_map"],
    "quantized.cpp": ["linear", "conv3d", "subm_conv3d", "conv_transpose3d",
                      "generative_conv_transpose3d"],
}

THROWERS = ("throw_value_error", "throw_type_error")


# ---- extractor ---------------------------------------------------------------------------------


def _strip_comments(src: str) -> str:
    """Blank // and /* */ comments, keeping string literals and line numbers intact."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append(src[i:j + 1])
            i = j + 1
        elif src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join("\n" if ch == "\n" else " " for ch in src[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _split_args(src: str, open_paren: int) -> tuple[list[str], int]:
    """Top-level comma-separated arguments of the call whose '(' is at open_paren."""
    args, depth, cur, i = [], 0, [], open_paren + 1
    while i < len(src):
        c = src[i]
        if c == '"':
            j = i + 1
            while src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            cur.append(src[i:j + 1])
            i = j + 1
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                args.append("".join(cur).strip())
                return args, i
            depth -= 1
        elif c == "," and depth == 0:
            args.append("".join(cur).strip())
            cur = []
            i += 1
            continue
        cur.append(c)
        i += 1
    raise ValueError("unbalanced call")


_LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _literals(expr: str) -> list[str]:
    return [m.group(1).replace('\\"', '"') for m in _LITERAL.finditer(expr)]


def _pure_literal(expr: str) -> str | None:
    m = re.fullmatch(r'\s*"((?:[^"\\]|\\.)*)"\s*', expr)
    return m.group(1).replace('\\"', '"') if m else None


def _enclosing_function(src: str, pos: int) -> tuple[str, list[str]] | None:
    """Name and parameter names of the function definition that contains pos."""
    best = None
    for m in re.finditer(r"^[A-Za-z_][\w:<>,\s\*&]*?\b(\w+)\s*\(", src[:pos], re.M):
        best = m
    if best is None:
        return None
    try:
        params, _ = _split_args(src, best.end() - 1)
    except (ValueError, IndexError):
        return None
    names = []
    for p in params:
        p = p.split("=")[0].strip()
        m = re.search(r"(\w+)\s*$", p)
        names.append(m.group(1) if m else "")
    return best.group(1), names


def _caller_literals(src: str, func: str, index: int, def_pos: int) -> set[str]:
    """String literals passed at position `index` by the calls of `func` in this file."""
    out = set()
    for m in re.finditer(rf"\b{re.escape(func)}\s*\(", src):
        try:
            args, _ = _split_args(src, m.end() - 1)
        except (ValueError, IndexError):
            continue
        if index < len(args):
            lit = _pure_literal(args[index])
            if lit is not None:
                out.add(lit)
    return out


def extract_sites(src: str, filename: str, file_ops: list[str] | None = None) -> list[dict]:
    """Every throw_value_error / throw_type_error call of a C++ source text.

    Returns dicts with line, kind, ops (set of op names), args (set of argument names, or None
    when unresolvable), expected and got (fixed fragments or None)."""
    text = _strip_comments(src)
    consts = dict(re.findall(r'\b(k\w+)\s*=\s*"([^"]+)"', text))
    sites = []
    for m in re.finditer(rf"\b({'|'.join(THROWERS)})\s*\(", text):
        # skip the declaration/definition of the helpers themselves
        before = text[max(0, m.start() - 30):m.start()]
        if re.search(r"void\s*(\]\])?\s*$", before) or "noreturn" in before:
            continue
        args, _ = _split_args(text, m.end() - 1)
        if len(args) != 4:
            raise AssertionError(f"{filename}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(1)} "
                                 f"with {len(args)} arguments")
        op_e, arg_e, exp_e, got_e = args
        line = text.count("\n", 0, m.start()) + 1
        op_lit = _pure_literal(op_e)
        if op_lit is not None:
            ops = {op_lit}
        elif op_e in consts:
            ops = {consts[op_e]}
        else:
            ops = set(file_ops or [])
        arg_lit = _pure_literal(arg_e)
        if arg_lit is not None:
            args_set = {arg_lit}
        else:
            args_set = None
            enc = _enclosing_function(text, m.start())
            if enc and arg_e in enc[1]:
                lits = _caller_literals(text, enc[0], enc[1].index(arg_e), m.start())
                args_set = lits or None
        exp_lits = [s for s in _literals(exp_e) if len(s.strip(" ()")) >= 3]
        got_lit = _pure_literal(got_e)
        sites.append({
            "file": filename, "line": line, "kind": "TypeError" if "type" in m.group(1) else "ValueError",
            "ops": ops, "args": args_set,
            "expected": exp_lits[0] if exp_lits else None,
            "got": got_lit if got_lit and len(got_lit) >= 3 else None,
        })
    return sites


# ---- matcher -----------------------------------------------------------------------------------


def split_test_blocks(text: str, suffix: str) -> list[str]:
    """Split a test file into test blocks (decorators + function / TEST body)."""
    if suffix == ".py":
        starts = [m.start() for m in re.finditer(r"^(?:@|def |async def |class )", text, re.M)]
        # merge decorator lines into the following def
        blocks, cur_start = [], None
        for a, b in zip(starts, starts[1:] + [len(text)]):
            if cur_start is None:
                cur_start = a
            if text.startswith("@", a):
                continue
            blocks.append(text[cur_start:b])
            cur_start = None
        return blocks
    starts = [m.start() for m in re.finditer(r"^(?:TEST|TEST_P|TEST_F)\s*\(", text, re.M)]
    return [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)])]


def load_test_blocks(dirs=TEST_DIRS) -> list[str]:
    blocks = []
    for d in dirs:
        for p in sorted(d.glob("*")):
            if p.suffix not in (".py", ".cpp") or p.name == pathlib.Path(__file__).name:
                continue
            blocks += [b.replace("\\", "") for b in split_test_blocks(p.read_text(), p.suffix)]
    return blocks


def _has_word(block: str, word: str) -> bool:
    return re.search(rf"(?<![\w]){re.escape(word)}(?![\w])", block) is not None


# A fixed fragment counts when its first PREFIX characters appear (tests often match a prefix
# of a long message, e.g. "odd sizes on every axis" of "odd sizes on every axis for a ...").
PREFIX = 20


def covered(site: dict, blocks: list[str]) -> bool:
    for b in blocks:
        if "expected" not in b:
            continue
        if not any(_has_word(b, op) for op in site["ops"]):
            continue
        if site["args"] is not None and not any(_has_word(b, a) for a in site["args"]):
            continue
        if site["expected"] and site["expected"][:PREFIX] not in b:
            continue
        if site["got"] and site["got"][:PREFIX] not in b:
            continue
        return True
    return False


def all_sites() -> list[dict]:
    sites = []
    for p in sorted(OPS_DIR.glob("*.cpp")):
        sites += extract_sites(p.read_text(), p.name, FILE_OPS.get(p.name))
    return sites


# ---- the checks --------------------------------------------------------------------------------


def test_every_file_with_variable_op_messages_has_an_op_list():
    for p in sorted(OPS_DIR.glob("*.cpp")):
        for s in extract_sites(p.read_text(), p.name, FILE_OPS.get(p.name)):
            assert s["ops"], f"{p.name}:{s['line']}: variable op name; add {p.name} to FILE_OPS"


def test_file_ops_name_real_ops():
    """FILE_OPS must not go stale: each name is an op string somewhere in src/ or python/."""
    corpus = "".join(p.read_text() for p in (ROOT / "src").rglob("*.cpp"))
    corpus += "".join(p.read_text() for p in (ROOT / "python").rglob("*.py"))
    corpus += "".join(p.read_text() for p in (ROOT / "python" / "bindings").glob("*.cpp"))
    for f, names in FILE_OPS.items():
        assert (OPS_DIR / f).exists(), f
        for n in names:
            assert f'"{n}"' in corpus or f"'{n}'" in corpus, f"FILE_OPS[{f}]: {n} is not an op name"


def test_the_extractor_finds_a_plausible_number_of_sites():
    sites = all_sites()
    # 132 call sites at the time of writing; a drastic drop means the extractor broke.
    assert len(sites) >= 120, len(sites)
    by_file = {s["file"] for s in sites}
    assert {"conv.cpp", "pool.cpp", "quantize.cpp", "quantized.cpp", "point_voxel.cpp"} <= by_file


@pytest.mark.parametrize("site", all_sites(), ids=lambda s: f"{s['file']}:{s['line']}")
def test_validation_message_has_a_test(site):
    blocks = _BLOCKS()
    assert covered(site, blocks), (
        f"no test checks the message of {site['file']}:{site['line']} "
        f"([{'|'.join(sorted(site['ops']))}] {'|'.join(sorted(site['args'] or ['<any>']))}: "
        f"expected {site['expected']!r} ..., got {site['got']!r})")


_cache: list[str] = []


def _BLOCKS() -> list[str]:
    if not _cache:
        _cache.extend(load_test_blocks())
    return _cache


# ---- the extractor and matcher on fake inputs (so this file can fail) --------------------------

FAKE_SRC = r'''
// throw_value_error("commented", "out", "x", "y");  must be ignored
constexpr std::string_view kName = "fake_named";
void check_thing(std::string_view op, std::string_view what, const Array& a) {
  if (!a.defined()) throw_value_error(op, what, "an (N, C) array", "nothing");
}
void run(const Array& a) {
  check_thing("fake_op", "feats", a);
  check_thing("fake_op", "grad_out", a);
  if (a.ndim() != 2)
    throw_type_error(
        "fake_op", "weight",
        "shape (C_out=" + std::to_string(3) + ",)",
        format_shape(a.shape()));
  throw_value_error(kName, "bias", std::string("float32") + " (the dtype)", to_string(a.dtype()));
  throw_value_error(plan.op, "coords", expected, "a \"quoted\" got");
}
'''


def test_extractor_on_a_fake_source():
    sites = extract_sites(FAKE_SRC, "fake.cpp", ["fake_public"])
    assert [(s["line"], s["kind"]) for s in sites] == [
        (5, "ValueError"), (11, "TypeError"), (15, "ValueError"), (16, "ValueError")]
    a, b, c, d = sites
    assert a["ops"] == {"fake_public"} and a["args"] == {"feats", "grad_out"}
    assert a["expected"] == "an (N, C) array" and a["got"] == "nothing"
    assert b["ops"] == {"fake_op"} and b["args"] == {"weight"}
    assert b["expected"] == "shape (C_out=" and b["got"] is None
    assert c["ops"] == {"fake_named"} and c["args"] == {"bias"} and c["expected"] == "float32"
    assert d["ops"] == {"fake_public"} and d["expected"] is None and d["got"] == 'a "quoted" got'


def test_matcher_on_a_fake_corpus():
    sites = extract_sites(FAKE_SRC, "fake.cpp", ["fake_public"])
    py = (
        "@pytest.mark.parametrize('arg', ['grad_out'])\n"
        "def test_a(arg):\n"
        "    with pytest.raises(ValueError, match=rf'^\\[fake_public\\] {arg}: expected an \\(N, C\\) array, got nothing'):\n"
        "        pass\n"
        "def test_b():\n"
        "    with pytest.raises(TypeError, match=r'^\\[fake_op\\] weight: expected shape \\(C_out=3,\\)'):\n"
        "        pass\n")
    blocks = [b.replace("\\", "") for b in split_test_blocks(py, ".py")]
    assert len(blocks) == 2 and blocks[0].startswith("@pytest")
    assert covered(sites[0], blocks)  # parametrized argument and escaped regex
    assert covered(sites[1], blocks)
    assert not covered(sites[2], blocks)  # no [fake_named] bias test
    assert not covered(sites[3], blocks)
    # The op, the argument and the fixed text must be in the *same* block.
    split = [b.replace("\\", "") for b in split_test_blocks(
        "def test_x():\n    fake_op\n    expected\ndef test_y():\n    weight shape (C_out=\n", ".py")]
    assert not covered(sites[1], split)
    cpp = ('TEST(Fake, Bias) {\n  expect_message([&] { f(); }, "[fake_named] bias: expected float32 (the dtype), got int32");\n}\n'
           'TEST(Fake, Other) {\n  ok();\n}\n')
    cblocks = split_test_blocks(cpp, ".cpp")
    assert len(cblocks) == 2
    assert covered(sites[2], cblocks) and not covered(sites[1], cblocks)
