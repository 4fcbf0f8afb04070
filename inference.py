"""Inference: sliding-window clips over whole videos, scores averaged per video,
top-k written to <result_path>/<subset>.json in 3D-ResNets-PyTorch's format.

Windows are batched across videos (never one whole video at once, which ran
out of memory on long videos in the predecessor); each rank takes whole
videos, and rank 0 gathers the per-video scores and writes the one file.
"""
import json
from collections import defaultdict

import torch
from tqdm import tqdm

from training import autocast_context, clips_to_device
from utils.distributed import eval_module, gather_objects_to_main


def _topk(scores, class_names, k):
    k = len(class_names) if k <= 0 else min(k, len(class_names))
    values, indices = scores.topk(k)
    return [{'label': class_names[i], 'score': float(v)} for v, i in zip(values.tolist(),
                                                                       indices.tolist())]


@torch.no_grad()
def run_inference(loader, model, class_names, ctx, config, result_file, topk=5, average=True):
    """topk <= 0 writes every class; average=False writes each window's result."""
    dataset = loader.dataset
    model = eval_module(model)
    prob_sums = {}
    counts = defaultdict(int)
    per_clip = defaultdict(list)
    for clips, video_indices, segments in tqdm(loader, desc='inference',
                                               disable=not (ctx.is_main and config.progress_bar),
                                               dynamic_ncols=True, leave=False):
        clips = clips_to_device(clips, ctx.device, config.channels_last, dataset.device_normalizer)
        with autocast_context(ctx.device, config.amp, config.amp_dtype):
            logits = model(clips)
        probs = logits.float().softmax(1).cpu()
        begins, ends = segments
        for p, v, b, e in zip(probs, video_indices.tolist(), begins.tolist(), ends.tolist()):
            if not average:
                per_clip[v].append(([b, e], p))
            else:
                prob_sums[v] = prob_sums[v] + p if v in prob_sums else p.clone()
                counts[v] += 1
    if not average:
        local = {dataset.records[v].video_id:
                 [{'segment': seg, 'result': _topk(p, class_names, topk)}
                  for seg, p in clips_of_video]
                 for v, clips_of_video in per_clip.items()}
    else:
        local = {dataset.records[v].video_id: _topk(s / counts[v], class_names, topk)
                 for v, s in prob_sums.items()}
    gathered = gather_objects_to_main(local, ctx)
    if not ctx.is_main:
        return None
    results = {}
    for part in gathered:
        results.update(part)
    # Keep the annotation's video order, whichever rank scored a video.
    ordered = {r.video_id: results[r.video_id] for r in dataset.records if r.video_id in results}
    with open(result_file, 'w') as f:
        json.dump({'results': ordered}, f)
    return ordered


def pooled(x):
    """The classifier's input as one vector per view (averaged over any
    remaining time/space positions)."""
    return x.flatten(1) if x.dim() == 2 else x.flatten(2).mean(2)


@torch.no_grad()
def score_views(loader, model, device, normaliser=None, amp=False, channels_last=False,
                feature_module=None, progress=False):
    """Yields per batch (video indices, segments, softmax (B, K, n_classes),
    pooled features (B, K, D) or None), on the CPU; K is the spatial views of a
    clip (3 with --inference_crop three). Only one batch of views is in
    memory at a time."""
    captured = []
    hook = None
    if feature_module is not None:
        hook = feature_module.register_forward_hook(
            lambda module, args, out: captured.append(pooled(args[0]).float()))
    try:
        for clips, video_indices, segments in tqdm(loader, desc='inference', disable=not progress,
                                                   dynamic_ncols=True, leave=False):
            b = clips.shape[0]
            clips = clips.flatten(0, 1) if clips.dim() == 6 else clips
            clips = clips_to_device(clips, device, channels_last, normaliser)
            with autocast_context(device, amp):
                logits = model(clips)
            probs = logits.float().softmax(1).view(b, -1, logits.shape[1]).cpu()
            features = captured.pop().view(b, probs.shape[1], -1).cpu() if hook else None
            segments = list(zip(*(s.tolist() for s in segments)))
            yield video_indices.tolist(), segments, probs, features
    finally:
        if hook is not None:
            hook.remove()


class ViewScores:
    """Per video: the sum of its views' softmax (and pooled features) and the
    view count; with ``keep_views`` also every view's softmax."""

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
