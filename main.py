"""Entry point: train, validate and run inference with a 3D CNN.

    python main.py --dataset synthetic --result_path results/demo
    torchrun --nproc_per_node=8 main.py --distributed ...

A run is five stages, read top to bottom in `run`: prepare (what the options
mean on this machine), load_data (every data set, checked before any training),
restore (model, pretrained or resumed weights, frozen layers), fit (the epoch
loop) or evaluate (validation only), and infer.

As a command it parses its options before anything else is imported: -h, an
unknown option and every option error answer at once, not after the seconds
torch, torchvision and av take to import.
"""
# ruff: noqa: E402 -- the imports after the command-line parse are meant to be there
import contextlib
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass

from opts import option_default, opts_to_dict, parse_opts, save_opts
from utils.errors import USER_ERRORS, OptionError, ResultFolderError

if __name__ == '__main__':
    COMMAND_LINE = parse_opts()

import numpy as np
import torch
import torch.multiprocessing as mp

import dataset as data
from datasets.annotation import SUBSET_NAMES
from datasets.bad_videos import SkipBadVideos
from datasets.frame_check import count_short_videos
from inference import run_inference, write_features
from model import build_model, classifier_name, freeze_before, load_state_dict_checked, make_parallel
from training import (
    EpochExtras,
    EpochTotals,
    LoopConfig,
    OptimizerConfig,
    make_optimizer,
    optimizer_kind,
    precise_bn,
    train_epoch,
)
from utils import distributed as du
from utils.checkpoint import (
    capture_rng_state,
    find_latest_checkpoint,
    load_training_checkpoint,
    remove_stale_temporaries,
    restore_rng_state,
    save_checkpoint_atomic,
)
from utils.ema import ModelEma, ema_checkpoint_entries, inference_state_dict, load_ema, make_ema
from utils.failures import EXIT_FAILED, describe_failure
from utils.flops import count_gflops, count_parameters
from utils.grad_checkpoint import enable_grad_checkpointing
from utils.logs import TsvLogger, truncate_log
from utils.lr_schedule import LRSchedule, ScheduleConfig, schedule_kind, steps_per_epoch
from utils.metrics import evaluate_file, format_report, save_confusion_png
from utils.mix import MixConfig
from utils.precision import amp_dtype
from utils.preemption import EXIT_PREEMPTED, Preempted, StopRequest, agree_to_stop, requeue_slurm_job
from utils.result_folder import (
    ResultFolderLock,
    check_writable,
    refuse_or_clear_other_run,
)
from utils.resumable_data import start_epoch
from utils.retention import BestTracker, checkpoint_name, drop_best_after, prune_checkpoints
from utils.run_record import RunRecord
from validation import val_epoch

VAL_LOG_COLUMNS = ['epoch', 'loss', 'acc', 'clip_acc']
LOG_NAMES = ('train.log', 'train_batch.log', 'val.log')


def log(ctx, *args):
    if ctx.is_main:
        print(*args, flush=True)


def run(opt, ctx):
    """The stages of one process's run."""
    lock = ResultFolderLock(opt.result_path)  # taken by rank 0 only
    try:
        on_main_rank(ctx, lambda: claim_result_folder(opt, lock))
        run_stages(opt, ctx)
    finally:
        lock.release()


def run_stages(opt, ctx):
    record, checkpoint = prepare(opt, ctx)
    datasets = load_data(opt, record, ctx)
    warn_short_videos(opt, ctx, datasets)
    model = restore(opt, ctx, record, checkpoint)
    if ctx.is_main:
        save_opts(opt, opt.result_path / 'opts.json', run=record.to_dict())
    du.set_collective_timeout(ctx, opt.dist_timeout)  # start-up is over
    model = make_parallel(model, ctx, opt.batchnorm_sync, opt.channels_last)
    if opt.compile:
        model = torch.compile(model)  # around DDP: its optimizer splits graphs at buckets
    config = loop_config(opt, record)
    with tensorboard_writer(opt, ctx, record) as tb_writer:
        val_loader = data.make_val_loader(datasets.val, opt, ctx) if datasets.val is not None else None
        if datasets.train is not None:
            ema = fit(opt, ctx, record, config, model, checkpoint, datasets, val_loader, tb_writer)
            if opt.inference_weights == 'ema':
                model = ema.module
        elif val_loader is not None:
            evaluate(opt, ctx, record, config, model, val_loader, tb_writer, datasets.class_names)
        if datasets.infer is not None:
            infer(opt, ctx, record, config, model, datasets)
    if ctx.is_main:
        remove_stale_temporaries(opt.result_path)
    log(ctx, f'logs, checkpoints and opts.json are in {opt.result_path}')


def on_main_rank(ctx, fn):
    """fn() on rank 0 only; an error there stops every rank (the others would
    otherwise wait for rank 0 in their next collective)."""
    error = None
    if ctx.is_main:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - re-raised below, after telling the others
            error = e
    message = du.broadcast_object(None if error is None else str(error), ctx)
    if error is not None:
        raise error
    if message is not None:
        raise OptionError(f'rank 0 stopped: {message}')


