"""Fuzz test of the lattice.io readers: seeded random truncations, byte and bit flips, header-digit
edits and lying binary counts, non-UTF-8 header text, and splices of small valid files of every
format variant (KITTI .bin / .label, LAS, PCD, PLY: tests/python/io_samples.py), a few thousand
cases in all, the same on every run. Each case must:

* return a result, or raise ValueError of the readers' form ``[read_<format>] <path>: expected
  ..., got ...`` (never a UnicodeDecodeError, MemoryError or anything else), and not crash;
* finish in bounded time (CASE_LIMIT_S per case; the whole loop TIME_LIMIT_S);
* allocate no more than the file justifies: the process's peak address space (VmPeak) may not
  grow by more than ALLOC_LIMIT_MB over the loop (the files are a few hundred bytes; io.h bounds
  every allocation by a small multiple of the file size), and the address space is capped
  (RLIMIT_AS) so that a lying count that does allocate fails as a MemoryError instead of
  swapping. Under AddressSanitizer (make test-sanitize) the cap is ASan's max_allocation_size_mb;
* for a non-UTF-8 byte written into free header text (LAS system / software fields, a PLY
  comment, the PCD comment line), read the same values as the unmutated file (binary fields
  never depend on text decoding).

The loop runs in a child process (this file run as a script), so a segfault or abort shows up as
a failed test with the case that caused it (its bytes are kept in the test's tmp folder), not as
a dead test runner. A crash's last case is the last line of the child's stderr; the bytes of a
case that raised another exception are kept as failing_case.bin in the test's tmp folder.
"""
from __future__ import annotations

import json
import os
import re
import struct
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SEED = 20240605
CASES_PER_FILE = 200  # x 17 sample files = 3,400 cases
TIME_LIMIT_S = 20.0
CASE_LIMIT_S = 2.0
ALLOC_LIMIT_MB = 64
UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")
if UNDER_ASAN:  # make test-sanitize: the instrumented readers run a few times slower
    TIME_LIMIT_S, CASE_LIMIT_S = 5 * TIME_LIMIT_S, 5 * CASE_LIMIT_S


def _text_spans(name: str, data: bytes) -> list[tuple[int, int]]:
    """[start, end) byte ranges of free header text a non-UTF-8 byte may go into without changing
    what the file means (LAS system identifier and generating software, a PLY comment line, the
    PCD comment line)."""
    if name.endswith(".las"):
        return [(26, 26 + 32), (58, 58 + 32)]
    for marker in (b"comment ", b"# .PCD"):
        at = data.find(marker)
        if 0 <= at < 400:
            end = data.index(b"\n", at)
            return [(at + len(marker), end)]
    return []


