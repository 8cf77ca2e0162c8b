#!/usr/bin/env python3
"""Mutation runner: applies each mutant in tests/mutants/ to the tree, rebuilds incrementally,
runs the tests mapped to it and reports killed / survived (tests/mutants/README.md, the format;
docs/testing.md, how to read the report).

A mutant is a small, real bug (the kind a refactor makes) written as exact search/replace edits.
For each selected mutant the runner

1. checks that every edit's old snippet occurs exactly once in its file (else: "stale", the code
   moved; re-point the snippet), and that the mapped test files exist (a missing one is reported,
   never counted as a kill);
2. writes the edits, rebuilds only the targets the mapped tests need (lattice_cpp_tests for a
   gtest filter, the _lattice extension for pytest) in its own build folder (CUDA off), and
3. runs the gtest filter, then the pytest targets (stopping at the first failure), with
   LATTICE_EXTENSION_DIR pointing at the mutant build's extension, so the tests load it;
4. restores the original bytes of every mutated file (try/finally, also on Ctrl-C / SIGTERM).

Results: killed (a mapped test failed, crashed or timed out), survived (all mapped tests passed:
a hole in the suite, or an equivalent mutant), stillborn (the mutant does not compile: a defect
of the mutant, counted apart), stale (an old snippet is missing or ambiguous), no tests (every
mapped test file is missing). Before the mutants, the union of their tests runs once on the clean
tree (a test that already fails would "kill" everything); --no-baseline skips that.

It refuses to start when a file it would mutate has uncommitted changes (a restore must give
back exactly the committed text), and it runs mutants one after another.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
MUTANT_DIR = REPO / "tests" / "mutants"
GTEST_BINARY = "lattice_cpp_tests"
EXTENSION_TARGET = "_lattice"

OLD_MARK = "<<<< old"
NEW_MARK = "==== new"
END_MARK = ">>>> end"
HEADER_KEYS = {"name", "area", "bug", "file", "pytest", "gtest"}


# ---------------------------------------------------------------- mutant files
@dataclass
class Edit:
    path: str  # relative to the repo root
    old: str
    new: str


@dataclass
class Mutant:
    name: str
    source: Path
    area: str
    bug: str
    pytest: list[str]
    gtest: str
    edits: list[Edit]

    @property
    def files(self) -> list[str]:
        return sorted({e.path for e in self.edits})

    def tests_label(self) -> str:
        parts = []
        if self.gtest:
            parts.append(f"gtest {self.gtest}")
        parts.extend(self.pytest)
        return "; ".join(parts)


class MutantFormatError(ValueError):
    pass


def parse_mutant(path: Path) -> Mutant:
    """Parses one NAME.mutant file (format: tests/mutants/README.md)."""
    header: dict[str, str] = {}
    edits: list[Edit] = []
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    i = 0

    def fail(msg: str) -> MutantFormatError:
        return MutantFormatError(f"{path.name}:{i + 1}: {msg}")

    last_key: Optional[str] = None
    while i < len(lines):
        line = lines[i]
        stripped = line.rstrip("\n")
        if stripped.startswith(OLD_MARK):
            target = stripped[len(OLD_MARK):].strip() or header.get("file", "")
            if not target:
                raise fail("an edit without a file (no 'file:' header and none after '<<<< old')")
            old: list[str] = []
            new: list[str] = []
            i += 1
            while i < len(lines) and lines[i].rstrip("\n") != NEW_MARK:
                if lines[i].startswith(OLD_MARK) or lines[i].rstrip("\n") == END_MARK:
                    raise fail(f"expected '{NEW_MARK}' before this marker")
                old.append(lines[i])
                i += 1
            if i == len(lines):
                raise fail(f"missing '{NEW_MARK}'")
            i += 1
            while i < len(lines) and lines[i].rstrip("\n") != END_MARK:
                if lines[i].startswith(OLD_MARK) or lines[i].rstrip("\n") == NEW_MARK:
                    raise fail(f"expected '{END_MARK}' before this marker")
                new.append(lines[i])
                i += 1
            if i == len(lines):
                raise fail(f"missing '{END_MARK}'")
            old_text, new_text = "".join(old), "".join(new)
            if not old_text.strip():
                raise fail("an empty old snippet")
            if old_text == new_text:
                raise fail("old and new snippets are identical")
            edits.append(Edit(target, old_text, new_text))
            last_key = None
            i += 1
            continue
        if edits:
            if stripped.strip() and not stripped.lstrip().startswith("#"):
                raise fail("text after the edits must be an edit or a '#' comment")
            i += 1
            continue
        if not stripped.strip() or stripped.lstrip().startswith("#"):
            last_key = None
            i += 1
            continue
        m = re.match(r"^([a-z]+):\s*(.*)$", stripped)
        if m and m.group(1) in HEADER_KEYS:
            last_key = m.group(1)
            header[last_key] = m.group(2).strip()
        elif line[:1] in " \t" and last_key:  # continuation of the previous header value
            header[last_key] += " " + stripped.strip()
        else:
            raise fail(f"expected a header line 'KEY: value' (keys: {', '.join(sorted(HEADER_KEYS))})")
        i += 1
    if not edits:
        raise MutantFormatError(f"{path.name}: no edits ('{OLD_MARK}' ... '{NEW_MARK}' ... '{END_MARK}')")
    name = header.get("name") or path.stem
    if name != path.stem:
        raise MutantFormatError(f"{path.name}: name '{name}' differs from the file name")
    for key in ("area", "bug"):
        if not header.get(key):
            raise MutantFormatError(f"{path.name}: missing header '{key}:'")
    pytest_targets = shlex.split(header.get("pytest", ""))
    gtest = header.get("gtest", "").strip()
    if not pytest_targets and not gtest:
        raise MutantFormatError(f"{path.name}: maps no tests (needs 'pytest:' and/or 'gtest:')")
    return Mutant(name, path, header["area"], header["bug"], pytest_targets, gtest, edits)


def load_mutants() -> list[Mutant]:
    mutants = [parse_mutant(p) for p in sorted(MUTANT_DIR.glob("*.mutant"))]
    seen: set[str] = set()
    for m in mutants:
        if m.name in seen:
            raise MutantFormatError(f"duplicate mutant name {m.name}")
        seen.add(m.name)
    return mutants


# ---------------------------------------------------------------- results
@dataclass
class Result:
    mutant: Mutant
    status: str  # killed | survived | stillborn | stale | no tests | error
    detail: str = ""
    killed_by: str = ""
    build_s: float = 0.0
    test_s: float = 0.0
    missing: list[str] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return self.build_s + self.test_s


def pytest_file(target: str) -> str:
    return target.split("::", 1)[0]


def staleness(m: Mutant) -> str:
    """Why the mutant no longer applies, or ''."""
    problems = []
    for e in m.edits:
        p = REPO / e.path
        if not p.is_file():
            problems.append(f"{e.path}: file not found")
            continue
        n = p.read_text(encoding="utf-8").count(e.old)
        if n != 1:
            first = e.old.strip().splitlines()[0].strip()
            problems.append(f"{e.path}: old snippet '{first[:60]}' occurs {n} times (expected once)")
    # Two edits of one file must not overlap: apply them in turn on a scratch copy.
    by_file: dict[str, str] = {}
    for e in m.edits:
        if not (REPO / e.path).is_file():
            continue
        text = by_file.setdefault(e.path, (REPO / e.path).read_text(encoding="utf-8"))
        if text.count(e.old) == 1:
            by_file[e.path] = text.replace(e.old, e.new, 1)
        elif not problems:
            problems.append(f"{e.path}: edits overlap (an earlier edit removed a later old snippet)")
    return "; ".join(problems)


# ---------------------------------------------------------------- process helpers
def run(cmd: list[str], *, cwd: Path = REPO, env: Optional[dict] = None, timeout: Optional[float] = None,
        log: Optional[Path] = None) -> tuple[int, str, bool]:
    """Runs cmd; returns (returncode, combined output, timed_out). Kills the whole process group
    on timeout (only the group this runner started)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        timed_out = True
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"$ {shlex.join(cmd)}\n{out}\n[rc={proc.returncode} timed_out={timed_out}]\n")
    return proc.returncode, out, timed_out


