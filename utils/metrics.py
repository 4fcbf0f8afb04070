"""Classification metrics from a confusion matrix, and its picture.

The confusion matrix has one row per true class and one column per predicted
class (``confusion[t, p]`` = videos of class t predicted as p), in the
annotation's label order. Videos without a usable prediction (no result, or a
label unknown to the annotation) are counted per true class in ``unscored``:
they lower recall and mean class accuracy but belong to no column.
"""
from dataclasses import dataclass

import numpy as np

from utils.atomic import atomic_path

__all__ = [
    'ClassReport',
    'VideoEvaluation',
    'class_report',
    'confusion_figure',
    'confusion_matrix',
    'evaluate_ranked',
    'format_report',
    'save_confusion_png',
]


def confusion_matrix(targets, predictions, n_classes):
    """(n_classes, n_classes) int64 counts; ``targets``/``predictions`` are class indices."""
    targets = np.asarray(targets, dtype=np.int64).reshape(-1)
    predictions = np.asarray(predictions, dtype=np.int64).reshape(-1)
    if targets.shape != predictions.shape:
        raise ValueError(f'{targets.size} targets but {predictions.size} predictions')
    flat = np.bincount(targets * n_classes + predictions, minlength=n_classes * n_classes)
    return flat.reshape(n_classes, n_classes)


@dataclass(frozen=True)
class ClassReport:
    """Per-class precision, recall, F1 and support (numpy arrays), and their summary.

    A class never predicted has precision 0 (and F1 0), as does one with no
    support; mean class accuracy is the mean recall over classes that have
    videos.
    """
    precision: np.ndarray
    recall: np.ndarray
    f1: np.ndarray
    support: np.ndarray

    @property
    def mean_class_accuracy(self):
        present = self.support > 0
        return float(self.recall[present].mean()) if present.any() else 0.0

    @property
    def accuracy(self):
        total = self.support.sum()
        return float((self.recall * self.support).sum() / total) if total else 0.0


def _ratio(num, den):
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    return np.divide(num, den, out=np.zeros_like(num), where=den > 0)


def class_report(confusion, unscored=None):
    """ClassReport of a confusion matrix (plus per-class unscored videos)."""
    confusion = np.asarray(confusion, dtype=np.int64)
    hits = np.diag(confusion)
    support = confusion.sum(1)
    if unscored is not None:
        support = support + np.asarray(unscored, dtype=np.int64)
    precision = _ratio(hits, confusion.sum(0))
    recall = _ratio(hits, support)
    f1 = _ratio(2 * precision * recall, precision + recall)
    return ClassReport(precision, recall, f1, support)


def format_report(report, class_names):
    """A plain-text table: one line per class, then the macro and weighted means."""
    width = max([len('weighted avg')] + [len(str(n)) for n in class_names])
    lines = [f'{"class":<{width}}  precision     recall         f1    support']
    rows = zip(class_names, report.precision, report.recall, report.f1, report.support)
    for name, p, r, f, s in rows:
        lines.append(f'{name:<{width}}  {p:9.4f}  {r:9.4f}  {f:9.4f}  {s:9d}')
    total = int(report.support.sum())
    weights = report.support / max(total, 1)
    lines.append('')
    for title, w in (('macro avg', None), ('weighted avg', weights)):
        means = [float(np.average(v, weights=w)) if total else 0.0
                 for v in (report.precision, report.recall, report.f1)]
        lines.append(f'{title:<{width}}  {means[0]:9.4f}  {means[1]:9.4f}  {means[2]:9.4f}'
                     f'  {total:9d}')
    return '\n'.join(lines)


@dataclass(frozen=True)
class VideoEvaluation:
    """Video-level results of one subset: top-k hits, the confusion matrix,
    the per-class report, in the order of ``class_names``."""
    class_names: list
    n_videos: int
    ks: tuple  # the k asked for; topk_hits leaves out those it cannot count
    topk_hits: dict  # k -> number of videos whose label is among the first k
    confusion: np.ndarray
    unscored: np.ndarray
    report: ClassReport
    depth: int | None = None  # labels ranked per video, when fewer than the classes
    n_missing: int = 0  # labelled videos without a result: wrong, or left out with ignore

    def topk(self, k):
        """Top-k accuracy, or None when it cannot be counted (fewer than k
        classes, or results that rank fewer than k labels per video)."""
        if k not in self.topk_hits:
            return None
        return self.topk_hits[k] / max(self.n_videos, 1)

    def summary_lines(self):
        lines = []
        for k, hits in self.topk_hits.items():
            lines.append(f'top-{k} accuracy: {hits / max(self.n_videos, 1):.4f} '
                         f'({hits}/{self.n_videos})')
        for k in (k for k in self.ks if k not in self.topk_hits):
            lines.append(f'top-{k} accuracy: {self.why_not(k)}')
        lines.append(f'mean class accuracy: {self.report.mean_class_accuracy:.4f} '
                     f'({int((self.report.support > 0).sum())} classes)')
        return lines

    def why_not(self, k):
        if k > len(self.class_names):
            return f'skipped (only {len(self.class_names)} classes)'
        return (f'not in the results, which rank {self.depth} labels per video (top-'
                f'{self.depth} above; inference with --output_topk {k} or 0 writes more)')


