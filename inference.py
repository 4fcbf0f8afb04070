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