def claim_result_folder(opt, lock):
    """Rank 0 creates the folder and takes its lock: one run per folder. Then
    it checks that files can be created there and deletes the temporaries of
    checkpoint writes a killed run left."""
    try:
        opt.result_path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ResultFolderError(f'cannot create result folder {opt.result_path} ({e.strerror}): '
                                f'choose another --result_path') from None
    lock.acquire()
    check_writable(opt.result_path)
    remove_stale_temporaries(opt.result_path)


# ----------------------------------------------------------------------------- prepare

def prepare(opt, ctx):
    """The run record (device settings, the effective learning rate, the data
    paths, the checkpoint to resume from) and that checkpoint, loaded once
    (None for a fresh run)."""
    if ctx.device.type == 'cuda':
        # Fixed clip shapes: cudnn.benchmark picks the fastest kernels, which
        # may differ from run to run; --deterministic trades that for repeatability.
        torch.backends.cudnn.benchmark = not opt.deterministic
    if opt.deterministic:
        make_deterministic()
    refuse_bf16_below_sm80(opt, ctx)
    if opt.amp and ctx.device.type != 'cuda':
        # bf16 convolutions are no faster than fp32 on most CPUs, and oneDNN's
        # bf16 conv3d backward gave sporadic infinite weight gradients here.
        log(ctx, '--amp is ignored on CPU: training in float32')
    video_path, annotation_path = data.data_paths(opt, ctx)
    resume = resume_path(opt, ctx)
    if resume is None and not opt.no_train:
        on_main_rank(ctx, lambda: refuse_or_clear_other_run(opt.result_path, opt.overwrite))
    checkpoint = load_training_checkpoint(resume) if resume is not None else None
    if checkpoint is not None and not opt.no_train:
        check_same_optimization(opt, checkpoint, resume)
    record = RunRecord(
        device=str(ctx.device), world_size=ctx.world_size,
        batch_per_process=data.per_process_batch(opt.batch_size, ctx),
        learning_rate=run_learning_rate(opt, ctx, checkpoint),
        amp=opt.amp and ctx.device.type == 'cuda',
        normalize_on_device=opt.normalize_on_device == 'on' or
        (opt.normalize_on_device == 'auto' and ctx.device.type == 'cuda'),
        decode_on_device=data.decode_on_device(opt, ctx),
        video_path=video_path, annotation_path=annotation_path,
        resume_path=resume, **fine_tuning_settings(opt, checkpoint, resume))
    return record, checkpoint


def refuse_bf16_below_sm80(opt, ctx):
    """--amp_dtype bf16 on a GPU below compute capability 8.0 (V100, T4, RTX 20xx):
    torch.cuda.is_bf16_supported() says yes there (it counts emulation), but
    cuDNN has no bf16 3D convolutions to run."""
    if not (opt.amp and opt.amp_dtype == 'bf16' and ctx.device.type == 'cuda'):
        return
    major, minor = torch.cuda.get_device_capability(ctx.device)
    if (major, minor) < (8, 0):
        raise OptionError(f'--amp_dtype bf16 needs a GPU of compute capability 8.0 or more '
                          f'(A100, H100, RTX 30xx); {torch.cuda.get_device_name(ctx.device)} '
                          f'has {major}.{minor}: leave --amp_dtype out (fp16 with a '
                          f'GradScaler there) or give --amp_dtype fp16')


def make_deterministic():
    """Deterministic kernels where torch has them; torch warns for the few it
    has not (on GPUs: AdaptiveAvgPool3d backward, NLLLoss). The cuBLAS setting
    must be in place before its first use."""
    os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)


def effective_learning_rate(opt, ctx):
    if opt.lr_scaling != 'linear':
        return opt.learning_rate
    global_batch = opt.batch_size * opt.accumulation_steps
    lr = opt.learning_rate * global_batch / opt.base_batch_size
    log(ctx, f'linear lr scaling: lr {opt.learning_rate:g} x {global_batch}/'
             f'{opt.base_batch_size} = {lr:g}')
    return lr


def run_learning_rate(opt, ctx, checkpoint):
    """The full rate (param group 0's) the optimizer starts from: --learning_rate
    after --lr_scaling, or a resumed checkpoint's, whose optimizer and schedule
    continue from it (a new --learning_rate is ignored then, in one line)."""
    lr = effective_learning_rate(opt, ctx)
    if checkpoint is None or opt.no_train:
        return lr
    groups = (checkpoint.get('optimizer') or {}).get('param_groups') or [{}]
    stored = groups[0].get('initial_lr', lr)  # set by the schedules but plateau
    stored_opts = checkpoint.get('opts') or {}
    given = opt.learning_rate != option_default('learning_rate', opt.dataset)
    if given and opt.learning_rate != stored_opts.get('learning_rate', opt.learning_rate):
        log(ctx, f'--learning_rate {opt.learning_rate:g} is ignored on resume: the optimizer and its '
                 f'schedule continue from the checkpoint\'s ({stored:g}); --pretrain_path starts a '
                 f'new optimization from its weights at a new rate')
    return stored


def check_same_optimization(opt, checkpoint, checkpoint_path):
    """A resumed run continues its checkpoint's optimizer and schedule: another
    --optimizer or --lr_scheduler cannot load their states."""
    for key, stored in (('optimizer', optimizer_kind(checkpoint.get('optimizer'))),
                        ('lr_scheduler', schedule_kind(checkpoint.get('scheduler')))):
        value = getattr(opt, key)
        if stored is not None and value != stored:
            raise OptionError(f'--{key} {value} differs from the {stored} of --resume_path '
                              f'{checkpoint_path}: resume with --{key} {stored}, or start a new '
                              f'optimization from its weights with --pretrain_path {checkpoint_path}')


