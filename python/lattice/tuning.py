"""Measured route choices for convolutions (issue 19: "a tuner that never crashes and is never silent").

Each conv pass has a route table ranked by a fixed preference (``lattice.explain`` shows it). For
some problems a lower-ranked admitted route is faster on a given machine. :func:`tune` runs a model
once with tuning on: the first call of every *bucket* of similar conv problems (pass, relation
kind, dtype, device, channel counts, kernel volume, row counts rounded up to powers of two) times
each admitted route except the ``reference`` oracle on that call's data and records the fastest.
Every later call of that bucket runs the recorded route, in this process and, after
:func:`load_tuning`, in later ones.

    report = lattice.tune(model, example, backward=True)   # times, records, saves
    print(report)                                          # one row per bucket
    print(lattice.explain("subm_conv3d", x, w))            # "tuned: measured for bucket [...]"

    lattice.load_tuning()      # a new process of the same build: the same choices

The table is saved as JSON under ``$LATTICE_CACHE_DIR`` (default ``$XDG_CACHE_HOME/lattice`` or
``~/.cache/lattice``), one file per build (``tuning-<build id>.json``: the id hashes the route
table and the compiler, so a table measured by another build is never applied). Nothing is
chosen by measurement unless a tuning run or a load asked for it. Every route stays bitwise
deterministic; a tuned process runs the recorded route, so its bits are those of that route
(``route=`` forced to it gives the same bits). A candidate that raises is recorded as failed and
never chosen; tuning carries on with the others.
"""
from __future__ import annotations

import json
import os
import pathlib
import tempfile
import warnings
from typing import Any, Callable, Optional, Union

import torch

from ._core import core

FORMAT = 1


def cache_path(path: Union[str, os.PathLike, None] = None) -> pathlib.Path:
    """The file :func:`save_tuning` / :func:`load_tuning` use: ``path`` when given, else this
    build's file under the cache folder."""
    if path is not None:
        return pathlib.Path(path)
    folder = os.environ.get("LATTICE_CACHE_DIR")
    if not folder:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        folder = os.path.join(base, "lattice")
    return pathlib.Path(folder) / f"tuning-{core.tuning_build_id()}.json"


class TuneReport(list):
    """The buckets one :func:`tune` call measured: dicts with ``key``, ``route`` (the fastest) and
    ``times`` ((route, median ms or None, error) per candidate). Prints as a table."""

    path: Optional[pathlib.Path] = None

    def __str__(self) -> str:
        if not self:
            return "lattice.tune: no new buckets (every conv call was tuned already, forced, or there was none)"
        lines = [f"lattice.tune: {len(self)} bucket(s) measured" + (f", saved to {self.path}" if self.path else "")]
        for e in self:
            times = ", ".join(f"{r} {ms:.3f} ms" if ms is not None else f"{r} failed ({err})" for r, ms, err in e["times"])
            lines.append(f"  {e['route']:<22s} <- {times}")
            lines.append(f"      [{e['key']}]")
        return "\n".join(lines)


def tuning_entries() -> list:
    """Every recorded choice of this process, sorted by bucket key."""
    return list(core.tuned_entries())


def clear_tuning() -> None:
    """Forgets every recorded choice of this process (the rank order decides again); the saved file stays."""
    core.clear_tuned()


def _snapshot(model: Any) -> Optional[tuple]:
    if not isinstance(model, torch.nn.Module):
        return None
    state = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items() if isinstance(v, torch.Tensor)}
    grads = {n: (None if p.grad is None else p.grad.detach().clone()) for n, p in model.named_parameters()}
    return state, grads, model.training


def _restore(model: Any, snap: Optional[tuple]) -> None:
    if snap is None:
        return
    state, grads, training = snap
    with torch.no_grad():
        for k, v in model.state_dict(keep_vars=True).items():
            if k in state:
                v.copy_(state[k])
    for n, p in model.named_parameters():
        p.grad = grads.get(n)
    model.train(training)


