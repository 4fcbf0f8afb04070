"""One training epoch, and the optimizer and learning-rate schedule it uses."""
import contextlib
import math
import time

import torch
from torch.optim import SGD, AdamW
from torch.optim.lr_scheduler import LambdaLR, MultiStepLR, ReduceLROnPlateau
from tqdm import tqdm

from model import keep_frozen_eval
from utils.distributed import all_reduce_sum


def make_optimizer(model, opt):
    """One parameter group with every trainable tensor (frozen ones left out)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if opt.optimizer == 'sgd':
        return SGD(params, lr=opt.learning_rate, momentum=opt.momentum,
                   dampening=opt.dampening, weight_decay=opt.weight_decay,
                   nesterov=opt.nesterov)
    return AdamW(params, lr=opt.learning_rate, weight_decay=opt.weight_decay)


def make_scheduler(optimizer, opt, steps_per_epoch):
    """multistep and plateau step once per epoch (after validation); cosine steps
    once per optimizer step, after a linear warmup."""
    if opt.lr_scheduler == 'multistep':
        return MultiStepLR(optimizer, opt.multistep_milestones)
    if opt.lr_scheduler == 'plateau':
        return ReduceLROnPlateau(optimizer, 'min', patience=opt.plateau_patience)
    total = max(1, opt.n_epochs * steps_per_epoch)
    warmup = int(round(opt.warmup_epochs * steps_per_epoch))
    floor = opt.min_lr / opt.learning_rate if opt.learning_rate > 0 else 0.0

    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)


def steps_per_epoch(n_batches, accumulation_steps):
    return math.ceil(n_batches / accumulation_steps)


def clips_to_device(clips, device, channels_last=False, normaliser=None):
    """Clips to the device, asynchronously from pinned memory, as (N, C, T, H, W)
    float: uint8 (N, T, C, H, W) clips are normalised there by `normaliser`."""
    clips = clips.to(device, non_blocking=True)
    if normaliser is not None:
        clips = normaliser(clips)
    if channels_last:
        clips = clips.contiguous(memory_format=torch.channels_last_3d)
    return clips


def autocast_context(device, enabled):
    if not enabled:
        return contextlib.nullcontext()
    dtype = amp_dtype(device)
    return torch.autocast(device_type=device.type, dtype=dtype)


def amp_dtype(device):
    if device.type == 'cuda' and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16


def train_epoch(epoch, loader, model, criterion, optimizer, scheduler, scaler, ctx, opt,
                batch_logger=None, tb_writer=None):
    """Trains one epoch; returns the epoch's loss, accuracy, lr, clips/s and the
    fraction of time spent waiting for data, reduced over all ranks.

    No host synchronisation per step: losses and hit counts stay on the device
    and are read every --log_interval steps (progress bar, train_batch.log).
    """
    model.train()
    keep_frozen_eval(model)
    device = ctx.device
    per_iter_schedule = opt.lr_scheduler == 'cosine'
    n_batches = len(loader)
    k = opt.accumulation_steps
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss * n, correct
    pending = []  # per-batch (loss, acc) on device, flushed every log_interval
    pending_meta = []
    bar = tqdm(total=n_batches, desc=f'train {epoch}', disable=not ctx.is_main or opt.no_progress,
               dynamic_ncols=True, leave=False)
    wait = 0.0
    start = time.perf_counter()
    clips_seen = 0
    last_report = start
    last_clips = 0
    it = iter(loader)
    normaliser = getattr(loader.dataset, 'device_normaliser', None) \
        if hasattr(loader, 'dataset') else None
    for i in range(n_batches):
        lr_now = optimizer.param_groups[0]['lr']  # the lr this step uses
        t0 = time.perf_counter()
        inputs, targets = next(it)
        wait += time.perf_counter() - t0
        inputs = clips_to_device(inputs, device, opt.channels_last, normaliser)
        targets = targets.to(device, non_blocking=True)
        sync_now = (i + 1) % k == 0 or i == n_batches - 1
        no_sync = model.no_sync() if (ctx.distributed and not sync_now) else contextlib.nullcontext()
        with no_sync:
            with autocast_context(device, opt.amp):
                outputs = model(inputs)
                loss = criterion(outputs.float(), targets)
            scaler.scale(loss / k).backward()
        if sync_now:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            if per_iter_schedule:
                scheduler.step()
        with torch.no_grad():
            n = targets.numel()
            correct = (outputs.argmax(1) == targets).sum()
            sums += torch.stack([loss.detach().double() * n, correct.double()])
            pending.append(torch.stack([loss.detach().float(), correct.float() / n]))
            pending_meta.append((i + 1, (epoch - 1) * n_batches + i + 1, lr_now))
        clips_seen += targets.numel()
        bar.update(1)
        if len(pending) >= opt.log_interval or i == n_batches - 1:
            values = torch.stack(pending).tolist()  # the one sync per interval
            if batch_logger is not None:
                batch_logger.log_many(
                    dict(epoch=epoch, batch=b, iter=step, loss=lv, acc=av, lr=lr)
                    for (lv, av), (b, step, lr) in zip(values, pending_meta))
            now = time.perf_counter()
            rate = (clips_seen - last_clips) * ctx.world_size / max(now - last_report, 1e-9)
            last_report, last_clips = now, clips_seen
            loss_v, acc_v = values[-1]
            bar.set_postfix(loss=f'{loss_v:.3f}', acc=f'{acc_v:.3f}', lr=f'{lr_now:.3g}',
                            clips_s=f'{rate:.1f}')
            if ctx.is_main and opt.no_progress:
                print(f'epoch {epoch} [{i + 1}/{n_batches}] loss {loss_v:.4f} acc {acc_v:.3f} '
                      f'lr {lr_now:.4g} clips/s {rate:.1f}', flush=True)
            pending.clear()
            pending_meta.clear()
    bar.close()
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    # Clip counts are known on the host; one collective for the whole epoch.
    totals = torch.cat([sums, torch.tensor([clips_seen], dtype=torch.float64).to(device)])
    loss_sum, correct, count = all_reduce_sum(totals, ctx).tolist()
    stats = dict(loss=loss_sum / max(count, 1), acc=correct / max(count, 1), lr=lr_now,
                 clips_per_s=count / max(elapsed, 1e-9),
                 data_wait=wait / max(elapsed, 1e-9))
    if tb_writer is not None:
        for key, value in stats.items():
            tb_writer.add_scalar(f'train/{key}', value, epoch)
    return stats