def resume_path(opt, ctx):
    if opt.resume_path is not None or not opt.auto_resume:
        return opt.resume_path
    # Rank 0 chooses, so every rank resumes from the same file.
    latest = du.broadcast_object(
        find_latest_checkpoint(opt.result_path) if ctx.is_main else None, ctx)
    if latest is not None:
        log(ctx, f'auto-resume from {latest}')
    return latest


FINE_TUNING_KEYS = ('n_classes', 'ft_begin_module', 'ft_lr_ratio')


def fine_tuning_settings(opt, checkpoint, checkpoint_path):
    """The class count, the first trained module and the backbone's lr ratio: the
    options', or a resumed checkpoint's, so that resuming a fine-tuning run needs
    no fine-tuning options. An option given with a value other than its default
    and the checkpoint's is an error: a resumed run cannot change them."""
    given = {k: getattr(opt, k) for k in FINE_TUNING_KEYS}
    if checkpoint is None:
        return given
    stored_opts = checkpoint.get('opts') or {}
    settings = {}
    for key, value in given.items():
        stored = checkpoint.get(key, stored_opts.get(key))
        if stored is not None and value != stored and value != option_default(key, opt.dataset):
            raise OptionError(f'--{key} {value} differs from the {stored!r} of --resume_path '
                              f'{checkpoint_path}: a resumed run keeps it; leave --{key} out')
        settings[key] = value if stored is None else stored
    return settings


@dataclass(frozen=True)
class DataSets:
    train: object
    val: object
    infer: object
    class_names: list


def load_data(opt, record, ctx=None):
    """Every data set the run needs, built first: bad annotations or missing
    videos fail here, before any training time is spent (under DDP checked by
    one rank per node, dataset.py)."""
    train = val = infer = None
    class_names = []
    if not opt.no_train:
        train, class_names = data.get_training_data(opt, record, ctx)
    if not opt.no_val:
        val, class_names = data.get_validation_data(opt, record, ctx)
    if opt.inference:
        infer, class_names = data.get_inference_data(opt, record, ctx)
    if train is not None and opt.on_bad_video == 'skip':
        train = SkipBadVideos(train)
    if record.n_classes is None:  # --n_classes not given: the annotation's count
        if not class_names:
            raise OptionError('no data set is loaded to count the classes of (--no_train --no_val '
                              'without --inference): give --n_classes')
        record.n_classes = len(class_names)
    return DataSets(train, val, infer, class_names)


def warn_short_videos(opt, ctx, datasets):
    """Clips of videos shorter than a clip are loop-padded: say how many there are."""
    for name, dataset in (('training', datasets.train), ('validation', datasets.val)):
        if dataset is None or not hasattr(dataset, 'records'):
            continue
        short = count_short_videos(dataset.records, opt.sample_duration, opt.sample_t_stride)
        if short:
            log(ctx, f'warning: {short} of {len(dataset.records)} {name} videos are shorter than '
                     f'a clip (--sample_duration {opt.sample_duration}, --sample_t_stride '
                     f'{opt.sample_t_stride}): their clips repeat frames (loop padding)')


# ----------------------------------------------------------------------------- restore

def restore(opt, ctx, record, checkpoint):
    """The model with its weights (pretrained, or resumed from `checkpoint`, the
    one at record.resume_path) and its frozen modules. Completes the run record."""
    torch.manual_seed(opt.manual_seed)
    model = build_model(opt, record.n_classes, pretrained=record.resume_path is None)
    if checkpoint is not None:
        if checkpoint.get('arch', opt.arch) != opt.arch:
            raise OptionError(f'--resume_path {record.resume_path} holds a {checkpoint["arch"]} '
                              f'model but the options build {opt.arch}')
        source = f'--resume_path {record.resume_path}'
        weights = 'raw' if not opt.no_train else opt.inference_weights
        load_state_dict_checked(model, inference_state_dict(checkpoint, weights, source), source, opt)
        record.begin_epoch = checkpoint['epoch'] + 1
        record.begin_batch = checkpoint.get('batches_done', 0)
    elif opt.no_train and opt.inference_weights == 'ema':
        raise OptionError('--inference_weights ema without training needs --resume_path '
                          '(a checkpoint saved with --ema_decay)')
    record.frozen_modules = freeze_before(model, record.ft_begin_module)
    if record.frozen_modules:
        log(ctx, f'frozen (fine-tuning from {record.ft_begin_module}): '
                 f'{", ".join(record.frozen_modules)}')
    clip_shape = (1, opt.n_input_channels, opt.sample_duration, opt.sample_size, opt.sample_size)
    record.n_parameters = count_parameters(model)
    record.gflops_per_clip = round(count_gflops(model, clip_shape), 4)
    log(ctx, f'model {opt.arch}: {record.n_parameters / 1e6:.2f} M parameters, '
             f'{record.gflops_per_clip:.3f} GFLOPs per {opt.sample_duration}x{opt.sample_size}x'
             f'{opt.sample_size} clip; device {ctx.device}, {ctx.world_size} process(es), '
             f'batch {record.batch_per_process} per process, lr {record.learning_rate:g}')
    if opt.grad_checkpointing:
        try:
            stages = enable_grad_checkpointing(model)
        except ValueError as e:
            raise OptionError(str(e)) from e
        log(ctx, f'activation checkpointing of {", ".join(stages)}')
    return model


