"""One training epoch, the optimizer it steps and the settings the loops share;
an epoch of a run: trained, validated and logged."""
import contextlib
import itertools
import math
import time
from dataclasses import dataclass

import torch
from torch.optim import SGD, AdamW
from tqdm import tqdm

from datasets.bad_videos import SkipBadVideos
from model import keep_frozen_eval
from utils.distributed import all_reduce_sum, unwrap
from utils.ema import update_ema
from utils.errors import OptionError
from utils.launch import log
from utils.mix import MixConfig, mix_batch
from utils.precise_bn import recompute_bn_stats
from utils.precision import autocast_context
from validation import describe_validation, validate


@dataclass(frozen=True)
class LoopConfig:
    """What the training, validation and inference loops need besides the model
    and the data (whose DeviceLoader puts the clips on the device in their
    layout): read from the options and the run record once, in main.py."""
    amp: bool = False  # already off on CPU
    accumulation_steps: int = 1
    log_interval: int = 10
    progress_bar: bool = True  # plain lines every log_interval steps otherwise
    frozen_modules: tuple[str, ...] = ()  # kept in eval mode (fine-tuning)
    amp_dtype: str | None = None  # 'bf16' | 'fp16'; None: bf16 where supported
    clip_grad_norm: float = 0.0  # 0: no clipping
    mix: MixConfig = MixConfig()  # mixup / cutmix, off by default
    n_classes: int = 0  # for the mixed targets


@dataclass(frozen=True)
class OptimizerConfig:
    name: str  # 'sgd' | 'adamw'
    learning_rate: float
    momentum: float = 0.9
    dampening: float = 0.0
    weight_decay: float = 1e-3
    nesterov: bool = False
    head: str = ''  # the classifier's module name, for backbone_lr_ratio
    backbone_lr_ratio: float = 1.0  # --ft_lr_ratio


def parameter_groups(model, config):
    """Every trainable tensor (frozen ones left out): one group, or with
    backbone_lr_ratio != 1 the head at the full rate first (param_groups[0] is
    the rate the logs show) and the rest at ratio x the rate."""
    named = [(n, p) for n, p in unwrap(model).named_parameters() if p.requires_grad]
    if config.backbone_lr_ratio == 1.0:
        return [p for _, p in named]
    prefix = config.head + '.'
    head = [p for n, p in named if n.startswith(prefix)]
    rest = [p for n, p in named if not n.startswith(prefix)]
    if not head:
        raise OptionError(f'--ft_lr_ratio: the model has no trainable {config.head} to train at '
                          f'the full rate')
    groups = [{'params': head, 'lr': config.learning_rate}]
    if rest:
        groups.append({'params': rest, 'lr': config.learning_rate * config.backbone_lr_ratio})
    return groups


def make_optimizer(model, config):
    """SGD or AdamW over parameter_groups(model, config)."""
    params = parameter_groups(model, config)
    if config.name == 'sgd':
        return SGD(params, lr=config.learning_rate, momentum=config.momentum,
                   dampening=config.dampening, weight_decay=config.weight_decay,
                   nesterov=config.nesterov)
    return AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)


def optimizer_kind(state):
    """'sgd' or 'adamw': which optimizer wrote a state_dict (a 3D-ResNets-PyTorch
    checkpoint's is SGD's), None when it cannot tell."""
    groups = (state or {}).get('param_groups') or [{}]
    if 'betas' in groups[0]:
        return 'adamw'
    return 'sgd' if 'nesterov' in groups[0] else None


class BatchReport:
    """Per-step loss and accuracy kept on the device and read once every
    log_interval steps: no host synchronisation per step."""

    def __init__(self, epoch, n_batches, world_size, log_interval, batch_logger, print_lines,
                 clips_before=0):
        self.epoch, self.n_batches, self.world_size = epoch, n_batches, world_size
        self.log_interval, self.batch_logger, self.print_lines = log_interval, batch_logger, print_lines
        self.pending, self.meta = [], []
        self.first_loss = None  # of the first step reported
        # clips_before: the clips of the epoch a resumed run did not redo (its rate starts now)
        self.last_time, self.last_clips = time.perf_counter(), clips_before

    def add(self, i, loss, correct, n, lr):
        self.pending.append(torch.stack([loss.detach().float(), correct.float() / n]))
        self.meta.append((i + 1, (self.epoch - 1) * self.n_batches + i + 1, lr))

    def due(self, i):
        return len(self.pending) >= self.log_interval or i == self.n_batches - 1

    def flush(self, clips_seen, bar):
        values = torch.stack(self.pending).tolist()  # the one sync per interval
        self.first_loss = values[0][0] if self.first_loss is None else self.first_loss
        if self.batch_logger is not None:
            self.batch_logger.log_many(
                dict(epoch=self.epoch, batch=b, iter=step, loss=lv, acc=av, lr=lr)
                for (lv, av), (b, step, lr) in zip(values, self.meta))
        now = time.perf_counter()
        rate = (clips_seen - self.last_clips) * self.world_size / max(now - self.last_time, 1e-9)
        self.last_time, self.last_clips = now, clips_seen
        (loss, acc), (batch, _, lr) = values[-1], self.meta[-1]
        bar.set_postfix(loss=f'{loss:.3f}', acc=f'{acc:.3f}', lr=f'{lr:.3g}', clips_s=f'{rate:.1f}')
        if self.print_lines:
            print(f'epoch {self.epoch} [{batch}/{self.n_batches}] loss {loss:.4f} acc {acc:.3f} '
                  f'lr {lr:.4g} clips/s {rate:.1f}', flush=True)
        self.pending.clear()
        self.meta.clear()


