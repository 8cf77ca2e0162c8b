"""Metrics, the progress bar and the PNGs of ``python -m lattice.demo`` (helpers; see lattice/demo.py).

* ``confusion`` / ``iou_per_class`` / ``mean_iou``: segmentation scores (ignored entries skipped);
* ``ProgressBar``: a plain-text bar rewritten in place with ``\\r`` (no dependency);
* ``plot_bev`` / ``plot_loss``: matplotlib (Agg) figures written as PNG.
"""
from __future__ import annotations

import math
import time
from typing import Optional, Sequence, TextIO

import numpy as np
import torch

# Class colours (by class name, so the synthetic and the SemanticKITTI sets agree) and the colour
# of ignored points. Chosen to stay distinguishable in print and for common colour-vision deficits.
CLASS_COLOURS = {
    "ground": "#b9a27a",
    "structure": "#2b6cb0",
    "vehicle": "#f28e2b",
    "object": "#f28e2b",
    "vegetation": "#3a9b3a",
    "pole": "#d6277f",
}
IGNORED_COLOUR = "#d9d9d9"
_FALLBACK_COLOURS = ("#8c564b", "#17becf", "#bcbd22", "#7f7f7f")


def class_colour(name: str, index: int) -> str:
    return CLASS_COLOURS.get(name, _FALLBACK_COLOURS[index % len(_FALLBACK_COLOURS)])


# ------------------------------------------------------------------------------------------------
# Scores
# ------------------------------------------------------------------------------------------------


