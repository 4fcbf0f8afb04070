"""Entry point: train, validate and run inference with a 3D CNN.

    python main.py --dataset synthetic --result_path results/demo
    torchrun --nproc_per_node=8 main.py --distributed ...

A run is five stages, read top to bottom in `run_stages`: prepare (what the
options mean on this machine), load_data (every data set, checked before any
training), restore (model, pretrained or resumed weights, frozen layers), fit
(the epoch loop) or evaluate (validation only), and infer. What a checkpoint
holds is checkpoint.py's; processes and failures utils/launch.py's; logs utils/logs.py's.

As a command it parses its options before anything else is imported: -h, an
unknown option and every option error answer at once, not after the seconds
torch, torchvision and av take to import.
"""
# ruff: noqa: E402 -- the imports after the command-line parse are meant to be there
from dataclasses import dataclass

from opts import option_defaults, parse_opts, save_opts
from utils.errors import OptionError
from utils.install_check import check_torchvision

if __name__ == '__main__':
    COMMAND_LINE = parse_opts()
check_torchvision()  # before the imports that need it: one line, not a traceback

import numpy as np
import torch

import checkpoint as ckpt
import dataset as data
from datasets.annotation import SUBSET_NAMES
from datasets.bad_videos import SkipBadVideos
from inference import report_inference, run_inference, write_features
from model import build_model, classifier_name, freeze_before, make_parallel
from training import EpochTotals, LoopConfig, LossWatch, train_and_validate
from utils import distributed as du
from utils.checkpoint import load_training_checkpoint, remove_stale_temporaries
from utils.flops import count_gflops, count_parameters
from utils.grad_checkpoint import enable_grad_checkpointing
from utils.launch import launch, log, on_main_rank
from utils.logs import (
    VAL_LOG_COLUMNS,
    TsvLogger,
    tensorboard_writer,
    training_logs,
    where_curves_are,
    write_hparams,
)
from utils.mix import MixConfig
from utils.precision import make_deterministic, refuse_bf16_below_sm80
from utils.preemption import Preempted, StopRequest, agree_to_stop
from utils.progress import on_terminal
from utils.result_folder import claim_result_folder, refuse_or_clear_other_run, result_folder
from utils.resumable_data import epoch_seed, restart_seed, start_epoch
from utils.run_record import RunRecord
from utils.urls import redact_url
from validation import describe_validation, val_epoch


def run(opt, ctx):
    """The stages of one process's run."""
    with result_folder(opt.result_path, lambda lock: on_main_rank(  # taken by rank 0 only
            ctx, lambda: claim_result_folder(opt.result_path, lock))):
        run_stages(opt, ctx)


@dataclass
class Run:
    """What the stages after restore share: the options, this process, the
    run record, the loops' settings, the model (wrapped for DDP and compiled
    as asked), the data sets, the validation loader (None: --no_val) and the
    TensorBoard writer (None: off, or not rank 0)."""
    opt: object
    ctx: du.DistContext
    record: RunRecord
    config: LoopConfig
    model: torch.nn.Module
    datasets: object
    val_loader: object = None
    tb_writer: object = None


def run_stages(opt, ctx):
    record, checkpoint = prepare(opt, ctx)
    datasets = load_data(opt, record, ctx)
    if checkpoint is not None and (note := ckpt.check_class_names(  # by name: never swapped labels
            checkpoint.get('class_names'), datasets.class_names, record.resume_path,
            record.annotation_path, fine_tuning=opt.pretrain_path is not None)):
        log(ctx, note)
    for warning in data.short_video_warnings(opt, datasets.train, datasets.val):
        log(ctx, warning)
    model = restore(opt, ctx, record, checkpoint)
    if ctx.is_main:
        save_opts(opt, opt.result_path / 'opts.json', run=record.to_dict())
    du.set_collective_timeout(ctx, opt.dist_timeout)  # start-up is over
    model = make_parallel(model, ctx, opt.batchnorm_sync, opt.channels_last)
    if opt.compile:
        model = torch.compile(model)  # around DDP: its optimizer splits graphs at buckets
    with tensorboard_writer(opt, ctx, record) as tb_writer:
        val_loader = data.make_val_loader(datasets.val, opt, ctx) if datasets.val is not None else None
        run = Run(opt, ctx, record, loop_config(opt, record), model, datasets, val_loader, tb_writer)
        if datasets.train is not None:
            ema = fit(run, checkpoint)
            if opt.inference_weights == 'ema':
                run.model = ema.module
        elif val_loader is not None:
            evaluate(run)
        if datasets.infer is not None:
            infer(run)
    if ctx.is_main:
        remove_stale_temporaries(opt.result_path)
    log(ctx, f'logs, checkpoints and opts.json are in {opt.result_path}')
    if ctx.is_main and (curves := where_curves_are(opt.result_path, tb_writer)):
        log(ctx, curves)