def tune(model: Callable[[Any], Any], example_input: Any, *, backward: bool = False,
         loss_fn: Optional[Callable[[Any], torch.Tensor]] = None, reps: int = 5, save: bool = True,
         path: Union[str, os.PathLike, None] = None) -> TuneReport:
    """Measures the admitted conv routes of every bucket that ``model(example_input)`` reaches.

    Args:
        model: a callable (typically a ``torch.nn.Module`` in the mode you will run it in).
        example_input: its argument (a SparseTensor of representative size: buckets round row
            counts up to powers of two).
        backward: also run a backward pass (``loss_fn(output)``, default the sum of the output
            features in float32), so the input- and weight-gradient passes are tuned too.
        reps: timed runs per candidate (after one warm-up); the median decides.
        save: write the process's whole table to :func:`cache_path` (``path`` overrides it).

    The model is left as it was: parameters, buffers (batch norm statistics), gradients and the
    training flag are restored afterwards. Buckets already recorded are not measured again (call
    :func:`clear_tuning` first to re-measure). Returns a :class:`TuneReport` of the new buckets.
    """
    if not callable(model):
        raise TypeError(f"[tune] model: expected a callable (a torch.nn.Module), got {type(model).__name__}")
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise ValueError(f"[tune] reps: expected a positive int, got {reps!r}")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"[tune] loss_fn: expected a callable or None, got {type(loss_fn).__name__}")
    before = {e["key"] for e in core.tuned_entries()}
    snap = _snapshot(model)
    core.set_conv_tuning(True, reps)
    try:
        if backward:
            with torch.enable_grad():
                out = model(example_input)
                loss = loss_fn(out) if loss_fn is not None else _features(out).float().sum()
                loss.backward()
        else:
            with torch.no_grad():
                model(example_input)
    finally:
        core.set_conv_tuning(False)
        _restore(model, snap)
    report = TuneReport(e for e in core.tuned_entries() if e["key"] not in before)
    if save:
        report.path = save_tuning(path)
    return report


def _features(out: Any) -> torch.Tensor:
    feats = getattr(out, "feats", out)
    if not isinstance(feats, torch.Tensor):
        raise TypeError(f"[tune] loss_fn: expected one for a model whose output is not a SparseTensor or a tensor, "
                        f"got output of type {type(out).__name__}")
    return feats


def save_tuning(path: Union[str, os.PathLike, None] = None) -> pathlib.Path:
    """Writes every recorded choice of this process to ``path`` (default :func:`cache_path`),
    replacing the file atomically. Returns the path."""
    target = cache_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    doc = {"lattice_tuning": FORMAT, "build": core.tuning_build_id(),
           "entries": [{"key": e["key"], "route": e["route"], "times": [list(t) for t in e["times"]]}
                       for e in core.tuned_entries()]}
    fd, tmp = tempfile.mkstemp(prefix=".tuning-", suffix=".json", dir=str(target.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target


def load_tuning(path: Union[str, os.PathLike, None] = None) -> int:
    """Records the choices saved in ``path`` (default :func:`cache_path`) in this process; returns
    how many. A missing default file loads nothing (0). A file saved by another build is not
    applied (a warning says so; 0). A malformed file raises ValueError."""
    target = cache_path(path)
    if not target.exists():
        if path is not None:
            raise FileNotFoundError(f"[load_tuning] path: expected an existing tuning file, got {str(target)!r}")
        return 0
    try:
        doc = json.loads(target.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as ex:
        raise ValueError(f"[load_tuning] path: expected a lattice tuning file (JSON), got {str(target)!r} ({ex})") from None
    if not isinstance(doc, dict) or doc.get("lattice_tuning") != FORMAT or not isinstance(doc.get("entries"), list):
        raise ValueError(f"[load_tuning] path: expected a lattice tuning file of format {FORMAT}, got {str(target)!r}")
    if doc.get("build") != core.tuning_build_id():
        warnings.warn(f"lattice.load_tuning: {target} was measured by another build ({doc.get('build')!r}, this one is "
                      f"{core.tuning_build_id()!r}); nothing loaded: run lattice.tune again", RuntimeWarning, stacklevel=2)
        return 0
    entries = []
    for e in doc["entries"]:
        if not (isinstance(e, dict) and isinstance(e.get("key"), str) and isinstance(e.get("route"), str)
                and isinstance(e.get("times"), list)
                and all(isinstance(t, list) and len(t) == 3 and isinstance(t[0], str)
                        and (t[1] is None or (isinstance(t[1], (int, float)) and not isinstance(t[1], bool)))
                        and isinstance(t[2], str) for t in e["times"])):
            raise ValueError(f"[load_tuning] entries: expected {{key, route, times}} records, got {str(e)[:120]!r}")
        entries.append(e)
    for e in entries:  # route names are checked by the core (ValueError naming the conv routes)
        core.set_tuned(e["key"], e["route"], [tuple(t) for t in e["times"]])
    return len(entries)
