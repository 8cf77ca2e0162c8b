"""lattice.bench: the public-shape benchmark suite (BENCHMARKS.md; docs/benchmarks.md).

    python -m lattice.bench --preset smoke                  # seconds; what CI runs
    python -m lattice.bench --preset standard               # the CPU anchor rows + MinkUNet42 batch 1
    python -m lattice.bench --device cuda                   # the GPU rows (= --preset gpu), minutes
    python -m lattice.bench --device cuda --preset full     # everything
    python -m lattice.bench --compare A.json B.json         # per-case ratios between two runs

In-process: ``lattice.bench.main(["--preset", "smoke", "--output", "out"])`` returns the exit code;
``lattice.bench.run_suite(...)`` returns the result document.
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path
from typing import Optional, Sequence

import torch

import lattice

from . import cases as _cases
from . import report, workloads
from .ceilings import measure_ceilings

__all__ = ["main", "run_suite", "parse_args"]

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
_DTYPE_ALIASES = {"fp32": "float32", "f32": "float32", "fp16": "float16", "f16": "float16", "half": "float16",
                  "bf16": "bfloat16", "fp64": "float64", "f64": "float64", "double": "float64"}


def _int_list(text: str) -> list[int]:
    return [int(v) for v in text.replace(" ", "").split(",") if v]


def _size_list(text: str) -> list[int]:
    return [workloads.parse_count(v) for v in text.replace(" ", "").split(",") if v]


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m lattice.bench",
        description="lattice benchmark suite: public input shapes, map vs compute, cold vs hot, roofline columns.",
    )
    p.add_argument("--preset", choices=("smoke", "standard", "full", "gpu"), default=None,
                   help="smoke: seconds, CI; standard: the anchor rows of this device + MinkUNet42 batch 1; "
                        "full: everything; gpu: the GPU machine's rows in a few minutes (kitti subm3 "
                        "C=32/64/128, k2 s2, MinkUNet42; implies --device cuda) (default: smoke, or gpu with --device cuda)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="cpu (default) or cuda")
    p.add_argument("--dtype", default=None,
                   help="float32 | float16 | bfloat16 | float64 (default: float32 on cpu, float16 on cuda)")
    p.add_argument("--size", type=_size_list, default=None, metavar="N[,N...]",
                   help="row counts for the sized workload families (grid_/plane_/isolated_/line*/block*), "
                        "e.g. 1e4,100k,1m; anchor workloads keep their size")
    p.add_argument("--channels", type=_int_list, default=None, metavar="C[,C...]",
                   help="channels (C_in = C_out) for the conv cases, replacing the preset's")
    p.add_argument("--case-filter", default=None, metavar="TEXT",
                   help="run only cases whose name contains TEXT or matches it as a regex")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed repeats per measurement (at least 5 on cpu, 20 on cuda)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed calls before each measurement (default 1 on cpu, 3 on cuda)")
    p.add_argument("--output", default="bench_out", help="folder for results.json/.txt and PNGs (default bench_out/)")
    p.add_argument("--list", action="store_true", help="print the selected case names and exit")
    p.add_argument("--seed", type=int, default=0, help="seed of the random features and weights")
    p.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"), default=None,
                   help="print per-case B/A time ratios between two results.json files and exit")
    args = p.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if args.preset == "gpu" else "cpu"
    if args.preset is None:
        args.preset = "gpu" if args.device == "cuda" else "smoke"
    if args.preset == "gpu" and args.device != "cuda":
        p.error("--preset gpu: runs on --device cuda only")
    if args.warmup is None:
        args.warmup = 3 if args.device == "cuda" else 1
    if args.dtype is None:
        args.dtype = "float16" if args.device == "cuda" else "float32"
    args.dtype = _DTYPE_ALIASES.get(args.dtype, args.dtype)
    if args.dtype not in _DTYPES:
        p.error(f"--dtype: expected one of {', '.join(_DTYPES)}, got {args.dtype!r}")
    if args.repeats is not None and args.repeats < 1:
        p.error("--repeats: expected a positive count")
    return args


def _say(msg: str, end: str = "\n") -> None:
    print(msg, end=end, flush=True)


def run_suite(args: argparse.Namespace) -> dict:
    """Runs the selected cases and writes the output files; returns the result document."""
    t_start = time.perf_counter()
    sel = _cases.Selection(preset=args.preset, device=args.device, channels=args.channels, sizes=args.size,
                           case_filter=args.case_filter)
    selected = _cases.build_cases(sel)
    skipped_groups = _cases.skipped_groups(sel)
    options = {k: getattr(args, k) for k in ("preset", "device", "dtype", "size", "channels", "case_filter", "repeats",
                                             "warmup", "seed")}
    dtype = _DTYPES[args.dtype]
    ctx = _cases.Context(device=args.device, dtype=dtype, repeats=args.repeats, warmup=args.warmup, seed=args.seed)

    for g, why in skipped_groups.items():
        _say(f"{g}: skipped: {why}")
    device_reason = _cases.cuda_unavailable_reason() if args.device == "cuda" else None
    if device_reason:
        _say(f"cuda: every case skipped: {device_reason}")
    ceilings: dict = {}
    if not device_reason and selected:
        t0 = time.perf_counter()
        ceilings = measure_ceilings(args.device, dtype, scale="small" if args.preset == "smoke" else "large")
        ctx.ceilings = ceilings
        if args.device == "cpu":
            # torch's CPU GEMM runs on its BLAS's own thread pool (OpenBLAS in Debian's torch), whose
            # idle workers keep spinning for ~0.1 s after the last call and would steal the cores
            # from the first cases (observed: 40 ms stalls in the relation group). Let them sleep.
            time.sleep(1.0)
        _say(f"ceilings: GEMM {ceilings['gemm_dtype']} {ceilings['gemm_flops'] / 1e9:.1f} GFLOP/s, copy "
             f"{ceilings['copy_bytes_per_s'] / 1e9:.1f} GB/s ({time.perf_counter() - t0:.1f} s)")

    results = []
    width = len(str(len(selected)))
    for i, case in enumerate(selected, 1):
        head = f"[{i:>{width}}/{len(selected)}] {case.name}"
        base = {"name": case.name, "group": case.group, "workload": case.workload, "device": args.device,
                "dtype": args.dtype}
        if device_reason:
            _say(f"{head}  skipped: {device_reason}")
            results.append({**base, "status": "skipped", "reason": device_reason})
            continue
        _say(f"{head} ...", end="")
        t0 = time.perf_counter()
        try:
            res = case.run(ctx)
            res = {**base, "status": "ok", **res}
            res["elapsed_s"] = time.perf_counter() - t0
            main_t = res["timings"].get(report.PRIMARY.get(case.group, ""), {})
            _say(f" ok {res['elapsed_s']:.1f} s  {report.PRIMARY.get(case.group)} "
                 f"{main_t.get('median_ms', float('nan')):.3f} ms  route={res.get('route')}")
        except (_cases.CaseSkipped, workloads.WorkloadUnavailable, lattice.UnsupportedError) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            res = {**base, "status": "skipped", "reason": reason, "elapsed_s": time.perf_counter() - t0}
            _say(f" skipped: {reason}")
        except Exception as exc:  # one failing case must not hide the others
            res = {**base, "status": "error", "reason": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc(), "elapsed_s": time.perf_counter() - t0}
            _say(f" ERROR {type(exc).__name__}: {exc}")
        results.append(res)

    doc = {
        "schema": report.SCHEMA,
        "preset": args.preset,
        "options": options,
        "environment": report.environment(args.device),
        "ceilings": ceilings,
        "skipped_groups": skipped_groups,
        "results": results,
        "elapsed_s": time.perf_counter() - t_start,
    }
    out_dir = Path(args.output)
    files = report.write_all(doc, out_dir)
    _say("")
    _say(report.format_tables(doc))
    _say("\nwrote " + ", ".join(str(p) for p in files.values()))
    _say(f"total {doc['elapsed_s']:.1f} s")
    doc["files"] = {k: str(v) for k, v in files.items()}
    return doc


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry; returns 0 when every selected case ran or was skipped with a reason."""
    args = parse_args(argv)
    if args.compare:
        _say(report.compare(*args.compare))
        return 0
    if args.list:
        sel = _cases.Selection(preset=args.preset, device=args.device, channels=args.channels, sizes=args.size,
                               case_filter=args.case_filter)
        for c in _cases.build_cases(sel):
            _say(c.name)
        return 0
    if args.device == "cuda" and args.preset == "gpu":
        reason = _cases.cuda_unavailable_reason()
        if reason:  # the GPU preset has nothing to do without a GPU: say why and fail (no traceback)
            print(f"lattice.bench: --preset gpu needs a CUDA device: {reason}", file=sys.stderr, flush=True)
            return 2
    doc = run_suite(args)
    return 1 if any(r["status"] == "error" for r in doc["results"]) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