# ----------------------------------------------------------------------------- prepare

def prepare(opt, ctx):
    """The run record (device settings, the effective learning rate, the data
    paths, the checkpoint to resume from) and that checkpoint, loaded once
    (None for a fresh run)."""
    defaults = option_defaults(opt.dataset)  # checkpoint.py tells given options by them
    if ctx.device.type == 'cuda':
        # Fixed clip shapes: cudnn.benchmark picks the fastest kernels, which
        # may differ from run to run; --deterministic trades that for repeatability.
        torch.backends.cudnn.benchmark = not opt.deterministic
    if opt.deterministic:
        make_deterministic()
    refuse_bf16_below_sm80(opt.amp, opt.amp_dtype, ctx.device)
    if opt.amp and ctx.device.type != 'cuda':
        # bf16 convolutions are no faster than fp32 on most CPUs, and oneDNN's
        # bf16 conv3d backward gave sporadic infinite weight gradients here.
        log(ctx, '--amp is ignored on CPU: training in float32')
    video_path, annotation_path = data.data_paths(opt, ctx)
    file_type, shards = data.video_store(opt, video_path)
    if shards is not None:
        log(ctx, f'reading {len(shards.index())} videos from the shards at {redact_url(shards.location)} '
                 f'(file type {file_type}, from their index)')
    resume = ckpt.resume_path(opt, ctx)
    if resume is None and not opt.no_train:
        on_main_rank(ctx, lambda: refuse_or_clear_other_run(opt.result_path, opt.overwrite))
    checkpoint = load_training_checkpoint(resume) if resume is not None else None
    if checkpoint is not None and not opt.no_train:
        ckpt.check_same_optimization(opt, checkpoint, resume)
    record = RunRecord(
        device=str(ctx.device), world_size=ctx.world_size,
        batch_per_process=data.per_process_batch(opt.batch_size, ctx),
        learning_rate=ckpt.resumed_learning_rate(opt, ctx, checkpoint, effective_learning_rate(opt, ctx),
                                                 defaults),
        amp=opt.amp and ctx.device.type == 'cuda',
        normalize_on_device=opt.normalize_on_device == 'on' or
        (opt.normalize_on_device == 'auto' and ctx.device.type == 'cuda'),
        decode_on_device=data.decode_on_device(opt, ctx),
        video_path=video_path, annotation_path=annotation_path, file_type=file_type, shards=shards,
        resume_path=resume, schedule_changes=ckpt.schedule_changes(opt, checkpoint, defaults),
        **ckpt.fine_tuning_settings(opt, checkpoint, resume, defaults))
    return record, checkpoint


def effective_learning_rate(opt, ctx):
    if opt.lr_scaling != 'linear':
        return opt.learning_rate
    global_batch = opt.batch_size * opt.accumulation_steps
    lr = opt.learning_rate * global_batch / opt.base_batch_size
    log(ctx, f'linear lr scaling: lr {opt.learning_rate:g} x {global_batch}/'
             f'{opt.base_batch_size} = {lr:g}')
    return lr


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


# ----------------------------------------------------------------------------- restore

def restore(opt, ctx, record, checkpoint):
    """The model with its weights (pretrained, or resumed from `checkpoint`, the
    one at record.resume_path) and its frozen modules. Completes the run record."""
    torch.manual_seed(opt.manual_seed)
    model = build_model(opt, record.n_classes, pretrained=record.resume_path is None,
                        report=lambda line: log(ctx, line))
    if checkpoint is not None:
        ckpt.load_resumed_weights(model, checkpoint, opt, record)
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
                      progress_bar=not opt.no_progress and on_terminal(), frozen_modules=record.frozen_modules,
                      amp_dtype=opt.amp_dtype, clip_grad_norm=opt.clip_grad_norm,
                      mix=MixConfig(opt.mixup_alpha, opt.cutmix_alpha, opt.mix_prob,
                                    opt.mix_switch_prob),
                      n_classes=record.n_classes)


# ----------------------------------------------------------------------------- fit