def _lying_count(name: str, data: bytes, rng: np.random.Generator) -> tuple[str, bytes] | None:
    """A binary header count or size replaced by a huge or off-by-a-bit value (LAS: point offset,
    record length, legacy and 64-bit point counts)."""
    if not name.endswith(".las"):
        return None
    fields = [(96, "<I"), (105, "<H"), (107, "<I")] + ([(247, "<Q")] if len(data) >= 255 else [])
    at, fmt = fields[int(rng.integers(0, len(fields)))]
    size = struct.calcsize(fmt)
    old = int.from_bytes(data[at:at + size], "little")
    top = 2 ** (8 * size) - 1
    new = int(rng.choice([top, top // 2, old + 1, max(old - 1, 0), old * 1000, 2**31])) % (top + 1)
    return f"count at {at} {old} -> {new}", data[:at] + struct.pack(fmt, new) + data[at + size:]


def _vm_peak_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmPeak:"):
                return int(line.split()[1])
    return 0


def mutate(data: bytes, rng: np.random.Generator, name: str = "") -> tuple[str, bytes]:
    """One seeded mutation of ``data`` and a short description of it. Descriptions starting with
    "text" keep the file's meaning (the values must read back unchanged)."""
    kind = int(rng.integers(0, 14))
    n = len(data)
    if kind == 10:  # one bit flipped
        at, bit = int(rng.integers(0, n)), int(rng.integers(0, 8))
        b = bytearray(data)
        b[at] ^= 1 << bit
        return f"bit {bit} of byte {at}", bytes(b)
    if kind == 11:  # a lying binary count (LAS); else a number grown in a text header below
        lie = _lying_count(name, data, rng)
        if lie:
            return lie
        kind = 7
    if kind in (12, 13):  # non-UTF-8 bytes in header text
        spans = _text_spans(name, data)
        if spans:
            a, b = spans[int(rng.integers(0, len(spans)))]
            if b > a:
                at = int(rng.integers(a, b))
                junk = bytes(rng.choice([b"\xe9", b"\xff", b"\xc3", b"\x80\x80", b"\xed\xa0\x80", b"\xf8"]))
                if kind == 12:  # in free text: the meaning is unchanged
                    return f"text {junk!r} at {at}", data[:at] + junk[: b - at] + data[at + len(junk[: b - at]):]
        # anywhere in the first 200 bytes (a field / property name, a keyword)
        at = int(rng.integers(0, min(n, 200)))
        return f"non-utf8 at {at}", data[:at] + b"\xe9" + data[at + 1:]
    if kind < 3:  # truncation
        cut = int(rng.integers(0, n))
        return f"truncate to {cut}", data[:cut]
    if kind < 7:  # 1-4 random bytes replaced
        b = bytearray(data)
        where = rng.integers(0, n, int(rng.integers(1, 5)))
        for w in where:
            b[int(w)] = int(rng.integers(0, 256))
        return f"flip bytes {where.tolist()}", bytes(b)
    if kind < 9:  # a header digit changed or a number grown (counts, sizes, widths)
        head = data[: min(n, 400)]
        digits = [i for i, c in enumerate(head) if 48 <= c <= 57]
        if digits:
            i = int(rng.choice(digits))
            grow = bytes(rng.choice([b"9", b"99999", b"0", b"18446744073709551615", b"-1"]))
            return f"digit {i} -> {grow!r}", data[:i] + grow + data[i + 1:]
    # a chunk deleted or duplicated
    a = int(rng.integers(0, n))
    b = int(rng.integers(a, min(n, a + 64) + 1))
    if rng.integers(0, 2):
        return f"delete [{a}:{b}]", data[:a] + data[b:]
    return f"duplicate [{a}:{b}]", data[:b] + data[a:b] + data[b:]


def child(folder: Path) -> int:
    """The fuzz loop (runs in the child process). Prints one JSON summary line."""
    import lattice.io as lio
    from io_samples import sample_files

    samples = sample_files(folder / "samples", seed=SEED)
    rng = np.random.default_rng(SEED)
    work = folder / "work"
    work.mkdir(exist_ok=True)
    counts = {"cases": 0, "value_error": 0, "ok": 0, "text_same_values": 0, "max_case_s": 0.0}
    originals = {}
    for sample in samples:  # the unmutated files are valid (and every code path is loaded)
        originals[sample.name] = lio.read(sample)
    if not UNDER_ASAN:  # ASan reserves terabytes of shadow; it caps allocations itself
        import resource

        size_kb = int(next(line for line in open("/proc/self/status") if line.startswith("VmSize:")).split()[1])
        cap = size_kb * 1024 + (4 << 30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))
    peak0 = _vm_peak_kb()
    start = time.perf_counter()

    def fail(k: int, what: str, mutated: bytes, why: str) -> int:
        (folder / "failing_case.bin").write_bytes(mutated)
        print(json.dumps({"error": f"{sample.name} case {k} ({what}): {why}"}))
        return 1

    for sample in samples:
        data = sample.read_bytes()
        target = work / sample.name
        for k in range(CASES_PER_FILE):
            what, mutated = mutate(data, rng, sample.name)
            target.write_bytes(mutated)
            # Printed before the call, so a crash leaves the case behind (the parent reads stderr).
            print(f"{sample.name} case {k}: {what}", file=sys.stderr, flush=True)
            counts["cases"] += 1
            t0 = time.perf_counter()
            try:
                cloud = lio.read(target)
                counts["ok"] += 1
            except UnicodeError as exc:  # a ValueError subclass, but never the readers' answer
                return fail(k, what, mutated, f"{type(exc).__name__}: {exc}")
            except ValueError as exc:
                counts["value_error"] += 1
                cloud = None
                op = "read_kitti_labels" if sample.name.endswith(".label") else r"read_\w+"
                if not re.match(rf"^\[{op}\] {re.escape(str(target))}: expected .+, got ", str(exc), re.S):
                    return fail(k, what, mutated, f"ValueError not of the readers' form: {exc}")
            except BaseException as exc:  # noqa: BLE001 - the point of the test
                return fail(k, what, mutated, f"{type(exc).__name__}: {exc}")
            took = time.perf_counter() - t0
            counts["max_case_s"] = max(counts["max_case_s"], took)
            if took > CASE_LIMIT_S:
                return fail(k, what, mutated, f"took {took:.2f} s (limit {CASE_LIMIT_S} s)")
            if not UNDER_ASAN and _vm_peak_kb() - peak0 > ALLOC_LIMIT_MB * 1024:
                return fail(k, what, mutated, f"peak address space grew by {(_vm_peak_kb() - peak0) // 1024} MiB "
                                              f"for a file of {len(mutated)} bytes")
            if what.startswith("text "):
                want = originals[sample.name]
                if cloud is None:
                    return fail(k, what, mutated, "a non-UTF-8 byte in free header text made the file unreadable")
                got_values, want_values = list(cloud.values()), list(want.values())
                if len(got_values) != len(want_values) or not all(
                        np.array_equal(a, b, equal_nan=a.dtype.kind == "f") for a, b in zip(got_values, want_values)):
                    return fail(k, what, mutated, "a non-UTF-8 byte in free header text changed the values")
                counts["text_same_values"] += 1
    counts["seconds"] = time.perf_counter() - start
    print(json.dumps(counts))
    return 0


def _scratch_dir(tmp_path: Path) -> Path:
    """A folder in memory (/dev/shm) when there is one: each case writes a file, and a disk-backed
    /tmp can take milliseconds per write."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return Path(tempfile.mkdtemp(prefix="lattice_io_fuzz_", dir=shm))
    return tmp_path


def test_io_fuzz_truncations_and_flips_only_raise_value_error(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "python"), str(HERE), env.get("PYTHONPATH", "")])
    if UNDER_ASAN:  # a lying count that allocates fails (MemoryError) instead of succeeding
        env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":max_allocation_size_mb=256:allocator_may_return_null=1"
    scratch = _scratch_dir(tmp_path)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", str(scratch)],
            env=env, capture_output=True, text=True, timeout=300,
        )
    finally:
        if scratch != tmp_path:  # keep a failing case where pytest keeps tmp folders
            if (scratch / "failing_case.bin").exists():
                shutil.copy(scratch / "failing_case.bin", tmp_path / "failing_case.bin")
            shutil.rmtree(scratch, ignore_errors=True)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, (
        f"fuzz child failed with exit code {proc.returncode} (negative: killed by that signal); "
        f"last cases (stderr): {proc.stderr[-2000:]}\nstdout: {proc.stdout[-2000:]}"
    )
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"fuzz: {summary} (child wall {wall:.1f} s)")
    assert summary["cases"] == 17 * CASES_PER_FILE
    # Both outcomes occur often: the mutations reach past the headers and the checks.
    assert summary["value_error"] > summary["cases"] // 4 and summary["ok"] > summary["cases"] // 20
    assert summary["text_same_values"] > 100  # the non-UTF-8 text cases ran (and read back the same values)
    assert summary["seconds"] < TIME_LIMIT_S, f"fuzz loop took {summary['seconds']:.1f} s"


def test_the_allocation_bound_sees_an_untouched_allocation():
    """The VmPeak bound of the fuzz loop can fail: in a fresh process, an allocation that is never
    touched (as a reader's output array for a lying count would be before the size check) raises
    the peak address space by its size."""
    code = ("import numpy as np, sys; sys.path.insert(0, sys.argv[1]); from test_io_fuzz import _vm_peak_kb; "
            "p0 = _vm_peak_kb(); a = np.empty(256 << 20, np.uint8); print(_vm_peak_kb() - p0)")
    out = subprocess.run([sys.executable, "-c", code, str(HERE)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "python"), str(HERE)])})
    assert out.returncode == 0, out.stderr
    if UNDER_ASAN:  # ASan's allocator maps its own regions; the loop relies on max_allocation_size_mb there
        return
    assert int(out.stdout.split()[-1]) >= 250 * 1024 > ALLOC_LIMIT_MB * 1024


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.exit(child(Path(sys.argv[2])))
    sys.exit("usage: test_io_fuzz.py --child FOLDER")