class EpochTotals:
    """This process's running sums over an epoch, from which its train.log row
    is computed: loss x clips and correct clips (on the device, no per-step
    sync), clips, seconds waiting for data and seconds training. A mid-epoch
    checkpoint keeps them (state_dict), so the row of a resumed epoch covers
    the whole epoch, as the uninterrupted run's does; the time a run was down
    is not counted."""

    def __init__(self, device, state=None):
        self.sums = torch.zeros(2, dtype=torch.float64, device=device)
        self.clips, self.wait_s, self.train_s = 0, 0.0, 0.0
        self.since = time.perf_counter()
        if state:
            self.sums.copy_(state['sums'])
            self.clips, self.wait_s, self.train_s = \
                int(state['clips']), float(state['wait_s']), float(state['train_s'])

    def start(self):
        self.since = time.perf_counter()

    def seconds(self):
        return self.train_s + time.perf_counter() - self.since

    def state_dict(self):
        return dict(sums=self.sums.cpu(), clips=self.clips, wait_s=self.wait_s,
                    train_s=self.seconds())


class LossWatch:
    """One warning line when the training loss turns nan or inf (at any epoch),
    or grows tenfold over the loss of its first step (in the run's first
    epochs), and one when the validation loss grows tenfold over its lowest
    (or turns nan): most often the learning rate is too high for the data (the
    default, 0.1, is sized for batch 128 on Kinetics; a small data set can
    diverge with it)."""

    def __init__(self, learning_rate, first_epoch, n_epochs=5):
        self.learning_rate = learning_rate  # --learning_rate, as given
        self.last_watched = first_epoch + n_epochs - 1
        self.reference = None  # the loss of the run's first step
        self.best_val = None  # (lowest validation loss, its epoch)
        self.warned = self.warned_val = False

    def check(self, epoch, loss, first_loss, val_loss=None):
        """The warning line, or None, after an epoch of mean training loss
        `loss` whose first step's was `first_loss`, and validation loss
        `val_loss` (None: not validated)."""
        if self.reference is None and first_loss is not None and math.isfinite(first_loss):
            self.reference = first_loss
        line = None if self.warned else self._training(epoch, loss)
        self.warned = self.warned or line is not None
        if val_loss is not None:
            if line is None and not self.warned_val:
                line = self._validation(epoch, val_loss)
                self.warned_val = line is not None
            if math.isfinite(val_loss) and (self.best_val is None or val_loss < self.best_val[0]):
                self.best_val = (val_loss, epoch)
        return line

    def _training(self, epoch, loss):
        if not math.isfinite(loss):
            return self._line(f'training loss is {loss} in epoch {epoch}')
        if epoch <= self.last_watched and self.reference is not None and loss >= 10 * self.reference:
            return self._line(f'training loss grew from {self.reference:.4g} (the first step) to '
                              f'{loss:.4g} (epoch {epoch})')
        return None

    def _validation(self, epoch, loss):
        if self.best_val is None:
            return None
        best, best_epoch = self.best_val
        if not math.isfinite(loss):
            return self._line(f'validation loss is {loss} in epoch {epoch} (lowest {best:.4g}, epoch '
                              f'{best_epoch})')
        if loss < 10 * best:
            return None
        return self._line(f'validation loss grew from {best:.4g} (epoch {best_epoch}) to {loss:.4g} '
                          f'(epoch {epoch})')

    def _line(self, what):
        lr = self.learning_rate
        return (f'warning: the {what}: the learning rate is likely too high for this data; give a '
                f'smaller --learning_rate than {lr:g} (e.g. {lr / 10:g}), or warm up to it '
                f'(--lr_scheduler cosine --warmup_epochs 2)')


