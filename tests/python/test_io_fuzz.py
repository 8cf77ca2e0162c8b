"""Fuzz test of the lattice.io readers: seeded random truncations, byte flips, header-digit edits
and splices of small valid files of every format variant (tests/python/io_samples.py), a few
thousand cases in all. Each case must return a result or raise ValueError; any other exception,
or a crash, fails.

The loop runs in a child process (this file run as a script), so a segfault or abort shows up as
a failed test with the case that caused it (its bytes are kept in the test's tmp folder), not as
a dead test runner. A crash's last case is the last line of the child's stderr; the bytes of a
case that raised another exception are kept as failing_case.bin in the test's tmp folder.
"""
from __future__ import annotations

import json
import os
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


def mutate(data: bytes, rng: np.random.Generator) -> tuple[str, bytes]:
    """One seeded mutation of ``data`` and a short description of it."""
    kind = int(rng.integers(0, 10))
    n = len(data)
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
    counts = {"cases": 0, "value_error": 0, "ok": 0}
    start = time.perf_counter()
    for sample in samples:
        data = sample.read_bytes()
        lio.read(sample)  # the unmutated file is valid
        target = work / sample.name
        for k in range(CASES_PER_FILE):
            what, mutated = mutate(data, rng)
            target.write_bytes(mutated)
            # Printed before the call, so a crash leaves the case behind (the parent reads stderr).
            print(f"{sample.name} case {k}: {what}", file=sys.stderr, flush=True)
            counts["cases"] += 1
            try:
                lio.read(target)
                counts["ok"] += 1
            except ValueError:
                counts["value_error"] += 1
            except BaseException as exc:  # noqa: BLE001 - the point of the test
                (folder / "failing_case.bin").write_bytes(mutated)
                print(json.dumps({"error": f"{sample.name} case {k} ({what}): {type(exc).__name__}: {exc}"}))
                return 1
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
    assert summary["seconds"] < TIME_LIMIT_S, f"fuzz loop took {summary['seconds']:.1f} s"


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.exit(child(Path(sys.argv[2])))
    sys.exit("usage: test_io_fuzz.py --child FOLDER")
