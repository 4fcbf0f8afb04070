"""The video evaluation of an inference result file against an annotation
file (evaluate_file: after --inference in main.py, and
util_scripts/eval_accuracy.py): both files read, then utils/metrics.py's
evaluate_ranked.

The result file is what inference writes: {"results": {video_id: [{"label",
"score"}, ...]}}, or the per-clip form {"results": {video_id: [{"segment",
"result": [...]}, ...]}}, whose scores are averaged over the clips of each
video first. Every labelled video of the subset counts; one without a result
counts as wrong unless ignore=True restricts the evaluation to the videos in
the results.
"""
import json
import sys
from collections import Counter
from pathlib import Path

from datasets.annotation import SUBSET_NAMES, read_annotation, video_labels
from utils.errors import DataError
from utils.metrics import evaluate_ranked


def canonical_subset(subset):
    return SUBSET_NAMES.get(subset, subset)


def _load(path, what):
    path = Path(path)
    if not path.is_file():
        raise DataError(f'{what} not found: {path}')
    with path.open('r') as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise DataError(f'{what} {path} is not valid JSON: {e}') from None


def load_ground_truth(gt_path, subset):
    """({video_id: label} of the subset's labelled videos, all labels); the
    annotation file is read as training reads it (DataError naming the file)."""
    data = read_annotation(gt_path, check='the ground-truth annotation path')
    entries = video_labels(data)
    ground_truth = {video_id: label for video_id, (entry_subset, label) in entries.items()
                    if entry_subset == subset and label is not None}
    if not ground_truth:
        labelled = Counter({entry_subset: 0 for entry_subset, _ in entries.values()})
        labelled.update(entry_subset for entry_subset, label in entries.values()
                        if label is not None)
        present = ', '.join(f'{name} ({n} labelled)'
                            for name, n in sorted(labelled.items(), key=lambda x: str(x[0])))
        raise DataError(f"subset '{subset}' has no labelled video in "
                        f'{gt_path}; subsets present: {present or "none"}')
    return ground_truth, data.get('labels', [])


def average_clips(clips, video_id):
    """Mean score per label over a video's clips (per-clip results).

    Clips keep only their top-k labels; a label a clip left out counts
    as score 0 for that clip.
    """
    totals = {}
    for clip in clips:
        if not isinstance(clip, dict) or 'result' not in clip:
            raise ValueError(f'video {video_id}: mixes per-clip entries '
                             '(with "result") and per-video entries')
        for item in clip['result']:
            totals[item['label']] = totals.get(item['label'], 0.0) + \
                item['score']
    return [{'label': label, 'score': total / len(clips)}
            for label, total in totals.items()]


def load_results(result_path):
    """({video_id: labels sorted by decreasing score}, depth): depth is the most
    labels the file ranks for a video (for per-clip results, for a clip), which
    is inference's --output_topk when it wrote fewer than all classes."""
    data = _load(result_path, 'result JSON')
    if not isinstance(data, dict) or not isinstance(data.get('results'),
                                                    dict):
        raise ValueError(f'{result_path} has no "results" object: expected '
                         '{"results": {"<video_id>": [{"label", "score"}, '
                         '...]}}')
    ranked = {}
    depth = 0
    for video_id, entries in data['results'].items():
        if entries and isinstance(entries[0], dict) and 'result' in entries[0]:
            entries = average_clips(entries, video_id)
            depth = max([depth] + [len(clip['result']) for clip in data['results'][video_id]])
        else:
            depth = max(depth, len(entries))
        try:
            # Stable sort: ties keep the file's order.
            ordered = sorted(entries, key=lambda e: e['score'], reverse=True)
            ranked[video_id] = [e['label'] for e in ordered]
        except (KeyError, TypeError):
            raise ValueError(f'{result_path}: video {video_id}: entries need '
                             '"label" and "score"')
    return ranked, depth


def evaluate_file(gt_path, result_path, subset='validation', ignore=False, ks=(1, 5)):
    """VideoEvaluation of an inference result file against an annotation file,
    classes in the annotation's label order (sorted ground-truth labels if it
    lists none). Warns on stderr when the results use labels the annotation
    lacks, or share no video with the subset (an error with ``ignore``)."""
    subset = canonical_subset(subset)
    ground_truth, labels = load_ground_truth(gt_path, subset)
    results, depth = load_results(result_path)
    unknown = {label for ranked in results.values() for label in ranked} - set(labels)
    if labels and unknown:
        print(f'warning: the results use {len(unknown)} label(s) absent from {gt_path} '
              f'(e.g. {sorted(unknown)[0]!r}); is it the right annotation file?',
              file=sys.stderr)
    if not any(v in results for v in ground_truth):
        message = (f"none of the {len(ground_truth)} '{subset}' videos of {gt_path} has a "
                   f'result in {result_path}; check --subset and that both files describe '
                   f'the same dataset and split')
        if ignore:
            raise ValueError(message)
        print('warning: ' + message, file=sys.stderr)
    class_names = list(labels) or sorted(set(ground_truth.values()))
    return evaluate_ranked(ground_truth, results, class_names, ignore=ignore, ks=ks,
                           depth=depth)