def loop_config(opt, record):
    return LoopConfig(amp=record.amp,
                      accumulation_steps=opt.accumulation_steps, log_interval=opt.log_interval,
                      progress_bar=not opt.no_progress, frozen_modules=record.frozen_modules,
                      amp_dtype=opt.amp_dtype, clip_grad_norm=opt.clip_grad_norm,
                      mix=MixConfig(opt.mixup_alpha, opt.cutmix_alpha, opt.mix_prob,
                                    opt.mix_switch_prob),
                      n_classes=record.n_classes)


# ----------------------------------------------------------------------------- fit

@dataclass
class Trainer:
    """What the epoch loop steps, and what a checkpoint saves besides the weights."""
    optimizer: torch.optim.Optimizer
    schedule: LRSchedule
    scaler: torch.amp.GradScaler
    ema: ModelEma | None = None
    mix_rng: np.random.Generator | None = None  # this epoch's mixup/cutmix draws
    totals: EpochTotals | None = None  # this epoch's running sums, this process's


def make_trainer(opt, ctx, record, model, checkpoint, n_batches):
    optimizer = make_optimizer(model, OptimizerConfig(
        opt.optimizer, record.learning_rate, momentum=opt.momentum, dampening=opt.dampening,
        weight_decay=opt.weight_decay, nesterov=opt.nesterov, head=classifier_name(opt.model),
        backbone_lr_ratio=record.ft_lr_ratio))
    config = schedule_config(opt, ctx, checkpoint)
    schedule = LRSchedule(optimizer, config, steps_per_epoch(n_batches, opt.accumulation_steps))
    fp16 = record.amp and amp_dtype(ctx.device, opt.amp_dtype) == torch.float16
    scaler = torch.amp.GradScaler(ctx.device.type, enabled=fp16)
    ema = make_ema(model, opt.ema_decay) if opt.ema_decay > 0 else None
    if ema is not None and checkpoint is not None and \
            not load_ema(ema, checkpoint, f'--resume_path {record.resume_path}'):
        log(ctx, f'{record.resume_path} has no EMA weights: the average starts from its weights')
    if checkpoint is not None and 'optimizer' in checkpoint:
        optimizer.load_state_dict(checkpoint['optimizer'])
        schedule.load_state_dict(checkpoint['scheduler'], milestones=(
            opt.multistep_milestones if opt.overwrite_milestones else None),
            patience=config.plateau_patience if 'plateau_patience' in (checkpoint.get('opts') or {})
            else None)
        if checkpoint.get('scaler') and fp16:  # empty from a bf16 or fp32 run
            scaler.load_state_dict(checkpoint['scaler'])
    return Trainer(optimizer, schedule, scaler, ema)


# The schedule settings a resumed run may change, and the schedule each one shapes.
SCHEDULE_SETTINGS = {'warmup_epochs': 'cosine', 'min_lr': 'cosine', 'plateau_patience': 'plateau'}


def schedule_config(opt, ctx, checkpoint):
    """--lr_scheduler's settings. On resume, a SCHEDULE_SETTINGS option not
    given is the checkpoint's, and a new value applies from the checkpoint on
    (one line says so). --warmup_epochs and --min_lr given with another
    schedule than cosine are named: they do nothing there."""
    stored = (checkpoint or {}).get('opts') or {}
    values, given = {}, set()
    for key, shaped in SCHEDULE_SETTINGS.items():
        value, old = getattr(opt, key), stored.get(key)
        if value != option_default(key, opt.dataset):
            given.add(key)
        if old is not None and key not in given:
            value = old
        elif old is not None and value != old and opt.lr_scheduler == shaped:
            log(ctx, f'--{key} {value:g} replaces the checkpoint\'s {old:g} from here on')
        values[key] = value
    if opt.lr_scheduler != 'cosine' and given & {'warmup_epochs', 'min_lr'}:
        log(ctx, f'--warmup_epochs and --min_lr shape the cosine schedule only: ignored with '
                 f'--lr_scheduler {opt.lr_scheduler}')
    return ScheduleConfig(opt.lr_scheduler, milestones=tuple(opt.multistep_milestones),
                          n_epochs=opt.n_epochs, **values)