def tail(text: str, n: int = 15) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])


class Runner:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.build = (REPO / args.build).resolve() if not Path(args.build).is_absolute() else Path(args.build)
        self.ext_dir = self.build / "python"
        self.logs = self.build / "mutant-logs"
        self.python = args.python

    # ---- environment
    def test_env(self) -> dict:
        env = dict(os.environ)
        paths = [str(REPO / "python")]
        pydeps = self.build / "pydeps"
        if pydeps.is_dir():
            paths.append(str(pydeps))
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["LATTICE_EXTENSION_DIR"] = str(self.ext_dir)
        env.setdefault("OMP_NUM_THREADS", str(self.args.jobs))
        return env

    def configure(self) -> None:
        """Configures the mutant build (CUDA off, extension into BUILD/python) when needed."""
        cache = self.build / "CMakeCache.txt"
        want = f"LATTICE_PYTHON_OUTPUT_DIR:PATH={self.ext_dir}"
        if (self.build / "build.ninja").is_file() and cache.is_file():
            text = cache.read_text(errors="replace")
            if want in text and "LATTICE_CUDA:STRING=OFF" in text:
                return
        print(f"mutants: configuring {self.build} (CUDA off, extension in {self.ext_dir})", flush=True)
        cmd = ["cmake", "-S", str(REPO), "-B", str(self.build), "-G", "Ninja",
               f"-DCMAKE_BUILD_TYPE={self.args.build_type}", "-DLATTICE_CUDA=OFF",
               f"-DPython_EXECUTABLE={self.python}", f"-DLATTICE_PYTHON_OUTPUT_DIR={self.ext_dir}"]
        rc, out, _ = run(cmd, log=self.logs / "configure.log")
        if rc != 0:
            sys.exit(f"mutants: cmake configure failed:\n{tail(out)}")

    def build_targets(self, targets: list[str], log: Path) -> tuple[bool, str, float]:
        t0 = time.monotonic()
        rc, out, timed_out = run(["cmake", "--build", str(self.build), "-j", str(self.args.jobs),
                                  "--target", *targets], log=log, timeout=self.args.build_timeout)
        ok = rc == 0 and not timed_out
        return ok, out, time.monotonic() - t0

    def check_extension(self) -> None:
        """The tests must load the mutant build's extension, not python/lattice/_lattice*.so."""
        code = "import lattice._core as c; print(c.core.__file__)"
        rc, out, _ = run([self.python, "-c", code], env=self.test_env())
        loaded = out.strip().splitlines()[-1] if out.strip() else ""
        if rc != 0 or not loaded.startswith(str(self.ext_dir)):
            sys.exit(f"mutants: the tests would not load the extension of {self.ext_dir}:\n{tail(out)}")

    # ---- tests
    def targets_for(self, m: Mutant) -> list[str]:
        t = []
        if m.gtest:
            t.append(GTEST_BINARY)
        if any((REPO / pytest_file(p)).exists() for p in m.pytest):
            t.append(EXTENSION_TARGET)
        return t

    def run_gtest(self, filt: str, log: Path) -> tuple[str, str, float]:
        """-> (verdict pass|fail|error, first failing test or message, seconds)."""
        t0 = time.monotonic()
        binary = self.build / GTEST_BINARY
        rc, out, timed_out = run([str(binary), f"--gtest_filter={filt}", "--gtest_brief=1"],
                                 env=self.test_env(), timeout=self.args.test_timeout, log=log)
        dt = time.monotonic() - t0
        if timed_out:
            return "fail", f"gtest timed out after {self.args.test_timeout:.0f} s", dt
        ran = re.search(r"\[==========\] (\d+) tests? from", out)
        if rc == 0:
            if not ran or ran.group(1) == "0":
                return "error", f"gtest filter '{filt}' matches no test", dt
            return "pass", "", dt
        failed = [f.rstrip(",") for f in re.findall(r"^\[  FAILED  \] (\S+)", out, re.M)]
        if failed:
            return "fail", f"gtest {failed[0]}" + (f" (+{len(set(failed)) - 1})" if len(set(failed)) > 1 else ""), dt
        return "fail", f"gtest exited with {rc} (crash?)", dt

    def run_pytest(self, targets: list[str], log: Path, stop_first: bool = True) -> tuple[str, str, float]:
        t0 = time.monotonic()
        cmd = [self.python, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", *targets]
        if stop_first:
            cmd.insert(3, "-x")
        rc, out, timed_out = run(cmd, env=self.test_env(), timeout=self.args.test_timeout, log=log)
        dt = time.monotonic() - t0
        if timed_out:
            return "fail", f"pytest timed out after {self.args.test_timeout:.0f} s", dt
        if rc == 0:
            return "pass", "", dt
        if rc == 1:
            failed = re.findall(r"^FAILED (\S+)", out, re.M)
            return "fail", (failed[0] if failed else "pytest: a test failed"), dt
        if rc in (2, 3, 4, 5):  # interrupted / internal error / usage error / nothing collected
            errors = re.findall(r"^ERROR (\S+.*)$", out, re.M)
            why = {2: "interrupted or collection error", 3: "internal error", 4: "usage error",
                   5: "no tests collected"}[rc]
            return "error", f"pytest {why}: " + (errors[0] if errors else tail(out, 3)), dt
        return "fail", f"pytest exited with {rc} (crash?)", dt

    # ---- one mutant
    def run_mutant(self, m: Mutant) -> Result:
        why = staleness(m)
        if why:
            return Result(m, "stale", why)
        missing = [p for p in m.pytest if not (REPO / pytest_file(p)).exists()]
        present = [p for p in m.pytest if p not in missing]
        if not present and not m.gtest:
            return Result(m, "no tests", "test file missing: " + ", ".join(missing), missing=missing)
        originals = {path: (REPO / path).read_bytes() for path in m.files}
        r = Result(m, "survived", missing=missing)
        try:
            for path in m.files:
                text = originals[path].decode("utf-8")
                for e in m.edits:
                    if e.path == path:
                        text = text.replace(e.old, e.new, 1)
                (REPO / path).write_text(text, encoding="utf-8")
            ok, out, r.build_s = self.build_targets(self.targets_for(m), self.logs / f"{m.name}.build.log")
            if not ok:
                errs = [l for l in out.splitlines() if "error" in l.lower()]
                r.status, r.detail = "stillborn", (errs[0].strip() if errs else tail(out, 3))[:300]
                return r
            verdicts = []
            if m.gtest:
                v, who, dt = self.run_gtest(m.gtest, self.logs / f"{m.name}.gtest.log")
                r.test_s += dt
                verdicts.append((v, who))
            if present and not any(v == "fail" for v, _ in verdicts):
                v, who, dt = self.run_pytest(present, self.logs / f"{m.name}.pytest.log")
                r.test_s += dt
                verdicts.append((v, who))
            fails = [who for v, who in verdicts if v == "fail"]
            errors = [who for v, who in verdicts if v == "error"]
            if fails:
                r.status, r.killed_by = "killed", fails[0]
            elif errors:
                r.status, r.detail = "error", errors[0]
            if missing:
                r.detail = "; ".join(filter(None, [r.detail, "test file missing: " + ", ".join(missing)]))
            return r
        finally:
            for path, data in originals.items():
                (REPO / path).write_bytes(data)

    # ---- the whole run
    def baseline(self, mutants: list[Mutant]) -> None:
        """The union of the selected mutants' tests on the clean tree must pass."""
        targets = {t for m in mutants for t in self.targets_for(m)}
        if not targets:
            return
        print("mutants: building the clean tree ...", flush=True)
        ok, out, dt = self.build_targets(sorted(targets), self.logs / "baseline.build.log")
        if not ok:
            sys.exit(f"mutants: the clean tree does not build:\n{tail(out)}")
        print(f"mutants: clean build {dt:.0f} s", flush=True)
        if self.args.no_baseline:
            return
        filters = sorted({m.gtest for m in mutants if m.gtest})
        if filters:
            v, who, dt = self.run_gtest(":".join(filters), self.logs / "baseline.gtest.log")
            print(f"mutants: baseline gtest {v} ({dt:.0f} s) {who}", flush=True)
            if v != "pass":
                sys.exit(f"mutants: the mapped C++ tests fail on the clean tree ({who}); fix that first "
                         f"(log: {self.logs / 'baseline.gtest.log'})")
        py: list[str] = []
        for m in mutants:
            for p in m.pytest:
                if (REPO / pytest_file(p)).exists() and p not in py:
                    py.append(p)
        # A file given whole makes its node ids redundant (and pytest would run them twice).
        whole = {p for p in py if "::" not in p}
        py = [p for p in py if "::" not in p or pytest_file(p) not in whole]
        if py:
            v, who, dt = self.run_pytest(py, self.logs / "baseline.pytest.log", stop_first=False)
            print(f"mutants: baseline pytest {v} ({dt:.0f} s) {who}", flush=True)
            if v != "pass":
                sys.exit(f"mutants: the mapped Python tests fail on the clean tree ({who}); fix that first "
                         f"(log: {self.logs / 'baseline.pytest.log'})")


def dirty_files(paths: list[str]) -> list[str]:
    out = subprocess.run(["git", "status", "--porcelain", "--", *paths], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    return [l[3:] for l in out.splitlines() if l.strip()]


def git_commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
        return sha + (" (+ uncommitted changes)" if dirty else "")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"


def fmt_row(cols: list[str], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip()


def summarize(results: list[Result]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    return counts


def result_text(r: Result) -> str:
    s = r.status
    if r.status == "killed":
        s += f" by {r.killed_by}"
    if r.detail:
        s += f" [{r.detail}]"
    return s


def write_report(path: Path, results: list[Result], commit: str, started: str, wall: float) -> None:
    counts = summarize(results)
    lines = [
        f"Run {started}, commit {commit}, `make mutants` (CUDA off, sequential).",
        "",
        "Totals: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) +
        f"; {len(results)} mutants, {wall:.0f} s wall (builds + tests).",
        "",
        "| mutant | area | tests | result | build s | test s |",
        "|---|---|---|---|---:|---:|",
    ]
    for r in results:
        tests = r.mutant.tests_label().replace("|", "\\|")
        res = result_text(r).replace("|", "\\|")
        lines.append(f"| `{r.mutant.name}` | {r.mutant.area} | {tests} | {res} | {r.build_s:.0f} | {r.test_s:.0f} |")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="mutants to run (default: all); same as --only")
    ap.add_argument("--only", default="", help="comma- or space-separated mutant names")
    ap.add_argument("--list", action="store_true", help="list the mutants and their tests, run nothing")
    ap.add_argument("--build", default="build-mutants", help="build folder (default: build-mutants)")
    ap.add_argument("--jobs", type=int, default=2, help="parallel build jobs and OMP threads (default 2)")
    ap.add_argument("--build-type", default="Release")
    ap.add_argument("--python", default="/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable)
    ap.add_argument("--report", default="", help="write a markdown report (table) to this file")
    ap.add_argument("--no-baseline", action="store_true", help="skip running the tests on the clean tree")
    ap.add_argument("--test-timeout", type=float, default=600.0, help="seconds per test command")
    ap.add_argument("--build-timeout", type=float, default=1800.0, help="seconds per build")
    args = ap.parse_args(argv)

    try:
        mutants = load_mutants()
    except MutantFormatError as exc:
        print(f"mutants: {exc}", file=sys.stderr)
        return 2
    wanted = [n for n in re.split(r"[,\s]+", args.only) if n] + args.names
    if wanted:
        by_name = {m.name: m for m in mutants}
        unknown = [n for n in wanted if n not in by_name]
        if unknown:
            print(f"mutants: unknown mutant(s) {', '.join(unknown)}; --list shows them", file=sys.stderr)
            return 2
        mutants = [by_name[n] for n in dict.fromkeys(wanted)]

    if args.list:
        for m in mutants:
            why = staleness(m)
            missing = [p for p in m.pytest if not (REPO / pytest_file(p)).exists()]
            notes = (" STALE: " + why if why else "") + (" (test file missing: " + ", ".join(missing) + ")" if missing else "")
            print(f"{m.name}  [{m.area}]  {', '.join(m.files)}\n    bug:   {m.bug}\n    tests: {m.tests_label()}{notes}")
        print(f"{len(mutants)} mutants")
        return 0

    files = sorted({f for m in mutants for f in m.files})
    dirty = dirty_files(files)
    if dirty:
        print("mutants: refusing to start: these files it mutates have uncommitted changes (commit or "
              "restore them, e.g. `git checkout -- FILE` after an interrupted run):\n  " + "\n  ".join(dirty),
              file=sys.stderr)
        return 2

    # SIGTERM / SIGHUP unwind like Ctrl-C, so the finally blocks restore the sources.
    def _raise(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, _raise)
    signal.signal(signal.SIGHUP, _raise)

    runner = Runner(args)
    started = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    commit = git_commit()
    t_start = time.monotonic()
    runner.configure()
    runner.baseline(mutants)
    runner.check_extension()

    results: list[Result] = []
    widths = [max(len(m.name) for m in mutants), 9, 7, 7]
    print(fmt_row(["mutant", "result", "build s", "test s"], widths) + "  detail", flush=True)
    try:
        for m in mutants:
            r = runner.run_mutant(m)
            results.append(r)
            detail = (f"killed by {r.killed_by}" if r.killed_by else "") + (" " if r.killed_by and r.detail else "") + r.detail
            print(fmt_row([m.name, r.status, f"{r.build_s:.0f}", f"{r.test_s:.0f}"], widths) + "  " + detail,
                  flush=True)
    except KeyboardInterrupt:
        print("mutants: interrupted; sources restored", file=sys.stderr)
        return 130
    finally:
        left = dirty_files(files)
        if left:  # cannot happen unless a restore write failed; say so loudly
            print("mutants: WARNING: files still differ from git: " + ", ".join(left), file=sys.stderr)

    # Leave the build folder matching the clean tree (the last mutant's objects are stale).
    if results:
        targets = sorted({t for m in mutants for t in runner.targets_for(m)})
        if targets:
            runner.build_targets(targets, runner.logs / "final.build.log")
    wall = time.monotonic() - t_start
    counts = summarize(results)
    print("\ntotals: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) +
          f" ({len(results)} mutants, {wall:.0f} s)")
    for r in results:
        if r.status in ("survived", "stillborn", "stale", "no tests", "error"):
            print(f"  {r.status}: {r.mutant.name}  {r.detail}")
    if args.report:
        write_report(Path(args.report), results, commit, started, wall)
        print(f"mutants: report written to {args.report}")
    bad = sum(counts.get(k, 0) for k in ("survived", "stillborn", "stale", "no tests", "error"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