@dataclass
class Trainer:
    """What the epoch loop steps, and what a checkpoint saves besides the
    weights (checkpoint.py makes it and writes it): the optimizer, its
    LRSchedule (None: a constant rate), the gradient scaler, the EMA model
    (None: off), the numpy generator of this epoch's mixup/cutmix draws
    (seeded per rank and epoch) and this process's running sums of the epoch
    (None: from zero; a mid-epoch resume: the sums of the batches done)."""
    optimizer: torch.optim.Optimizer
    schedule: object
    scaler: torch.amp.GradScaler
    ema: object = None
    mix_rng: object = None
    totals: EpochTotals | None = None


def train_epoch(epoch, loader, model, criterion, trainer, ctx, config, batch_logger=None,
                tb_writer=None, first_batch=0, after_step=None):
    """Trains one epoch from batch `first_batch` (a mid-epoch resume: the loader
    starts after the batches done); returns the epoch's loss, accuracy, lr,
    clips/s, the fraction of time spent waiting for data (reduced over all
    ranks) and the seconds the first step took (the compilation, with --compile).
    after_step(batches_done), called after each optimizer step but the epoch's
    last, ends the epoch there by returning True (a stop signal). `loader`
    yields (clips, targets) on the device: a DeviceLoader
    (datasets/device_batches.py); the data wait includes queueing their copy.

    The schedule's step and the EMA update follow every optimizer step that
    ran (an fp16 scaler skips those with inf/nan gradients). Each
    micro-batch's loss is divided by its accumulation group's size (the
    epoch's last group may be smaller). With mixup/cutmix the accuracy is
    against each clip's dominant label."""
    optimizer, scaler, device, k = trainer.optimizer, trainer.scaler, ctx.device, config.accumulation_steps
    model.train()
    keep_frozen_eval(model, config.frozen_modules)
    first, n_batches = first_batch, first_batch + len(loader)
    totals = trainer.totals or EpochTotals(device)
    totals.start()
    report = BatchReport(epoch, n_batches, ctx.world_size, config.log_interval, batch_logger,
                         print_lines=ctx.is_main and not config.progress_bar, clips_before=totals.clips)
    bar = tqdm(total=n_batches, initial=first, desc=f'train {epoch}', dynamic_ncols=True, leave=False,
               disable=not (ctx.is_main and config.progress_bar))
    first_step_s, batches = 0.0, iter(loader)
    for i in range(first, n_batches):
        lr_now = optimizer.param_groups[0]['lr']  # the lr this step uses
        t0 = time.perf_counter()
        inputs, targets = next(batches)  # on the device (datasets/device_batches.py)
        totals.wait_s += time.perf_counter() - t0
        batch = mix_batch(inputs, targets, config.n_classes, config.mix, trainer.mix_rng)
        sync_now = (i + 1) % k == 0 or i == n_batches - 1
        group = min(k, n_batches - i // k * k)  # micro-batches in this accumulation group
        no_sync = model.no_sync() if (ctx.distributed and not sync_now) else contextlib.nullcontext()
        with no_sync:
            with autocast_context(device, config.amp, config.amp_dtype):
                outputs = model(batch.clips)
                loss = criterion(outputs.float(), batch.targets)
            scaler.scale(loss / group).backward()
        if sync_now:
            step_and_follow(optimizer, scaler, config.clip_grad_norm, trainer.schedule, trainer.ema, model)
        if i == first:
            first_step_s = time.perf_counter() - t0
        with torch.no_grad():
            n = batch.dominant.numel()
            correct = (outputs.argmax(1) == batch.dominant).sum()
            totals.sums += torch.stack([loss.detach().double() * n, correct.double()])
            report.add(i, loss, correct, n, lr_now)
        totals.clips += n
        bar.update(1)
        stop = sync_now and i < n_batches - 1 and after_step is not None and after_step(i + 1)
        if report.due(i) or (stop and report.pending):
            report.flush(totals.clips, bar)
        if stop:
            break
    bar.close()
    stats = _epoch_stats(totals, lr_now, ctx, epoch, tb_writer)
    return dict(stats, first_step_s=first_step_s, first_loss=report.first_loss)


def train_and_validate(run, epoch, train_loader, trainer, logs, first_batch, after_step):
    """One epoch of main.py's fit (`run`: its Run): trained from first_batch
    (train_epoch's after_step ends it early), its BatchNorm statistics
    recomputed (--precise_bn), validated, logged (`logs`: utils.logs.training_logs),
    and the schedule stepped. Returns the epoch's training and validation
    statistics (the latter None without validation)."""
    opt, ctx, tb_writer = run.opt, run.ctx, run.tb_writer
    t0 = time.time()
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=opt.label_smoothing).to(ctx.device)
    stats = train_epoch(epoch, train_loader, run.model, criterion, trainer, ctx, run.config,
                        logs['batch'], tb_writer, first_batch, after_step)
    if opt.compile and epoch == run.record.begin_epoch:
        log(ctx, f'compile: the first training step took {stats["first_step_s"]:.1f} s '
                 f'(compilation included)')
    line = (f'epoch {epoch}/{opt.n_epochs} train loss {stats["loss"]:.4f} acc {stats["acc"]:.4f} '
            f'lr {stats["lr"]:.4g} {stats["clips_per_s"]:.1f} clips/s data wait {stats["data_wait"]:.0%}')
    line += count_skipped(run.datasets.train, ctx, tb_writer, epoch)
    if ctx.is_main:
        logs['train'].log(dict(epoch=epoch, **stats))
    val_stats = None
    if opt.precise_bn > 0:
        precise_bn(run.model, train_loader, opt.precise_bn, ctx, run.config)
    if run.val_loader is not None:
        val_stats = validate(epoch, run.val_loader, run.model, trainer.ema, ctx, run.config, tb_writer,
                             run.datasets.class_names)
        line += ' | ' + describe_validation(val_stats)
        if ctx.is_main:
            logs['val'].log(dict(epoch=epoch, **val_stats))
    log(ctx, line + f' ({time.time() - t0:.0f}s)')
    # The schedule steps before the checkpoint is written, so a resumed run
    # starts the next epoch with the right learning rate.
    trainer.schedule.after_epoch(val_stats['loss'] if val_stats else stats['loss'])
    if tb_writer is not None:
        tb_writer.flush()
    if logs['curves'] is not None:
        logs['curves'].request()
    return stats, val_stats