@contextlib.contextmanager
def training_logs(opt, ctx, with_val, last_epoch, last_iter=None):
    """train.log, train_batch.log and val.log (rank 0; None elsewhere), closed
    also when the run fails. Rows of epochs after last_epoch (the resumed
    checkpoint's, or 0) are dropped first, and after a mid-epoch checkpoint the
    batch rows after last_iter: the logs then equal an uninterrupted run's."""
    with contextlib.ExitStack() as stack:
        logs = dict(train=None, batch=None, val=None)
        if ctx.is_main:
            for name in LOG_NAMES:
                if name == 'train_batch.log' and last_iter is not None:
                    truncate_log(opt.result_path / name, last_epoch + 1, last_iter)
                else:
                    truncate_log(opt.result_path / name, last_epoch)
            logs['train'] = stack.enter_context(TsvLogger(
                opt.result_path / 'train.log',
                ['epoch', 'loss', 'acc', 'lr', 'clips_per_s', 'data_wait']))
            logs['batch'] = stack.enter_context(TsvLogger(
                opt.result_path / 'train_batch.log', ['epoch', 'batch', 'iter', 'loss', 'acc', 'lr']))
            if with_val:
                ema_columns = ['ema_loss', 'ema_acc'] if opt.ema_decay > 0 else []
                logs['val'] = stack.enter_context(TsvLogger(
                    opt.result_path / 'val.log', [*VAL_LOG_COLUMNS, *ema_columns]))
        yield logs


def fit(opt, ctx, record, config, model, checkpoint, datasets, val_loader, tb_writer):
    """Epochs record.begin_epoch..n_epochs: train, validate, step the schedule,
    checkpoint. Returns the EMA model (None without --ema_decay). After a stop
    signal the run ends at the next optimizer step with a checkpoint (Preempted)."""
    train_loader = data.make_train_loader(datasets.train, opt, ctx)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=opt.label_smoothing).to(ctx.device)
    trainer = make_trainer(opt, ctx, record, model, checkpoint, len(train_loader))
    saver = CheckpointSaver(opt, ctx, record, model, trainer, datasets.class_names)
    check_resume_batch(record, len(train_loader))
    if config.mix.enabled:
        log(ctx, 'mixup/cutmix: the training accuracy is against each clip\'s dominant label')
    if record.begin_epoch > opt.n_epochs:
        log(ctx, f'checkpoint epoch {record.begin_epoch - 1} >= --n_epochs {opt.n_epochs}: '
                 f'nothing to train')
    last_iter = (record.begin_epoch - 1) * len(train_loader) + record.begin_batch
    with training_logs(opt, ctx, val_loader is not None, record.begin_epoch - 1,
                       last_iter if record.begin_batch else None) as logs, StopRequest() as stop:
        steps = StepCheckpoints(opt.checkpoint_steps, opt.accumulation_steps, stop, ctx, saver)
        for epoch in range(record.begin_epoch, opt.n_epochs + 1):
            first_batch = record.begin_batch if epoch == record.begin_epoch else 0
            start_training_epoch(opt, ctx, epoch, train_loader, trainer, checkpoint, first_batch)
            t0 = time.time()
            extras = EpochExtras(ema=trainer.ema, mix_rng=trainer.mix_rng, first_batch=first_batch,
                                 after_step=lambda done, e=epoch: steps.after_step(e, done),
                                 totals=trainer.totals)
            stats = train_epoch(epoch, train_loader, model, criterion, trainer.optimizer,
                                trainer.schedule, trainer.scaler, ctx, config, logs['batch'],
                                tb_writer, extras)
            if steps.stopped_at is not None:
                raise Preempted(stop.signal_name or 'a signal to another rank', steps.stopped_at)
            if opt.compile and epoch == record.begin_epoch:
                log(ctx, f'compile: the first training step took {stats["first_step_s"]:.1f} s '
                         f'(compilation included)')
            line = (f'epoch {epoch}/{opt.n_epochs} train loss {stats["loss"]:.4f} '
                    f'acc {stats["acc"]:.4f} lr {stats["lr"]:.4g} '
                    f'{stats["clips_per_s"]:.1f} clips/s data wait {stats["data_wait"]:.0%}')
            line += count_skipped(datasets.train, ctx, tb_writer, epoch)
            if ctx.is_main:
                logs['train'].log(dict(epoch=epoch, **stats))
            val_stats = None
            if opt.precise_bn > 0:
                precise_bn(model, train_loader, opt.precise_bn, ctx, config)
            if val_loader is not None:
                val_stats = validate(epoch, val_loader, model, trainer.ema, ctx, config, tb_writer,
                                     datasets.class_names)
                line += ' | ' + describe_validation(val_stats)
                if ctx.is_main:
                    logs['val'].log(dict(epoch=epoch, **val_stats))
            log(ctx, line + f' ({time.time() - t0:.0f}s)')
            # The schedule steps before the checkpoint is written, so a resumed
            # run starts the next epoch with the right learning rate.
            trainer.schedule.after_epoch(val_stats['loss'] if val_stats else stats['loss'])
            if tb_writer is not None:
                tb_writer.flush()
            stopping = agree_to_stop(stop.requested, ctx) and epoch < opt.n_epochs
            path = saver.after_epoch(epoch, val_stats, force=stopping)
            if stopping:
                raise Preempted(stop.signal_name or 'a signal to another rank', path)
    return trainer.ema