def fit(run, checkpoint):
    """Epochs record.begin_epoch..n_epochs: train, validate, step the schedule,
    checkpoint. Returns the EMA model (None without --ema_decay). After a stop
    signal the run ends at the next optimizer step with a checkpoint (Preempted)."""
    opt, ctx, record = run.opt, run.ctx, run.record
    train_loader = data.make_train_loader(run.datasets.train, opt, ctx)
    trainer = ckpt.make_trainer(opt, ctx, record, run.model, checkpoint, len(train_loader),
                                option_defaults(opt.dataset))
    saver = ckpt.CheckpointSaver(opt, ctx, record, run.model, trainer, run.datasets.class_names)
    ckpt.check_resume_batch(record, len(train_loader))
    if run.config.mix.enabled:
        log(ctx, 'mixup/cutmix: the training accuracy is against each clip\'s dominant label')
    if record.begin_epoch > opt.n_epochs:
        log(ctx, f'checkpoint epoch {record.begin_epoch - 1} >= --n_epochs {opt.n_epochs}: '
                 f'nothing to train')
    last_iter = (record.begin_epoch - 1) * len(train_loader) + record.begin_batch
    with training_logs(opt, ctx, run.val_loader is not None, record.begin_epoch - 1,
                       last_iter if record.begin_batch else None, last_iter) as logs, StopRequest() as stop:
        steps = ckpt.StepCheckpoints(opt.checkpoint_steps, opt.accumulation_steps, stop, ctx, saver)
        loss_watch = LossWatch(opt.learning_rate, record.begin_epoch)
        for epoch in range(record.begin_epoch, opt.n_epochs + 1):
            first_batch = record.begin_batch if epoch == record.begin_epoch else 0
            start_training_epoch(opt, ctx, epoch, train_loader, trainer, checkpoint, first_batch)
            stats, val_stats = train_and_validate(run, epoch, train_loader, trainer, logs, first_batch,
                                                  lambda done, e=epoch: steps.after_step(e, done))
            if warning := loss_watch.check(epoch, stats['loss'], stats['first_loss'],
                                           val_stats['loss'] if val_stats else None):
                log(ctx, warning)
            if steps.stopped_at is not None:
                raise Preempted(stop.signal_name or 'a signal to another rank', steps.stopped_at)
            stopping = agree_to_stop(stop.requested, ctx) and epoch < opt.n_epochs
            path = saver.after_epoch(epoch, val_stats, force=stopping)
            if stopping:
                raise Preempted(stop.signal_name or 'a signal to another rank', path)
    if run.tb_writer is not None and record.begin_epoch <= opt.n_epochs:
        write_hparams(run.tb_writer, opt, ctx.world_size, opt.n_epochs, stats, val_stats)
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
    if first_batch and not ckpt.restore_rank_state(checkpoint, ctx, trainer):
        # Not this run's streams: fresh ones for the rest of the epoch (not a
        # replay of the epoch's first draws).
        data.seed_worker_rngs(restart_seed(seed, first_batch))
        trainer.mix_rng = np.random.default_rng([seed, 1, first_batch])


# ----------------------------------------------------------------------------- evaluate, infer

def evaluate(run):
    """Validation only (--no_train): the weights of the resumed epoch, appended to
    val.log as the predecessor did (scripts read it). A mid-epoch checkpoint's
    row is the epoch it was written in."""
    record, ctx = run.record, run.ctx
    epoch = record.begin_epoch if record.begin_batch else record.begin_epoch - 1
    stats = val_epoch(epoch, run.val_loader, run.model, ctx, run.config, run.tb_writer,
                      run.datasets.class_names)
    within = f' of epoch {epoch} after {record.begin_batch} of its batches' if record.begin_batch else ''
    log(ctx, f'validation{within}: {describe_validation(stats)} ({stats["n_videos"]} videos)')
    if ctx.is_main:
        with TsvLogger(run.opt.result_path / 'val.log', VAL_LOG_COLUMNS) as val_log:
            val_log.log(dict(epoch=epoch, **stats))


def infer(run):
    """Inference written to <result_path>/<subset>.json (and the features file),
    and its evaluation on a labelled subset."""
    opt, ctx, model = run.opt, run.ctx, run.model
    loader = data.make_inference_loader(run.datasets.infer, opt, ctx)
    du.broadcast_buffers(model, ctx)  # rank 0's BatchNorm statistics, as after validation
    result_file = opt.result_path / f'{opt.inference_subset}.json'
    head = None
    if opt.extract_features is not None:
        head = du.unwrap(model).get_submodule(classifier_name(opt.model))
    output = run_inference(loader, model, run.datasets.class_names, ctx, run.config, result_file,
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
        report_inference(result_file, run.record.annotation_path, SUBSET_NAMES[opt.inference_subset])


def main(argv=None):
    launch(parse_opts(argv), run)


if __name__ == '__main__':
    launch(COMMAND_LINE, run)
