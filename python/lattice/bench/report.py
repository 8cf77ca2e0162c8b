"""Results on disk and on screen: environment, JSON, text tables, PNG charts, run-vs-run comparison.

Files written into the output folder:

* ``results.json`` — ``{"schema", "preset", "options", "environment", "ceilings", "skipped_groups",
  "results": [...], "elapsed_s"}``; each result has ``name``, ``group``, ``status`` (ok | skipped |
  error), ``route``, ``n_in``, ``n_out``, ``pairs``, ``avg_offsets``, ``timings`` (per measured
  thing: median_ms, p95_ms, min_ms, max_ms, repeats, samples_ms), ``rates`` (FLOP/s, bytes/s, % of
  ceilings) and, where a BENCHMARKS.md anchor row matches, ``anchor``.
* ``results.txt`` — the tables printed at the end of a run (and per-layer network tables).
* ``time_per_case.png`` — the main time of every case (log scale, p95 whisker).
* ``anchor_ratio.png`` — our/anchor time for each case matching an anchor row (< 1 is faster).
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Optional

import numpy as np
import torch

import lattice

from . import workloads

SCHEMA = 1

# The timing shown in the chart for each group (the case's headline number).
PRIMARY = {"conv": "hot", "relations": "map_cold", "point_voxel": "quantize", "networks": "inference",
           "pooling": "hot", "algebra": "op", "quantized": "int4", "large": "hot"}


# -- environment ------------------------------------------------------------------------------------


def _git(args: list[str], cwd: Path) -> Optional[str]:
    env = dict(os.environ, GIT_OPTIONAL_LOCKS="0")  # read-only: never refresh the index
    try:
        out = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _cpu_model() -> Optional[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def environment(device: str) -> dict[str, Any]:
    """Where and with what the run happened (git, CPU, threads, GPU, torch/CUDA, lattice build)."""
    repo = Path(lattice.__file__).resolve().parents[2]
    sha = _git(["rev-parse", "HEAD"], repo)
    dirty = _git(["status", "--porcelain", "--untracked-files=no"], repo) if sha else None
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    caps = lattice.device_caps()
    gpu = None
    if torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(0)
    shared = workloads.shared_dir()
    try:
        load = [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        load = None
    return {
        "timestamp_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_sha": sha,
        "git_dirty": bool(dirty) if dirty is not None else None,
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "load_average": load,  # 1/5/15 min at the end of the run; above cpu_count, CPU timings are unreliable
        "threads": {
            "torch": torch.get_num_threads(),
            "lattice": caps.get("cpu", {}).get("threads"),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        },
        "gpu_name": gpu or (caps.get("cuda", {}).get("name") or None),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "numpy_version": np.__version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "lattice_version": lattice.__version__,
        "lattice_backend_info": lattice.backend_info(),
        "lattice_device_caps": caps,
        "device": device,
        "shared_dir": str(shared) if shared else None,
        "shared_workloads": workloads.shared_module() is not None,
        "kitti_scan": workloads.kitti_path() is not None,
    }


# -- formatting helpers -----------------------------------------------------------------------------


def _ms(t: Optional[dict], key: str = "median_ms") -> str:
    if not t or t.get(key) is None:
        return "-"
    v = t[key]
    if v >= 1000:
        return f"{v:,.0f}"
    if v >= 100:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def _num(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}"
    return f"{v:,}"


def _pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.1f}"


def _si(v: Optional[float], scale: float) -> str:
    return "-" if v is None else f"{v / scale:.1f}"


def _anchor_text(r: dict) -> str:
    a = r.get("anchor")
    if not a:
        return ""
    short = {"hot": "hot", "cold": "cold", "fwd_bwd": "f+b", "inference": "inf", "train_step": "train"}
    return " ".join(f"{short.get(k, k)} x{v['ratio']:.2f}" for k, v in a["ratios"].items())


def _table(headers: list[str], rows: list[list[str]], left: Iterable[int] = (0, 1)) -> str:
    left = set(left)
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        padded = (c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        return "  ".join(padded).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    return "\n".join(out)


def _rate(r: dict, key: str, field: str) -> Optional[float]:
    return (r.get("rates") or {}).get(key, {}).get(field)


def format_tables(doc: dict, with_layers: bool = False) -> str:
    """The text tables of a run (conv, relations, point/voxel, pooling, networks, skipped)."""
    results = doc["results"]
    ok = [r for r in results if r.get("status") == "ok"]
    parts = []
    env, ceil = doc.get("environment", {}), doc.get("ceilings", {})
    opts = doc.get("options", {})
    parts.append(
        f"lattice.bench preset={doc.get('preset')} device={opts.get('device')} dtype={opts.get('dtype')} "
        f"git={str(env.get('git_sha'))[:10]}{'+dirty' if env.get('git_dirty') else ''} "
        f"cpu={env.get('cpu_model')} threads(torch/lattice)={env.get('threads', {}).get('torch')}/"
        f"{env.get('threads', {}).get('lattice')} gpu={env.get('gpu_name')} load={env.get('load_average')}"
    )
    load, ncpu = env.get("load_average"), env.get("cpu_affinity") or env.get("cpu_count")
    if opts.get("device") == "cpu" and load and ncpu and load[0] > ncpu:
        parts.append(f"warning: load average {load[0]} exceeds the {ncpu} CPUs: other work shares the cores, "
                     "CPU timings are unreliable (compare ratios measured in one run)")
    if ceil:
        parts.append(
            f"ceilings (same run, best of repeats): GEMM {ceil.get('gemm_dtype')} n={ceil.get('gemm_n')} "
            f"{ceil['gemm_flops'] / 1e9:.1f} GFLOP/s; copy {ceil.get('copy_mib')} MiB "
            f"{ceil['copy_bytes_per_s'] / 1e9:.1f} GB/s"
        )
    conv = [r for r in ok if r["group"] == "conv"]
    if conv:
        rows = []
        for r in conv:
            t = r["timings"]
            rows.append([
                r["name"], str(r.get("route")), _num(r["n_in"]), _num(r["n_out"]), _num(r["pairs"]),
                f"{r['avg_offsets']:.2f}", _ms(t.get("map_cold")), _ms(t.get("cold")), _ms(t.get("hot")),
                _ms(t.get("hot"), "p95_ms"), _ms(t.get("input_grad")), _ms(t.get("weight_grad")), _ms(t.get("fwd_bwd")),
                _si(_rate(r, "hot", "flop_per_s"), 1e9), _pct(_rate(r, "hot", "pct_gemm_ceiling")),
                _si(_rate(r, "hot", "bytes_per_s"), 1e9), _pct(_rate(r, "hot", "pct_copy_ceiling")), _anchor_text(r),
            ])
        parts.append("\nconvolution (ms; median unless p95; rates of the hot forward)")
        parts.append(_table(
            ["case", "route", "N_in", "N_out", "pairs", "avg", "map", "cold", "hot", "hot p95", "dX", "dW", "f+b",
             "GFLOP/s", "%gemm", "GB/s", "%copy", "ours/anchor"], rows, left=(0, 1, 17)))
    rel = [r for r in ok if r["group"] == "relations"]
    if rel:
        rows = [[r["name"], str(r.get("relation_kind")), str(r.get("route")), _num(r["n_in"]), _num(r["n_out"]),
                 _num(r["pairs"]), f"{r['avg_offsets']:.2f}", _ms(r["timings"].get("index")),
                 _ms(r["timings"].get("map_cold")), _ms(r["timings"].get("map_cold"), "p95_ms"),
                 _ms(r["timings"].get("map_hot"))] for r in rel]
        parts.append("\nrelations / coordinates (ms; route = forward route of the C32 conv using the map)")
        parts.append(_table(["case", "relation", "route", "N_in", "N_out", "pairs", "avg", "index", "map cold",
                             "p95", "map hot"], rows, left=(0, 1, 2)))
    pv = [r for r in ok if r["group"] == "point_voxel"]
    if pv:
        rows = [[r["name"], str(r.get("route")), _num(r["n_in"]), _num(r["n_out"]), f"{r['avg_offsets']:.2f}",
                 _ms(r["timings"].get("quantize")), _ms(r["timings"].get("quantize"), "p95_ms"),
                 _si(_rate(r, "quantize", "bytes_per_s"), 1e9), _pct(_rate(r, "quantize", "pct_copy_ceiling"))]
                for r in pv]
        parts.append("\npoint / voxel (ms; N_in points, N_out voxels, avg points per voxel)")
        parts.append(_table(["case", "route", "N_in", "N_out", "avg", "ms", "p95", "GB/s", "%copy"], rows))
    pool = [r for r in ok if r["group"] == "pooling"]
    if pool:
        rows = [[r["name"], "/".join(str(v) for v in (r.get("routes") or {}).values()), _num(r["n_in"]),
                 _num(r["n_out"]), _num(r["pairs"]), f"{r['avg_offsets']:.2f}", _ms(r["timings"].get("map_cold")),
                 _ms(r["timings"].get("cold")), _ms(r["timings"].get("hot")), _ms(r["timings"].get("hot"), "p95_ms"),
                 _ms(r["timings"].get("input_grad")), _ms(r["timings"].get("fwd_bwd")),
                 _si(_rate(r, "hot", "bytes_per_s"), 1e9), _pct(_rate(r, "hot", "pct_copy_ceiling"))] for r in pool]
        parts.append("\npooling (ms; routes = forward/input_grad; pairs = edges, rows for global pooling)")
        parts.append(_table(["case", "routes", "N_in", "N_out", "pairs", "avg", "map", "cold", "hot", "hot p95", "dX",
                             "f+b", "GB/s", "%copy"], rows))
    alg = [r for r in ok if r["group"] == "algebra"]
    if alg:
        rows = [[r["name"], str(r.get("route")), _num(r["n_in"]), _num(r["n_out"]), _ms(r["timings"].get("op")),
                 _ms(r["timings"].get("op"), "p95_ms"), _si(_rate(r, "op", "bytes_per_s"), 1e9),
                 _pct(_rate(r, "op", "pct_copy_ceiling"))] for r in alg]
        parts.append("\nsparse algebra / coordinate utilities (ms; W with W shifted by +1 in x; N_in = rows of both)")
        parts.append(_table(["case", "route", "N_in", "N_out", "ms", "p95", "GB/s", "%copy"], rows))
    nets = [r for r in ok if r["group"] == "networks"]
    if nets:
        rows = [[r["name"], str(r.get("route")), _num(r["n_in"]), _num(r["pairs"]), f"{r['avg_offsets']:.2f}",
                 _ms(r["timings"].get("inference")), _ms(r["timings"].get("inference"), "p95_ms"),
                 _ms(r["timings"].get("train_step")), _ms(r["timings"].get("train_step"), "p95_ms"),
                 _si(_rate(r, "inference", "flop_per_s"), 1e9), _pct(_rate(r, "inference", "pct_gemm_ceiling")),
                 _anchor_text(r)] for r in nets]
        parts.append("\nnetworks (ms; maps rebuilt every call; pairs summed over conv layers)")
        parts.append(_table(["case", "routes", "N", "pairs", "avg", "infer", "p95", "train step", "p95",
                             "GFLOP/s", "%gemm", "ours/anchor"], rows, left=(0, 1, 11)))
        if with_layers:
            for r in nets:
                lrows = [[x["layer"], x["op"], str(x["route"]) + (" (tuned)" if x.get("tuned") else ""),
                          f"{x['c_in']}->{x['c_out']}",
                          "x".join(map(str, x["kernel_size"])) + (f" s{x['stride'][0]}" if x["stride"][0] != 1 else ""),
                          _num(x["n_in"]), _num(x["n_out"]), _num(x["pairs"]), f"{x['avg_offsets']:.2f}",
                          "-" if x.get("fwd_ms") is None else f"{x['fwd_ms']:.3f}"]
                         for x in r.get("layers", [])]
                parts.append(f"\n{r['name']}: conv layers (fwd ms: maps cached, device synchronised around each layer)")
                parts.append(_table(["layer", "op", "route", "C", "kernel", "N_in", "N_out", "pairs", "avg", "fwd ms"],
                                    lrows, left=(0, 1, 2)))
    quant = [r for r in ok if r["group"] == "quantized"]
    if quant:
        rows = []
        for r in quant:
            for fmt, f in r.get("formats", {}).items():
                rows.append([r["name"], fmt, str(f.get("route") or r.get("route")), _num(r["n_in"]),
                             f"{f['weight_bytes'] / 1e6:.3f}", _ms(r["timings"].get(fmt)),
                             _ms(r["timings"].get(fmt), "p95_ms"),
                             "-" if f.get("max_rel_err") is None else f"{f['max_rel_err']:.2e}"])
        parts.append("\nquantized weights (ms; weight MB; err = max|y - y_f32| / max|y_f32|)")
        parts.append(_table(["case", "weights", "route", "N", "weight MB", "ms", "p95", "max rel err"], rows,
                            left=(0, 1, 2)))
    other = [r for r in results if r.get("status") != "ok"]
    skipped = doc.get("skipped_groups") or {}
    if other or skipped:
        parts.append("\nnot run")
        for g, why in skipped.items():
            parts.append(f"  {g}: skipped: {why}")
        for r in other:
            parts.append(f"  {r['name']}: {r['status']}: {r.get('reason')}")
    return "\n".join(parts)


# -- files ------------------------------------------------------------------------------------------


def _jsonable(o: Any) -> Any:
    if isinstance(o, dict):
        return {str(k): _jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_jsonable(v) for v in o]
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (str, int, float, bool)) or o is None:
        return o
    return str(o)


def write_json(doc: dict, path: Path) -> Path:
    path.write_text(json.dumps(_jsonable(doc), indent=1) + "\n", encoding="utf-8")
    return path


def write_charts(doc: dict, out_dir: Path) -> list[Path]:
    """time_per_case.png and anchor_ratio.png (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    ok = [r for r in doc["results"] if r.get("status") == "ok"]
    label = f"{doc.get('preset')} · {doc['options'].get('device')} · {doc['options'].get('dtype')}"
    paths = []

    names, med, p95 = [], [], []
    for r in ok:
        t = r["timings"].get(PRIMARY.get(r["group"], ""))
        if t:
            names.append(f"{r['name']} [{PRIMARY[r['group']]}]")
            med.append(t["median_ms"])
            p95.append(t["p95_ms"])
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.28 * len(names) + 1.2)))
    if names:
        y = np.arange(len(names))
        ax.barh(y, med, color="#4C72B0")
        ax.errorbar(med, y, xerr=[np.zeros(len(med)), np.maximum(np.array(p95) - np.array(med), 0)], fmt="none",
                    ecolor="k", capsize=2, lw=0.8)
        ax.set_yticks(y)
        ax.set_yticklabels(names, fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("time per call (ms, median; whisker to p95)")
    else:
        ax.text(0.5, 0.5, "no case ran", ha="center", va="center")
        ax.set_axis_off()
    ax.set_title(f"lattice.bench — time per case ({label})", fontsize=9)
    fig.tight_layout()
    p = out_dir / "time_per_case.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)

    names, ratios = [], []
    for r in ok:
        for k, v in (r.get("anchor") or {}).get("ratios", {}).items():
            names.append(f"{r['name']} [{k}]")
            ratios.append(v["ratio"])
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.28 * len(names) + 1.2)))
    if names:
        y = np.arange(len(names))
        ax.barh(y, ratios, color=["#55A868" if v <= 1 else "#C44E52" for v in ratios])
        ax.axvline(1.0, color="k", lw=0.8)
        for yi, v in zip(y, ratios):
            ax.text(v, yi, f" {v:.2f}", va="center", fontsize=7)
        ax.set_yticks(y)
        ax.set_yticklabels(names, fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        lo, hi = min(ratios + [1.0]), max(ratios + [1.0])
        ax.set_xlim(lo / 1.5, hi * 1.6)
        ax.set_xlabel("ours / anchor time (< 1: faster than the anchor)")
    else:
        ax.text(0.5, 0.5, "no case of this run matches a row of the BENCHMARKS.md anchor tables\n"
                "(anchors: CPU float32 MinkowskiEngine rows, CUDA float16 TorchSparse rows, shared workloads)",
                ha="center", va="center", fontsize=8)
        ax.set_axis_off()
    ax.set_title(f"lattice.bench — ours / anchor ({label})", fontsize=9)
    fig.tight_layout()
    p = out_dir / "anchor_ratio.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    return paths


def write_all(doc: dict, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"json": write_json(doc, out_dir / "results.json")}
    txt = out_dir / "results.txt"
    txt.write_text(format_tables(doc, with_layers=True) + "\n", encoding="utf-8")
    files["table"] = txt
    try:
        charts = write_charts(doc, out_dir)
        files["time_chart"], files["anchor_chart"] = charts
    except ImportError as exc:  # matplotlib missing: the JSON and table are still written
        print(f"lattice.bench: charts skipped: {exc}", file=sys.stderr)
    return files


# -- compare ----------------------------------------------------------------------------------------


def compare(path_a: str, path_b: str) -> str:
    """Per-case, per-timing ratios B/A (median ms) between two results.json files."""
    a = json.loads(Path(path_a).read_text(encoding="utf-8"))
    b = json.loads(Path(path_b).read_text(encoding="utf-8"))
    ra = {r["name"]: r for r in a["results"] if r.get("status") == "ok"}
    rb = {r["name"]: r for r in b["results"] if r.get("status") == "ok"}
    rows, logs = [], []
    for name in [n for n in ra if n in rb]:
        ta, tb = ra[name]["timings"], rb[name]["timings"]
        for key in [k for k in ta if k in tb]:
            ma, mb = ta[key]["median_ms"], tb[key]["median_ms"]
            ratio = mb / ma if ma else math.nan
            if math.isfinite(ratio) and ratio > 0:
                logs.append(math.log(ratio))
            rows.append([name, key, _ms(ta[key]), _ms(tb[key]), f"{ratio:.3f}",
                         f"{ra[name].get('route')}" + ("" if ra[name].get("route") == rb[name].get("route")
                                                      else f" -> {rb[name].get('route')}")])
    out = []
    for tag, d, p in (("A", a, path_a), ("B", b, path_b)):
        e, o = d.get("environment", {}), d.get("options", {})
        out.append(f"{tag}: {p}  preset={d.get('preset')} device={o.get('device')} dtype={o.get('dtype')} "
                   f"git={str(e.get('git_sha'))[:10]} {e.get('timestamp_utc')}")
    if rows:
        out.append(_table(["case", "timing", "A ms", "B ms", "B/A", "route"], rows, left=(0, 1, 5)))
        out.append(f"geometric mean B/A over {len(logs)} timings: {math.exp(sum(logs) / len(logs)):.3f}"
                   if logs else "no comparable timings")
    else:
        out.append("no case appears in both files")
    only = sorted(set(ra) ^ set(rb))
    if only:
        more = " ..." if len(only) > 10 else ""
        out.append(f"{len(only)} case(s) in only one file: " + ", ".join(only[:10]) + more)
    return "\n".join(out)