def start_training_epoch(opt, ctx, epoch, train_loader, trainer, checkpoint, first_batch):
    """Seeds the epoch (data order, augmentation, model-side and mixup draws);
    after a mid-epoch checkpoint, starts where it was written: this process's
    random states and running sums as they were then."""
    seed = epoch_seed(opt.manual_seed, ctx.rank, epoch)
    data.seed_worker_rngs(seed)
    start_epoch(train_loader.loader, epoch, first_batch)
    trainer.mix_rng = np.random.default_rng([seed, 1])
    trainer.totals = EpochTotals(ctx.device)
    if not first_batch:
        return
    state = own_rank_state(checkpoint, ctx)
    if state is None:
        # Not this run's streams: fresh ones for the rest of the epoch (not a
        # replay of the epoch's first draws).
        data.seed_worker_rngs((seed * 1_000_033 + first_batch) % (2**63))
        trainer.mix_rng = np.random.default_rng([seed, 1, first_batch])
        return
    restore_rng_state(state['rng_state'], ctx.device)
    if state.get('mix_rng'):
        trainer.mix_rng.bit_generator.state = state['mix_rng']
    trainer.totals = EpochTotals(ctx.device, state.get('epoch_totals'))


def rank_state(trainer, ctx):
    """What a mid-epoch checkpoint keeps of each process: its random states
    (CUDA's on a GPU), its mixup/cutmix generator and its epoch's running sums."""
    return {'rng_state': capture_rng_state(ctx.device),
            'mix_rng': trainer.mix_rng.bit_generator.state if trainer.mix_rng is not None else None,
            'epoch_totals': trainer.totals.state_dict() if trainer.totals is not None else None}


def own_rank_state(checkpoint, ctx):
    """This process's entry of a mid-epoch checkpoint's rank_states, or None
    (after one line) when the checkpoint was written by another number of
    processes. Checkpoints written before rank_states kept one process's
    states, at the top level."""
    states = checkpoint.get('rank_states') or \
        [{'rng_state': checkpoint.get('rng_state'), 'mix_rng': checkpoint.get('mix_rng')}]
    if len(states) == ctx.world_size:
        return states[ctx.rank]
    log(ctx, f'the mid-epoch checkpoint holds the random states of {len(states)} process(es), '
             f'this run has {ctx.world_size}: the rest of the epoch draws from per-process streams '
             f'derived from --manual_seed (the weights will differ from an uninterrupted run\'s)')
    return None


def check_resume_batch(record, n_batches):
    if record.begin_batch >= n_batches:
        raise OptionError(f'{record.resume_path} was written after {record.begin_batch} batches of '
                          f'epoch {record.begin_epoch}, which has {n_batches} here: resume '
                          f'with the --batch_size and number of processes it was written with')


def validate(epoch, val_loader, model, ema, ctx, config, tb_writer, class_names):
    """The raw weights' validation statistics, with the EMA weights' loss and
    video accuracy beside them (ema_loss, ema_acc) when there is an EMA, each
    with rank 0's BatchNorm statistics (the checkpoint's) on every rank."""
    du.broadcast_buffers(model, ctx)
    if ema is not None:
        du.broadcast_buffers(ema.module, ctx)
    stats = val_epoch(epoch, val_loader, model, ctx, config, tb_writer, class_names)
    if ema is not None:
        ema_stats = val_epoch(epoch, val_loader, ema.module, ctx, config)
        stats.update(ema_loss=ema_stats['loss'], ema_acc=ema_stats['acc'])
        if tb_writer is not None:
            tb_writer.add_scalar('val/ema_acc', ema_stats['acc'], epoch)
    return stats


def count_skipped(train_set, ctx, tb_writer, epoch):
    """--on_bad_video skip: the samples replaced this epoch, over all ranks."""
    if not isinstance(train_set, SkipBadVideos):
        return ''
    count = torch.tensor([float(train_set.take_skipped())], device=ctx.device)  # NCCL: on the GPU
    total = du.all_reduce_sum(count, ctx)
    skipped = int(total.item())
    if tb_writer is not None:
        tb_writer.add_scalar('train/skipped_samples', skipped, epoch)
    return f' skipped {skipped} samples of bad videos' if skipped else ''


def epoch_seed(manual_seed, rank, epoch):
    """The random state at the start of each (rank, epoch): model-side and
    mixup draws, so a resumed run draws what the uninterrupted run drew. Each
    clip's augmentation has a seed of its own (utils/resumable_data.py)."""
    return (manual_seed * 1_000_003 + rank * 10_007 + epoch) % (2**63)


