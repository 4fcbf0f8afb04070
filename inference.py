"""Inference: views (clips x spatial crops) over whole videos, softmax scores
averaged per video, top-k written to <result_path>/<subset>.json in
3D-ResNets-PyTorch's format, with the number of views of each video.

The clips are a sliding window (--inference_stride) or --inference_n_clips
clips spread evenly; each is one center crop, the whole frame, or three crops
along the long side. Views are batched across videos (a long video never has
to fit in memory at once); each rank takes whole videos, and rank 0 gathers
the per-video scores and writes the one file. A video annotated with several
segments (ActivityNet: one record each) gets one score, the mean over the
views of all its segments, and "views" counts them all.
"""
import json
import time
from dataclasses import dataclass

import torch
from tqdm import tqdm

from datasets.video_accuracy import evaluate_file
from utils.atomic import atomic_file, write_atomic
from utils.distributed import PG_TIMEOUT, eval_module, gather_objects_to_main, waiting_group
from utils.metrics import format_report, save_confusion_png
from utils.precision import autocast_context


@dataclass(frozen=True)
class InferenceOutput:
    """Rank 0's merged results, in the annotation's video order."""
    results: dict  # video_id -> [{label, score}] (or per view: [{segment, [crop,] result}])
    views: dict  # video_id -> number of views averaged (over all its segments)
    features: dict | None  # video_id -> mean pooled feature (float tensor), if asked


@torch.no_grad()
def run_inference(loader, model, class_names, ctx, config, result_file, topk=5, average=True,
                  feature_module=None):
    """`loader`: a DeviceLoader over a VideoWindowDataset (dataset.py's
    make_inference_loader). topk <= 0 writes every class; average=False
    writes each view's result.
    feature_module: the classifier, whose input is averaged per video too.
    Returns an InferenceOutput on rank 0, None elsewhere."""
    dataset = loader.dataset
    model = eval_module(model)
    scores = ViewScores(keep_views=not average)
    video_ids = VideoIds(dataset.records)
    started = time.monotonic()
    with waiting_group(ctx) as group:
        for indices, *rest in score_views(loader, model, config.amp, config.amp_dtype, feature_module,
                                          progress=ctx.is_main and config.progress_bar):
            # By video id: every segment (record) of an ActivityNet video counts
            # toward the one score (the shard keeps a video's records on one rank).
            scores.add([video_ids[v] for v in indices], *rest)
        n_crops = getattr(dataset.spatial_transform, 'n_crops', 1)
        local = {}
        for v, n_views in scores.counts.items():
            entries = _view_entries(scores.views[v], class_names, topk, n_crops) if not average \
                else topk_entries(scores.mean(v), class_names, topk)
            feature = scores.mean_features(v) if feature_module is not None else None
            local[v] = (entries, n_views, feature)
        # Not --dist_timeout: the shards hold about equal views, but storage is
        # uneven; a rank taking over twice this one's time (and over the 30
        # minutes of start-up) is taken for frozen.
        gathered = gather_objects_to_main(
            local, ctx, group, timeout=max(PG_TIMEOUT.total_seconds(), time.monotonic() - started))
    if not ctx.is_main:
        return None
    merged = {k: value for part in gathered for k, value in part.items()}
    # Keep the annotation's video order, whichever rank scored a video.
    ids = [v for v in dict.fromkeys(r.video_id for r in dataset.records) if v in merged]
    output = InferenceOutput({v: merged[v][0] for v in ids}, {v: merged[v][1] for v in ids},
                             {v: merged[v][2] for v in ids} if feature_module is not None else None)
    with atomic_file(result_file, 'w') as f:
        json.dump({'results': output.results, 'views': output.views}, f)
    return output


class VideoIds:
    """Record index -> video id, remembered (a RecordTable decodes it from bytes)."""

    def __init__(self, records):
        self.records = records
        self.known = {}

    def __getitem__(self, index):
        if index not in self.known:
            self.known[index] = self.records[index].video_id
        return self.known[index]


def _view_entries(views, class_names, topk, n_crops):
    """Per-view results; 'crop' (0, 1, 2: left/top, center, right/bottom) only
    with several crops, so single-crop files keep the predecessor's form."""
    entries = []
    for segment, crop, p in views:
        entry = {'segment': segment, 'result': topk_entries(p, class_names, topk)}
        if n_crops > 1:
            entry = {'segment': segment, 'crop': crop, 'result': entry['result']}
        entries.append(entry)
    return entries


def pooled(x):
    """The classifier's input as one vector per view (averaged over any
    remaining time/space positions)."""
    return x.flatten(1) if x.dim() == 2 else x.flatten(2).mean(2)


