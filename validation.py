"""Validation: loss, clip accuracy, video accuracy and the video confusion
matrix, exact over ranks."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from utils.distributed import all_reduce_sum, broadcast_buffers, eval_module
from utils.metrics import class_report, confusion_figure
from utils.precision import autocast_context


@torch.no_grad()
def val_epoch(epoch, loader, model, ctx, config, tb_writer=None, class_names=None):
    """Each item is one video with n_val_samples clips; `loader` (a
    DeviceLoader, datasets/device_batches.py) yields them on the device as
    (B * N, C, T, H, W) with the B videos' targets.

    loss: mean cross-entropy over all clips; clip_acc: over all clips;
    acc: video accuracy, from the softmax averaged over a video's clips;
    confusion: (n_classes, n_classes) int64 video counts (true class, predicted).
    Every rank sums over its own videos (no padded duplicates) and the sums are
    all-reduced once, so the result equals a single process's.
    """
    model = eval_module(model)
    device = ctx.device
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss, clip hits, video hits
    confusion = None  # (true, predicted) video counts, sized at the first batch
    n_clips = n_videos = 0  # known on the host: no per-step copies to the device
    bar = tqdm(loader, desc=f'val {epoch}', disable=not (ctx.is_main and config.progress_bar),
               dynamic_ncols=True, leave=False)
    for clips, targets in bar:
        b = targets.shape[0]
        n = clips.shape[0] // b
        with autocast_context(device, config.amp, config.amp_dtype):
            logits = model(clips)
        logits = logits.float()
        clip_targets = targets.repeat_interleave(n)
        loss_sum = F.cross_entropy(logits, clip_targets, reduction='sum')
        clip_hits = (logits.argmax(1) == clip_targets).sum()
        video_probs = logits.softmax(1).view(b, n, -1).mean(1)
        video_hits = (video_probs.argmax(1) == targets).sum()
        sums += torch.stack([loss_sum.double(), clip_hits.double(), video_hits.double()])
        confusion = add_to_confusion(confusion, targets, video_probs.argmax(1), logits.shape[1])
        n_clips += b * n
        n_videos += b
    n_classes = _agreed_class_count(confusion, device, ctx)
    if confusion is None:  # a rank without videos
        confusion = torch.zeros(n_classes, n_classes, dtype=torch.float64, device=device)
    # One collective for the sums, the counts and the confusion matrix (exact:
    # counts stay far below 2**53 in float64).
    totals = torch.cat([sums, torch.tensor([n_clips, n_videos], dtype=torch.float64).to(device),
                        confusion.flatten()])
    totals = all_reduce_sum(totals, ctx)
    loss_sum, clip_hits, video_hits, n_clips, n_videos = totals[:5].tolist()
    stats = dict(loss=loss_sum / max(n_clips, 1), acc=video_hits / max(n_videos, 1),
                 clip_acc=clip_hits / max(n_clips, 1), n_videos=int(n_videos),
                 confusion=totals[5:].view(n_classes, n_classes).long().cpu())
    if tb_writer is not None:
        log_to_tensorboard(tb_writer, stats, epoch, class_names)
    return stats


def validate(epoch, loader, model, ema, ctx, config, tb_writer=None, class_names=None):
    """The raw weights' validation statistics, with the EMA weights' loss and
    video accuracy beside them (ema_loss, ema_acc) when there is an EMA, each
    with rank 0's BatchNorm statistics (the checkpoint's) on every rank."""
    broadcast_buffers(model, ctx)
    if ema is not None:
        broadcast_buffers(ema.module, ctx)
    stats = val_epoch(epoch, loader, model, ctx, config, tb_writer, class_names)
    if ema is not None:
        ema_stats = val_epoch(epoch, loader, ema.module, ctx, config)
        stats.update(ema_loss=ema_stats['loss'], ema_acc=ema_stats['acc'])
        if tb_writer is not None:
            tb_writer.add_scalar('val/ema_acc', ema_stats['acc'], epoch)
    return stats


def describe_validation(stats):
    text = (f'val loss {stats["loss"]:.4f} video acc {stats["acc"]:.4f} '
            f'clip acc {stats["clip_acc"]:.4f}')
    if 'ema_acc' in stats:
        text += f' ema video acc {stats["ema_acc"]:.4f}'
    return text


def add_to_confusion(confusion, targets, predictions, n_classes):
    """confusion[t, p] += number of videos of class t predicted p (float64, on the device)."""
    counts = torch.bincount(targets * n_classes + predictions, minlength=n_classes * n_classes)
    counts = counts.view(n_classes, n_classes).double()
    return counts if confusion is None else confusion + counts


def _agreed_class_count(confusion, device, ctx):
    """The class count, also on a rank that saw no video (it must still join the
    all-reduce with a matrix of the same size)."""
    n = torch.tensor([0 if confusion is None else confusion.shape[0]], device=device)
    if ctx.distributed:
        dist.all_reduce(n, op=dist.ReduceOp.MAX)
    return int(n.item())


def log_to_tensorboard(tb_writer, stats, epoch, class_names=None):
    """Scalars, the per-class accuracy (recall) as a histogram and the
    row-normalized confusion matrix as a picture."""
    for key in ('loss', 'acc', 'clip_acc'):
        tb_writer.add_scalar(f'val/{key}', stats[key], epoch)
    confusion = stats['confusion'].numpy()
    report = class_report(confusion)
    tb_writer.add_histogram('val/class_accuracy', report.recall[report.support > 0], epoch)
    tb_writer.add_scalar('val/mean_class_accuracy', report.mean_class_accuracy, epoch)
    names = class_names or [str(i) for i in range(confusion.shape[0])]
    tb_writer.add_figure('val/confusion', confusion_figure(
        confusion, names, title=f'validation confusion, epoch {epoch}'), epoch)