class StepCheckpoints:
    """After each optimizer step: a mid-epoch checkpoint every --checkpoint_steps
    steps, and, when any rank got a stop signal, one more and the end of the
    epoch loop (every rank at the same step)."""

    def __init__(self, every_steps, accumulation_steps, stop, ctx, saver):
        self.every, self.k, self.stop, self.ctx, self.saver = \
            every_steps, accumulation_steps, stop, ctx, saver
        self.stopped_at = None

    def after_step(self, epoch, batches_done):
        stopping = agree_to_stop(self.stop.requested, self.ctx)
        due = self.every > 0 and (batches_done // self.k) % self.every == 0
        if stopping or due:
            path = self.saver.save(epoch, batches_done)
            if stopping:
                self.stopped_at = path
        return stopping


class CheckpointSaver:
    """Writes checkpoints on rank 0 (every rank waits until the file is
    complete), keeps --keep_last of them, and with --keep_last best.pth."""

    def __init__(self, opt, ctx, record, model, trainer, class_names):
        self.opt, self.ctx = opt, ctx
        self.state = (record, model, trainer, class_names)  # what save_checkpoint takes
        if ctx.is_main:
            dropped = drop_best_after(opt.result_path, record.begin_epoch - 1)
            if dropped is not None:
                log(ctx, f'best.pth (epoch {dropped}) is after the checkpoint the run resumes (epoch '
                         f'{record.begin_epoch - 1}): deleted, as the logs of those epochs are; '
                         f'best.pth follows the epochs trained from here')
        self.best = BestTracker(opt.result_path) if ctx.is_main and opt.keep_last else None

    def save(self, epoch, batches_done=0):
        """The checkpoint after `batches_done` batches of `epoch` (0: all of it).
        A failed write (disk full) stops every rank; earlier checkpoints stay."""
        path = self.opt.result_path / checkpoint_name(epoch, batches_done)
        trainer = self.state[2]
        # Mid-epoch: every process's random states and sums (each resumes its own).
        rank_states = du.gather_objects_to_main(rank_state(trainer, self.ctx), self.ctx) \
            if batches_done else None

        def write():
            save_checkpoint(path, epoch, self.opt, *self.state, batches_done, rank_states)
            prune_checkpoints(self.opt.result_path, self.opt.keep_last)
        on_main_rank(self.ctx, write)
        return path

    def after_epoch(self, epoch, val_stats, force=False):
        """The end-of-epoch checkpoint when --checkpoint asks for it (or force),
        and best.pth; returns the path written, or None."""
        path = None
        if epoch % self.opt.checkpoint == 0 or epoch == self.opt.n_epochs or force:
            path = self.save(epoch)
        else:
            du.barrier(self.ctx)
        acc = val_stats['acc'] if val_stats else None  # equal on every rank
        if self.opt.keep_last and acc is not None:
            on_main_rank(self.ctx, lambda: self.save_best(epoch, acc))
        return path

    def save_best(self, epoch, video_acc):
        if self.best.improves(video_acc):
            save_checkpoint(self.best.path, epoch, self.opt, *self.state)
            self.best.saved(epoch, video_acc)


def describe_validation(stats):
    text = (f'val loss {stats["loss"]:.4f} video acc {stats["acc"]:.4f} '
            f'clip acc {stats["clip_acc"]:.4f}')
    if 'ema_acc' in stats:
        text += f' ema video acc {stats["ema_acc"]:.4f}'
    return text


def save_checkpoint(path, epoch, opt, record, model, trainer, class_names, batches_done=0,
                    rank_states=None):
    """The predecessor's keys, plus the class names and the fine-tuning settings:
    with 'arch' and 'opts' a checkpoint is usable alone (predict.py, resuming).
    The state after `batches_done` batches of `epoch` (0: the whole epoch;
    'epoch' counts the completed epochs, as in 3D-ResNets-PyTorch); a
    mid-epoch one also holds every process's rank_state, in rank order."""
    mid_epoch = {'rank_states': rank_states} if batches_done else {}
    save_checkpoint_atomic({
        'epoch': epoch if batches_done == 0 else epoch - 1,
        'batches_done': batches_done,
        **mid_epoch,
        'arch': opt.arch,
        'class_names': list(class_names),
        **{key: getattr(record, key) for key in FINE_TUNING_KEYS},
        'state_dict': du.unwrap(model).state_dict(),
        'optimizer': trainer.optimizer.state_dict(),
        'scheduler': trainer.schedule.state_dict(),
        'scaler': trainer.scaler.state_dict(),
        **(ema_checkpoint_entries(trainer.ema) if trainer.ema is not None else {}),
        'rng_state': capture_rng_state(),  # rank 0's; mid-epoch resumes read rank_states
        'opts': {k: v for k, v in opts_to_dict(opt).items() if v is None or
                 isinstance(v, (str, int, float, bool, list))},
    }, path)


# ----------------------------------------------------------------------------- evaluate, infer

def evaluate(opt, ctx, record, config, model, val_loader, tb_writer, class_names):
    """Validation only (--no_train): the weights of the resumed epoch, appended to
    val.log as the predecessor did (scripts read it). A mid-epoch checkpoint's
    row is the epoch it was written in."""
    epoch = record.begin_epoch if record.begin_batch else record.begin_epoch - 1
    stats = val_epoch(epoch, val_loader, model, ctx, config, tb_writer, class_names)
    within = f' of epoch {epoch} after {record.begin_batch} of its batches' if record.begin_batch else ''
    log(ctx, f'validation{within}: {describe_validation(stats)} ({stats["n_videos"]} videos)')
    if ctx.is_main:
        with TsvLogger(opt.result_path / 'val.log', VAL_LOG_COLUMNS) as val_log:
            val_log.log(dict(epoch=epoch, **stats))


def infer(opt, ctx, record, config, model, datasets):
    """Inference written to <result_path>/<subset>.json (and the features file),
    and its evaluation on a labelled subset."""
    loader = data.make_inference_loader(datasets.infer, opt, ctx)
    du.broadcast_buffers(model, ctx)  # rank 0's BatchNorm statistics, as after validation
    result_file = opt.result_path / f'{opt.inference_subset}.json'
    head = None
    if opt.extract_features is not None:
        head = du.unwrap(model).get_submodule(classifier_name(opt.model))
    output = run_inference(loader, model, datasets.class_names, ctx, config, result_file,
                           topk=opt.output_topk, average=not opt.inference_no_average,
                           feature_module=head)
    if not ctx.is_main:
        return
    views = sorted(set(output.views.values()))
    log(ctx, f'inference results: {result_file} ({len(output.views)} videos, '
             f'{"/".join(map(str, views))} views each)')
    if head is not None:
        write_features(opt.extract_features, list(output.features),
                       list(output.features.values()), list(output.views.values()))
        log(ctx, f'features: {opt.extract_features}')
    if opt.inference_subset != 'test':
        report_inference(opt, record, result_file)


def report_inference(opt, record, result_file):
    """Top-1/top-5 (top-k up to the --output_topk labels the file holds, with
    a note), mean class accuracy; the per-class report and the confusion
    picture next to the result file."""
    subset = SUBSET_NAMES[opt.inference_subset]
    evaluation = evaluate_file(record.annotation_path, result_file, subset, ks=(1, 5))
    for line in evaluation.summary_lines():
        # 'top-1 accuracy: 0.75 (3/4)' -> 'inference top-1 video accuracy on validation: ...'
        name, value = line.split(': ', 1)
        name = name.replace(' accuracy', ' video accuracy') if name.startswith('top-') else name
        print(f'inference {name} on {subset}: {value}')
    stem = opt.result_path / f'{opt.inference_subset}'
    stem.with_name(f'{stem.name}_report.txt').write_text(
        '\n'.join(evaluation.summary_lines()) + '\n\n' +
        format_report(evaluation.report, evaluation.class_names) + '\n')
    save_confusion_png(evaluation.confusion, evaluation.class_names,
                       stem.with_name(f'{stem.name}_confusion.png'))
    print(f'per-class report and confusion matrix: {stem}_report.txt, {stem}_confusion.png',
          flush=True)


def tensorboard_writer(opt, ctx, record):
    """A SummaryWriter on rank 0 with --tensorboard (closed when the run ends or
    fails), else None. A resumed run purges the events of the epochs it redoes
    (every tag is logged per epoch), as the text logs are cut back."""
    if not (opt.tensorboard and ctx.is_main):
        return contextlib.nullcontext(None)
    from torch.utils.tensorboard import SummaryWriter
    purge_step = record.begin_epoch if record.resume_path is not None else None
    return SummaryWriter(log_dir=str(opt.result_path), purge_step=purge_step)


# ----------------------------------------------------------------------------- processes

def worker(local_rank, opt, ranks_per_node):
    """One process: sets up its device and process group, runs, and ends."""
    if local_rank is None:
        ctx = du.init_distributed(opt)
    else:  # spawned by main() itself
        rank = opt.node_rank * ranks_per_node + local_rank
        world = max(1, opt.world_size) * ranks_per_node
        ctx = du.init_distributed(opt, local_rank=local_rank, rank=rank, world_size=world)
    try:
        run(opt, ctx)
    except Preempted as stopped:
        log(ctx, str(stopped))
        if opt.requeue and ctx.is_main:
            log(ctx, requeue_slurm_job())
        du.cleanup(ctx)  # every rank stopped at the same step: a clean teardown
        sys.exit(EXIT_PREEMPTED)
    except BaseException as error:
        if not ctx.distributed:
            raise
        # destroy_process_group() after a failure can block (NCCL: the peers wait
        # in their next collective, or the group is broken): exit without it,
        # and the launcher ends the other ranks.
        exit_now(error, ctx, opt)
    du.cleanup(ctx)


def exit_now(error, ctx, opt):
    """Reports the error as main() would, then ends the process at once."""
    line = describe_failure(error, opt, ctx.rank)
    code = EXIT_FAILED
    if line is not None:
        report(line)
    elif isinstance(error, USER_ERRORS):
        report(f'error: {error}')
        code = 2
    elif isinstance(error, SystemExit):
        code = error.code if isinstance(error.code, int) else 1
    else:
        traceback.print_exception(error)
        code = 130 if isinstance(error, KeyboardInterrupt) else 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def report(line):
    """The one line of a failure on stderr. Loader workers that die from now on
    (torchrun ends the process group of a failed job) are no news: their
    SIGCHLD no longer raises a second error while this one is reported."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    print(line, file=sys.stderr, flush=True)


def main(argv=None):
    launch(parse_opts(argv))


def launch(opt):
    """Runs the processes the options ask for; a user error ends in one line, exit 2."""
    try:
        if opt.distributed and not du.launched_by_a_launcher():
            n = torch.cuda.device_count() if not opt.no_cuda else 0
            n = max(1, n)
            mp.spawn(worker, args=(opt, n), nprocs=n)
        else:
            worker(None, opt, 1)
    except USER_ERRORS as e:
        report(f'error: {e}')
        sys.exit(2)
    except mp.ProcessExitedException as e:  # the process said why, unless a signal killed it
        if e.signal_name:
            report(f'error: process {e.error_index} (pid {e.error_pid}) of the job was killed by '
                   f'{e.signal_name}' + (', most likely by the kernel\'s out-of-memory killer'
                                         if e.signal_name == 'SIGKILL' else ''))
        sys.exit(e.exit_code if e.exit_code > 0 else EXIT_FAILED)
    except RuntimeError as e:  # a dead loader worker (one process)
        line = describe_failure(e, opt)
        if line is None:
            raise
        report(line)
        sys.exit(EXIT_FAILED)


if __name__ == '__main__':
    launch(COMMAND_LINE)