def confusion(pred: torch.Tensor, target: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``(K, K)`` int64 counts, rows = ground truth, columns = prediction; targets < 0 are skipped."""
    valid = target >= 0
    idx = target[valid] * num_classes + pred[valid]
    return torch.bincount(idx, minlength=num_classes * num_classes).view(num_classes, num_classes)


def iou_per_class(conf: torch.Tensor) -> list[float]:
    """IoU = TP / (TP + FP + FN) per class; NaN for a class absent from the ground truth (it does
    not count in the mean, whatever was predicted)."""
    tp = conf.diag().double()
    gt = conf.sum(1).double()
    union = gt + conf.sum(0).double() - tp
    return [float(tp[c] / union[c]) if gt[c] > 0 else math.nan for c in range(conf.shape[0])]


def mean_iou(ious: Sequence[float]) -> float:
    """The mean over the classes present in the ground truth (non-NaN entries)."""
    present = [v for v in ious if not math.isnan(v)]
    return sum(present) / len(present) if present else math.nan


def majority_class(target: torch.Tensor, num_classes: int) -> int:
    """The most frequent class among entries >= 0 (ties: the smallest id)."""
    counts = torch.bincount(target[target >= 0], minlength=num_classes)
    return int(torch.argmax((counts == counts.max()).to(torch.int8) * (num_classes - torch.arange(num_classes))))


# Frequencies below this count as this in the class weights: a class with a handful of voxels (a
# crop that clips a bush) would otherwise get a weight of 50 and dominate the loss.
MIN_WEIGHT_FREQUENCY = 0.01


def class_weights(target: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Inverse square root of each class's frequency among entries >= 0 (at least
    ``MIN_WEIGHT_FREQUENCY``), scaled so that the frequency-weighted mean weight is 1 (absent
    classes: weight 0, they never occur)."""
    counts = torch.bincount(target[target >= 0], minlength=num_classes).double()
    freq = counts / counts.sum().clamp(min=1)
    w = torch.where(counts > 0, freq.clamp(min=MIN_WEIGHT_FREQUENCY).rsqrt(), torch.zeros_like(freq))
    return (w / (w * freq).sum().clamp(min=1e-12)).float()


# ------------------------------------------------------------------------------------------------
# Progress bar
# ------------------------------------------------------------------------------------------------


def _clock(seconds: float) -> str:
    seconds = max(int(round(seconds)), 0)
    return f"{seconds // 60}:{seconds % 60:02d}"


class ProgressBar:
    """``train [#########...........]  12/60  loss 0.8123  1.31 s/step  eta 1:03``.

    On a terminal the line is rewritten in place (carriage return) after every step and
    ``close()`` ends it. Into a file or a pipe (CI logs) carriage returns would pile up on one
    line, so there it prints a line at about every tenth of the run and at the end instead.
    Prints nothing when ``enabled`` is false.
    """

    def __init__(self, total: int, stream: TextIO, enabled: bool = True, width: int = 28, label: str = "train") -> None:
        self.total, self.stream, self.enabled, self.width, self.label = total, stream, enabled, width, label
        isatty = getattr(stream, "isatty", None)
        self.in_place = bool(isatty and isatty())
        self.start = time.perf_counter()
        self._last_len = 0
        self._open = False
        self._next_line = 1

    def text(self, done: int, loss: float, extra: str = "") -> str:
        elapsed = time.perf_counter() - self.start
        fill = int(self.width * done / max(self.total, 1))
        per_step = elapsed / max(done, 1)
        when = f"eta {_clock(per_step * (self.total - done))}" if done < self.total else f"took {_clock(elapsed)}"
        return (f"{self.label} [{'#' * fill}{'.' * (self.width - fill)}] {done:>{len(str(self.total))}}/{self.total}"
                f"  loss {loss:.4f}{extra}  {per_step:.2f} s/step  {when}")

    def update(self, done: int, loss: float, extra: str = "") -> None:
        if not self.enabled:
            return
        text = self.text(done, loss, extra)
        if self.in_place:
            self.stream.write("\r" + text + " " * max(self._last_len - len(text), 0))
            self._last_len = len(text)
            self._open = True
        elif done >= self._next_line or done == self.total:
            self.stream.write(text + "\n")
            while self._next_line <= done:
                self._next_line += max(self.total // 10, 1)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False


# ------------------------------------------------------------------------------------------------
# Figures
# ------------------------------------------------------------------------------------------------


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _view_box(xy: np.ndarray) -> tuple[float, float, float, float]:
    """x/y limits holding 99% of the points (the far tail of a lidar scan is a few stray returns)."""
    lo = np.percentile(xy, 0.5, axis=0)
    hi = np.percentile(xy, 99.5, axis=0)
    pad = 0.03 * (hi - lo) + 1.0
    return float(lo[0] - pad[0]), float(hi[0] + pad[0]), float(lo[1] - pad[1]), float(hi[1] + pad[1])


def plot_bev(
    path: str,
    points: np.ndarray,
    truth: np.ndarray,
    pred: np.ndarray,
    class_names: Sequence[str],
    title: str,
    truth_title: str,
    pred_title: str,
) -> None:
    """Bird's-eye view of the points (x right, y up, metres), coloured by class: ground truth
    beside the prediction (stacked when the scene is much wider than deep), plus a panel that
    marks wrong points; ignored points light grey. Higher points are drawn last (on top)."""
    plt = _pyplot()
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    colours = [class_colour(n, i) for i, n in enumerate(class_names)]
    cmap = ListedColormap([IGNORED_COLOUR, *colours])
    order = np.argsort(points[:, 2], kind="stable")
    x, y = points[order, 0], points[order, 1]
    x0, x1, y0, y1 = _view_box(points[:, :2])
    wide = (x1 - x0) > 2.2 * (y1 - y0)
    truth_o, pred_o = truth[order], pred[order]
    labelled = truth_o >= 0
    wrong = labelled & (pred_o != truth_o)

    panels = [
        (truth_title, np.where(truth_o >= 0, truth_o + 1, 0)),
        (pred_title, np.where(labelled, pred_o + 1, 0)),
    ]
    if wide:
        aspect = (x1 - x0) / (y1 - y0)  # panels as wide as the figure, stacked
        fig, axes = plt.subplots(3, 1, figsize=(16, min(3 * (13.5 / aspect + 1.3) + 1.0, 22.0)))
    else:
        fig, axes = plt.subplots(1, 3, figsize=(19, 7.0))
    marker_size = 0.6 if len(x) > 60_000 else 1.2
    # Points of rare classes (under 3% of the labelled points: poles, often objects) are drawn
    # three times larger, or a pole would be a single pixel.
    counts = np.bincount(truth[truth >= 0], minlength=len(colours)).astype(np.float64)
    rare = counts < 0.03 * max(counts.sum(), 1.0)
    for ax, (panel_title, colour_index) in zip(axes[:2], panels):
        sizes = np.where((colour_index > 0) & rare[np.maximum(colour_index - 1, 0)], 3 * marker_size, marker_size)
        ax.scatter(x, y, c=colour_index, cmap=cmap, vmin=0, vmax=len(colours), s=sizes, marker="o",
                   linewidths=0, rasterized=True)
        ax.set_title(panel_title, fontsize=11)
    err = axes[2]
    err.scatter(x[labelled & ~wrong], y[labelled & ~wrong], c="#c9c9c9", s=marker_size, linewidths=0, rasterized=True)
    err.scatter(x[wrong], y[wrong], c="#d62728", s=marker_size * 2.5, linewidths=0, rasterized=True)
    err.set_title(f"errors: {int(wrong.sum()):,} of {int(labelled.sum()):,} labelled points wrong (red)", fontsize=11)
    for ax in axes:
        ax.set_xlim(x0, x1)
        ax.set_ylim(y0, y1)
        ax.set_aspect("equal")
        ax.set_xlabel("x [m] (forward)")
        ax.set_ylabel("y [m] (left)")
        ax.plot([0], [0], marker="^", color="black", markersize=7, linestyle="none")  # the sensor
        ax.grid(True, linewidth=0.3, alpha=0.5)
    handles = [Patch(color=c, label=n) for n, c in zip(class_names, colours)]
    handles.append(Patch(color=IGNORED_COLOUR, label="ignored (no class)"))
    handles.append(Patch(color="#d62728", label="wrong prediction (errors panel)"))
    handles.append(plt.Line2D([], [], marker="^", color="black", linestyle="none", label="sensor"))
    fig.suptitle(title, fontsize=12)
    fig.tight_layout(rect=(0, 0.065 if not wide else 0.035, 1, 0.97), h_pad=1.5)
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=10, frameon=False)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_loss(
    path: str,
    losses: Sequence[float],
    mious: Sequence[float],
    majority_miou: float,
    title: str,
    final_miou: Optional[float] = None,
) -> None:
    """The training loss per step (left axis) and the mIoU of each step's training forward on the
    voxels (right axis) with the majority-class predictor's mIoU for reference."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 5), constrained_layout=True)
    steps = np.arange(1, len(losses) + 1)
    (l1,) = ax.plot(steps, losses, color="#2b6cb0", linewidth=1.8, label="loss (class-weighted cross entropy)")
    ax.set_xlabel("training step")
    ax.set_ylabel("loss", color="#2b6cb0")
    ax.set_ylim(bottom=0)
    ax.grid(True, linewidth=0.3, alpha=0.6)
    ax2 = ax.twinx()
    (l2,) = ax2.plot(steps, mious, color="#3a9b3a", linewidth=1.4, label="mIoU of the step's forward (voxels)")
    l3 = ax2.axhline(majority_miou, color="#d6277f", linestyle="--", linewidth=1.2,
                     label=f"majority-class predictor mIoU ({majority_miou:.3f})")
    handles = [l1, l2, l3]
    if final_miou is not None:
        (l4,) = ax2.plot([steps[-1]], [final_miou], marker="*", markersize=12, color="#3a9b3a", linestyle="none",
                         label=f"final mIoU, eval forward ({final_miou:.3f})")
        handles.append(l4)
    ax2.set_ylabel("mIoU", color="#3a9b3a")
    ax2.set_ylim(0, 1)
    ax.legend(handles=handles, loc="center right", fontsize=9)
    ax.set_title(title, fontsize=11)
    fig.savefig(path, dpi=110)
    plt.close(fig)