def _countable_ks(ks, n_classes, depth):
    """The k whose top-k the results can tell: at most the class count, and at
    most the labels ranked per video, which takes the place of a larger k."""
    countable = set()
    for k in ks:
        if k < 1:
            raise ValueError(f'k must be at least 1, got {k}')
        if k <= n_classes:
            countable.add(k if depth is None else min(k, depth))
    return sorted(countable)


def evaluate_ranked(ground_truth, ranked, class_names, ignore=False, ks=(1, 5), depth=None):
    """Evaluates ranked predictions against labels.

    ground_truth: {video_id: label name}; ranked: {video_id: label names by
    decreasing score}; class_names: the annotation's labels (their order is the
    matrix's); depth: the labels ranked per video when fewer than all (top-k
    for a larger k is top-depth). A labelled video without a result counts as
    wrong (unscored) unless ``ignore``; top-k is left out for k above the class
    count.
    """
    index = {name: i for i, name in enumerate(class_names)}
    unknown = sorted({label for label in ground_truth.values() if label not in index})
    if unknown:
        raise ValueError(f'ground-truth label {unknown[0]!r} is not among the annotation\'s '
                         f'labels')
    videos = [v for v in ground_truth if v in ranked or not ignore]
    n = len(class_names)
    depth = depth if depth and depth < n else None  # 0: no results at all
    targets, predictions = [], []
    unscored = np.zeros(n, dtype=np.int64)
    hits = {k: 0 for k in _countable_ks(ks, n, depth)}
    for v in videos:
        t = index[ground_truth[v]]
        labels = ranked.get(v) or []
        for k in hits:
            hits[k] += ground_truth[v] in labels[:k]
        if labels and labels[0] in index:
            targets.append(t)
            predictions.append(index[labels[0]])
        else:
            unscored[t] += 1
    confusion = confusion_matrix(targets, predictions, n)
    return VideoEvaluation(list(class_names), len(videos), tuple(sorted(set(ks))), hits,
                           confusion, unscored, class_report(confusion, unscored), depth,
                           sum(v not in ranked for v in ground_truth))


def _row_normalized(confusion):
    confusion = np.asarray(confusion, dtype=np.float64)
    return _ratio(confusion, confusion.sum(1, keepdims=True))


def confusion_figure(confusion, class_names, title='confusion matrix (row-normalized)'):
    """A matplotlib Figure of the row-normalized matrix, labelled on both axes.

    The figure grows with the class count (about 0.12 inch a class past 20) and
    the label font shrinks, so 8 and 101 classes are both readable; cell values
    are printed only for up to 20 classes.
    """
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend
    n = len(class_names)
    rates = _row_normalized(confusion)
    side = max(4.0, min(40.0, 2.5 + 0.12 * max(n, 20)))
    font = 9 if n <= 20 else max(4, min(9, 650 // n))
    fig = Figure(figsize=(side + 1.5, side), dpi=100, layout='constrained')
    ax = fig.add_subplot()
    image = ax.imshow(rates, vmin=0, vmax=1, cmap='Blues', interpolation='nearest')
    fig.colorbar(image, ax=ax, fraction=0.04)
    ax.set_xticks(range(n), labels=class_names, rotation=90, fontsize=font)
    ax.set_yticks(range(n), labels=class_names, fontsize=font)
    ax.set_xlabel('predicted class')
    ax.set_ylabel('true class')
    ax.set_title(title)
    if n <= 20:
        for t in range(n):
            for p in range(n):
                if rates[t, p] > 0:
                    ax.text(p, t, f'{rates[t, p]:.2f}', ha='center', va='center', fontsize=7,
                            color='white' if rates[t, p] > 0.5 else 'black')
    return fig


def save_confusion_png(confusion, class_names, path, title=None):
    """Writes the confusion picture to ``path`` (PNG)."""
    kwargs = {} if title is None else {'title': title}
    fig = confusion_figure(confusion, class_names, **kwargs)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format='png')