def count_skipped(train_set, ctx, tb_writer, epoch):
    """--on_bad_video skip: the samples replaced this epoch, over all ranks."""
    if not isinstance(train_set, SkipBadVideos):
        return ''
    count = torch.tensor([float(train_set.take_skipped())], device=ctx.device)  # NCCL: on the GPU
    total = all_reduce_sum(count, ctx)
    skipped = int(total.item())
    if tb_writer is not None:
        tb_writer.add_scalar('train/skipped_samples', skipped, epoch)
    return f' skipped {skipped} samples of bad videos' if skipped else ''


def step_and_follow(optimizer, scaler, clip_grad_norm, schedule, ema, model):
    """One optimizer step, then the schedule's step and the EMA update, both
    left out when the fp16 scaler skipped the optimizer step (the weights did
    not change, and the skipped step is not one of the schedule's)."""
    if not optimizer_step(optimizer, scaler, clip_grad_norm):
        return
    if ema is not None:
        update_ema(ema, model)
    if schedule is not None:
        schedule.after_step()


def optimizer_step(optimizer, scaler, clip_grad_norm=0.0):
    """One optimizer step (skipped by an fp16 scaler on inf/nan gradients),
    after clipping the global norm of the unscaled gradients (0: no clipping).
    Returns whether the optimizer stepped: the scaler decides that on the host
    (it reads its inf check there), so a step hook knows it without another
    host/device synchronisation."""
    if clip_grad_norm > 0:
        scaler.unscale_(optimizer)
        params = [p for group in optimizer.param_groups for p in group['params']]
        torch.nn.utils.clip_grad_norm_(params, clip_grad_norm)
    stepped = []
    hook = optimizer.register_step_post_hook(lambda *_: stepped.append(True))
    try:
        scaler.step(optimizer)
    finally:
        hook.remove()
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return bool(stepped)


@torch.no_grad()
def precise_bn(model, loader, n_batches, ctx, config):
    """Recomputes the BatchNorm statistics over the first n_batches of `loader`
    (utils/precise_bn.py), frozen modules excepted; `loader` yields its clips
    on the device, as train_epoch's does."""
    model.train()
    keep_frozen_eval(model, config.frozen_modules)
    batches = (clips for clips, _ in itertools.islice(loader, n_batches))
    with autocast_context(ctx.device, config.amp, config.amp_dtype):
        return recompute_bn_stats(model, batches, ctx)


def _epoch_stats(totals, lr, ctx, epoch, tb_writer):
    if ctx.device.type == 'cuda':
        torch.cuda.synchronize(ctx.device)
    elapsed = totals.seconds()
    # Clip counts are known on the host; one collective for the whole epoch.
    counts = torch.tensor([totals.clips], dtype=torch.float64).to(ctx.device)
    loss_sum, correct, count = all_reduce_sum(torch.cat([totals.sums, counts]), ctx).tolist()
    stats = dict(loss=loss_sum / max(count, 1), acc=correct / max(count, 1), lr=lr,
                 clips_per_s=count / max(elapsed, 1e-9), data_wait=totals.wait_s / max(elapsed, 1e-9))
    if tb_writer is not None:
        for key, value in stats.items():
            tb_writer.add_scalar(f'train/{key}', value, epoch)
    return stats
