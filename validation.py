"""Validation: loss, clip accuracy and video accuracy, exact over ranks."""
import torch
import torch.nn.functional as F
from tqdm import tqdm

from training import autocast_context, clips_to_device
from utils.distributed import all_reduce_sum, eval_module


@torch.no_grad()
def val_epoch(epoch, loader, model, ctx, config, tb_writer=None):
    """Each item is one video with n_val_samples clips (B, N, C, T, H, W).

    loss: mean cross-entropy over all clips; clip_acc: over all clips;
    acc: video accuracy, from the softmax averaged over a video's clips.
    Every rank sums over its own videos (no padded duplicates) and the sums are
    all-reduced once, so the result equals a single process's.
    """
    model = eval_module(model)
    device = ctx.device
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss, clip hits, video hits
    n_clips = n_videos = 0  # known on the host: no per-step copies to the device
    bar = tqdm(loader, desc=f'val {epoch}', disable=not (ctx.is_main and config.progress_bar),
               dynamic_ncols=True, leave=False)
    for clips, targets in bar:
        b, n = clips.shape[:2]
        clips = clips_to_device(clips.flatten(0, 1), device, config.channels_last,
                                getattr(loader.dataset, 'device_normalizer', None))
        targets = targets.to(device, non_blocking=True)
        with autocast_context(device, config.amp, config.amp_dtype):
            logits = model(clips)
        logits = logits.float()
        clip_targets = targets.repeat_interleave(n)
        loss_sum = F.cross_entropy(logits, clip_targets, reduction='sum')
        clip_hits = (logits.argmax(1) == clip_targets).sum()
        video_probs = logits.softmax(1).view(b, n, -1).mean(1)
        video_hits = (video_probs.argmax(1) == targets).sum()
        sums += torch.stack([loss_sum.double(), clip_hits.double(), video_hits.double()])
        n_clips += b * n
        n_videos += b
    totals = torch.cat([sums, torch.tensor([n_clips, n_videos], dtype=torch.float64).to(device)])
    loss_sum, clip_hits, video_hits, n_clips, n_videos = all_reduce_sum(totals, ctx).tolist()
    stats = dict(loss=loss_sum / max(n_clips, 1), acc=video_hits / max(n_videos, 1),
                 clip_acc=clip_hits / max(n_clips, 1), n_videos=int(n_videos))
    if tb_writer is not None:
        for key in ('loss', 'acc', 'clip_acc'):
            tb_writer.add_scalar(f'val/{key}', stats[key], epoch)
    return stats