@torch.no_grad()
def score_views(loader, model, amp=False, amp_dtype=None, feature_module=None, progress=False):
    """`loader` yields (clips, video indices, segments) with the clips on the
    device (a DeviceLoader, datasets/device_batches.py: a batch of B items of K
    views each as B * K clips). Yields per batch (video indices, segments,
    softmax (B, K, n_classes), pooled features (B, K, D) or None), on the CPU;
    K is the spatial views of a clip (3 with --inference_crop three). Only one
    batch of views is in memory at a time."""
    captured = []
    hook = None
    if feature_module is not None:
        hook = feature_module.register_forward_hook(
            lambda module, args, out: captured.append(pooled(args[0]).float()))
    try:
        for clips, video_indices, segments in tqdm(loader, desc='inference', disable=not progress,
                                                   dynamic_ncols=True, leave=False):
            b = len(video_indices)
            with autocast_context(clips.device, amp, amp_dtype):
                logits = model(clips)
            probs = logits.float().softmax(1).view(b, -1, logits.shape[1]).cpu()
            features = captured.pop().view(b, probs.shape[1], -1).cpu() if hook else None
            segments = list(zip(*(s.tolist() for s in segments)))
            yield video_indices.tolist(), segments, probs, features
    finally:
        if hook is not None:
            hook.remove()


class ViewScores:
    """Per video (any key: a record index, a video id): the sum of its views'
    softmax (and pooled features) and the view count; with ``keep_views`` also
    every view's softmax, in the order added."""

    def __init__(self, keep_views=False):
        self.keep_views = keep_views
        self.sums, self.feature_sums, self.counts = {}, {}, {}
        self.views = {}  # video -> [(segment, crop, softmax)]

    def add(self, video_indices, segments, probs, features=None):
        for i, (v, segment) in enumerate(zip(video_indices, segments)):
            self._accumulate(self.sums, v, probs[i].double().sum(0))
            if features is not None:
                self._accumulate(self.feature_sums, v, features[i].double().sum(0))
            self.counts[v] = self.counts.get(v, 0) + probs.shape[1]
            if self.keep_views:
                self.views.setdefault(v, []).extend(
                    (list(segment), k, p) for k, p in enumerate(probs[i]))

    @staticmethod
    def _accumulate(sums, v, value):
        sums[v] = sums[v] + value if v in sums else value

    def mean(self, v):
        return (self.sums[v] / self.counts[v]).float()

    def mean_features(self, v):
        return (self.feature_sums[v] / self.counts[v]).float()


def topk_entries(scores, class_names, k):
    """[{label, score}] of the k best classes (all for k <= 0)."""
    k = len(class_names) if k <= 0 else min(k, len(class_names))
    values, indices = scores.topk(k)
    return [{'label': class_names[i], 'score': float(v)}
            for v, i in zip(values.tolist(), indices.tolist())]


def write_features(path, video_ids, features, n_views):
    """HDF5: ``features`` float32 (videos, D), ``video_ids`` (utf-8 strings) and
    ``n_views`` int (views averaged per video), rows in the same order."""
    import h5py
    import numpy as np
    with h5py.File(path, 'w') as f:
        f.create_dataset('features', data=np.stack([x.numpy() for x in features])
                         if features else np.zeros((0, 0), np.float32))
        f.create_dataset('video_ids', data=list(video_ids), dtype=h5py.string_dtype())
        f.create_dataset('n_views', data=np.asarray(n_views, dtype=np.int64))


PRINTED_REPORT_CLASSES = 30


def report_inference(result_file, annotation_path, subset):
    """The evaluation of a result file on the annotation's `subset`
    ('validation', ...): top-1/top-5 (top-k up to the labels the file ranks,
    with a note) and mean class accuracy printed, and the per-class report up to
    PRINTED_REPORT_CLASSES classes; the per-class report and the
    confusion picture written next to the result file (<stem>_report.txt,
    <stem>_confusion.png)."""
    evaluation = evaluate_file(annotation_path, result_file, subset, ks=(1, 5))
    for line in evaluation.summary_lines():
        # 'top-1 accuracy: 0.75 (3/4)' -> 'inference top-1 video accuracy on validation: ...'
        name, value = line.split(': ', 1)
        name = name.replace(' accuracy', ' video accuracy') if name.startswith('top-') else name
        print(f'inference {name} on {subset}: {value}')
    stem = result_file.with_suffix('')
    report = format_report(evaluation.report, evaluation.class_names)
    write_atomic(stem.with_name(f'{stem.name}_report.txt'),
                 '\n'.join(evaluation.summary_lines()) + '\n\n' + report + '\n')
    if len(evaluation.class_names) <= PRINTED_REPORT_CLASSES:  # Kinetics' 400 rows stay in the file
        print(report)
    save_confusion_png(evaluation.confusion, evaluation.class_names,
                       stem.with_name(f'{stem.name}_confusion.png'))
    print(f'per-class report and confusion matrix: {stem}_report.txt, {stem}_confusion.png',
          flush=True)
