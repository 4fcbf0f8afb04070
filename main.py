"""Entry point: train, validate and run inference with a 3D CNN.

    python main.py --dataset synthetic --result_path results/demo
    torchrun --nproc_per_node=8 main.py --distributed ...
"""
import re
import sys
import time
from collections import Counter

import torch
import torch.multiprocessing as mp

import dataset as data
from datasets.annotation import DataError
from inference import run_inference
from model import build_model, freeze_before, load_state_dict_checked, make_parallel
from opts import OptionError, opts_to_dict, parse_opts, save_opts
from training import amp_dtype, make_optimizer, make_scheduler, steps_per_epoch, train_epoch
from utils import distributed as du
from utils.checkpoint import (CheckpointError, capture_rng_state, find_latest_checkpoint, load_checkpoint,
                              restore_rng_state, save_checkpoint_atomic)
from utils.flops import count_gflops, count_parameters
from utils.logs import TsvLogger
from validation import val_epoch


def log(ctx, *args):
    if ctx.is_main:
        print(*args, flush=True)


def epoch_seed(opt, ctx, epoch):
    """Each (rank, epoch) gets its own stream, so ranks augment differently and a
    resumed run draws exactly what the uninterrupted run drew."""
    return (opt.manual_seed * 1_000_003 + ctx.rank * 10_007 + epoch) % (2**63)


def apply_lr_scaling(opt, ctx):
    opt.world_size_effective = ctx.world_size
    opt.batch_size_per_process = data.per_process_batch(opt.batch_size, ctx)
    if opt.lr_scaling == 'linear':
        opt.base_learning_rate = opt.learning_rate
        opt.learning_rate = opt.learning_rate * opt.batch_size * opt.accumulation_steps / \
            opt.base_batch_size
        log(ctx, f'linear lr scaling: lr {opt.base_learning_rate:g} x '
                 f'{opt.batch_size * opt.accumulation_steps}/{opt.base_batch_size} '
                 f'= {opt.learning_rate:g}')


def save_checkpoint(path, epoch, opt, model, optimizer, scheduler, scaler):
    net = du.unwrap(model)
    save_checkpoint_atomic({
        'epoch': epoch,
        'arch': opt.arch,
        'state_dict': net.state_dict(),
        'optimizer': optimizer.state_dict(),
        'scheduler': scheduler.state_dict(),
        'scaler': scaler.state_dict(),
        'rng_state': capture_rng_state(),
        'opts': {k: v for k, v in opts_to_dict(opt).items() if v is None or
                 isinstance(v, (str, int, float, bool, list))},
    }, path)


def run(opt, ctx):
    opt.result_path.mkdir(parents=True, exist_ok=True)
    if ctx.device.type == 'cuda':
        torch.backends.cudnn.benchmark = True  # fixed clip shapes: pick the fastest kernels
    if opt.dataset == 'synthetic':
        data.prepare_synthetic_paths(opt, ctx)
    if opt.auto_resume and opt.resume_path is None:
        # Rank 0 chooses, so every rank resumes from the same file.
        latest = du.broadcast_object(
            find_latest_checkpoint(opt.result_path) if ctx.is_main else None, ctx)
        if latest is not None:
            opt.resume_path = latest
            log(ctx, f'auto-resume from {latest}')
    apply_lr_scaling(opt, ctx)
    opt.device_type = ctx.device.type
    if opt.amp and ctx.device.type != 'cuda':
        # bf16 convolutions are no faster than fp32 on most CPUs, and oneDNN's
        # bf16 conv3d backward gave sporadic infinite weight gradients here.
        log(ctx, '--amp is ignored on CPU: training in float32')
        opt.amp = False

    # Build every data set first: bad annotations or missing videos fail here,
    # before any training time is spent.
    train_set = val_set = infer_set = None
    if not opt.no_train:
        train_set, class_names = data.get_training_data(opt)
    if not opt.no_val:
        val_set, class_names = data.get_validation_data(opt)
    if opt.inference:
        infer_set, class_names = data.get_inference_data(opt)

    torch.manual_seed(opt.manual_seed)
    model = build_model(opt)
    checkpoint = None
    if opt.resume_path is not None:
        checkpoint = load_checkpoint(opt.resume_path)
        if checkpoint.get('arch', opt.arch) != opt.arch:
            raise OptionError(f'--resume_path {opt.resume_path} holds a {checkpoint["arch"]} '
                             f'model but the options build {opt.arch}')
        load_state_dict_checked(model, checkpoint['state_dict'],
                                f'--resume_path {opt.resume_path}', opt)
        opt.begin_epoch = checkpoint['epoch'] + 1
    frozen = freeze_before(model, opt.ft_begin_module)
    if frozen:
        log(ctx, f'frozen (fine-tuning from {opt.ft_begin_module}): {", ".join(frozen)}')
    clip_shape = (1, opt.n_input_channels, opt.sample_duration, opt.sample_size, opt.sample_size)
    opt.n_parameters = count_parameters(model)
    opt.gflops_per_clip = round(count_gflops(model, clip_shape), 4)
    log(ctx, f'model {opt.arch}: {opt.n_parameters / 1e6:.2f} M parameters, '
             f'{opt.gflops_per_clip:.3f} GFLOPs per {opt.sample_duration}x{opt.sample_size}x'
             f'{opt.sample_size} clip; device {ctx.device}, {ctx.world_size} process(es), '
             f'batch {opt.batch_size_per_process} per process, lr {opt.learning_rate:g}')
    if ctx.is_main:
        save_opts(opt, opt.result_path / 'opts.json')
    model = make_parallel(model, ctx, opt.batchnorm_sync, opt.channels_last)

    tb_writer = None
    if opt.tensorboard and ctx.is_main:
        from torch.utils.tensorboard import SummaryWriter
        tb_writer = SummaryWriter(log_dir=str(opt.result_path))

    val_loader = data.make_val_loader(val_set, opt, ctx) if val_set is not None else None
    if train_set is not None:
        train_loader = data.make_train_loader(train_set, opt, ctx)
        criterion = torch.nn.CrossEntropyLoss().to(ctx.device)
        optimizer = make_optimizer(model, opt)
        scheduler = make_scheduler(optimizer, opt,
                                   steps_per_epoch(len(train_loader), opt.accumulation_steps))
        fp16 = opt.amp and amp_dtype(ctx.device) == torch.float16
        scaler = torch.amp.GradScaler(ctx.device.type, enabled=fp16)
        if checkpoint is not None and 'optimizer' in checkpoint:
            optimizer.load_state_dict(checkpoint['optimizer'])
            scheduler.load_state_dict(checkpoint['scheduler'])
            if 'scaler' in checkpoint:
                scaler.load_state_dict(checkpoint['scaler'])
            restore_rng_state(checkpoint.get('rng_state'))
            if opt.overwrite_milestones and opt.lr_scheduler == 'multistep':
                scheduler.milestones = Counter(opt.multistep_milestones)
        train_logger = batch_logger = val_logger = None
        if ctx.is_main:
            train_logger = TsvLogger(opt.result_path / 'train.log',
                                     ['epoch', 'loss', 'acc', 'lr', 'clips_per_s', 'data_wait'])
            batch_logger = TsvLogger(opt.result_path / 'train_batch.log',
                                     ['epoch', 'batch', 'iter', 'loss', 'acc', 'lr'])
            if val_loader is not None:
                val_logger = TsvLogger(opt.result_path / 'val.log',
                                       ['epoch', 'loss', 'acc', 'clip_acc'])
        if opt.begin_epoch > opt.n_epochs:
            log(ctx, f'checkpoint epoch {opt.begin_epoch - 1} >= --n_epochs {opt.n_epochs}: '
                     f'nothing to train')
        for epoch in range(opt.begin_epoch, opt.n_epochs + 1):
            data.seed_worker_rngs(epoch_seed(opt, ctx, epoch))
            train_loader.sampler.set_epoch(epoch)
            t0 = time.time()
            stats = train_epoch(epoch, train_loader, model, criterion, optimizer, scheduler,
                                scaler, ctx, opt, batch_logger, tb_writer)
            line = (f'epoch {epoch}/{opt.n_epochs} train loss {stats["loss"]:.4f} '
                    f'acc {stats["acc"]:.4f} lr {stats["lr"]:.4g} '
                    f'{stats["clips_per_s"]:.1f} clips/s data wait {stats["data_wait"]:.0%}')
            if ctx.is_main:
                train_logger.log(dict(epoch=epoch, **stats))
            val_stats = None
            if val_loader is not None:
                val_stats = val_epoch(epoch, val_loader, model, ctx, opt, tb_writer)
                line += (f' | val loss {val_stats["loss"]:.4f} video acc {val_stats["acc"]:.4f}'
                         f' clip acc {val_stats["clip_acc"]:.4f}')
                if ctx.is_main:
                    val_logger.log(dict(epoch=epoch, **val_stats))
            log(ctx, line + f' ({time.time() - t0:.0f}s)')
            # The scheduler steps before the checkpoint is written, so a resumed
            # run starts the next epoch with the right learning rate.
            if opt.lr_scheduler == 'plateau':
                scheduler.step(val_stats['loss'] if val_stats else stats['loss'])
            elif opt.lr_scheduler == 'multistep':
                scheduler.step()
            if tb_writer is not None:
                tb_writer.flush()
            if ctx.is_main and (epoch % opt.checkpoint == 0 or epoch == opt.n_epochs):
                save_checkpoint(opt.result_path / f'save_{epoch}.pth', epoch, opt, model,
                                optimizer, scheduler, scaler)
            du.barrier(ctx)
        if ctx.is_main:
            for lg in (train_logger, batch_logger, val_logger):
                if lg is not None:
                    lg.close()
    elif val_loader is not None:
        epoch = opt.begin_epoch - 1
        val_stats = val_epoch(epoch, val_loader, model, ctx, opt, tb_writer)
        log(ctx, f'validation: loss {val_stats["loss"]:.4f} video acc {val_stats["acc"]:.4f} '
                 f'clip acc {val_stats["clip_acc"]:.4f} ({val_stats["n_videos"]} videos)')

    if infer_set is not None:
        infer_loader = data.make_inference_loader(infer_set, opt, ctx)
        result_file = opt.result_path / f'{opt.inference_subset}.json'
        run_inference(infer_loader, model, class_names, ctx, opt, result_file)
        if ctx.is_main:
            log(ctx, f'inference results: {result_file}')
            report_inference_accuracy(opt, result_file, ctx)
    if tb_writer is not None:
        tb_writer.close()
    log(ctx, f'logs, checkpoints and opts.json are in {opt.result_path}')


def report_inference_accuracy(opt, result_file, ctx):
    if opt.inference_subset == 'test':
        return
    from util_scripts.eval_accuracy import compute_accuracy
    subset = data.SUBSETS[opt.inference_subset]
    for k in (1, 5):
        if k > opt.n_classes or (opt.output_topk > 0 and k > opt.output_topk):
            continue
        acc, correct, total = compute_accuracy(opt.annotation_path, result_file, k=k,
                                               subset=subset)
        log(ctx, f'inference top-{k} video accuracy on {subset}: {acc:.4f} ({correct}/{total})')


def worker(local_rank, opt, ranks_per_node):
    """One process: sets up its device and process group, then runs."""
    if local_rank is None:
        ctx = du.init_distributed(opt)
    else:  # spawned by main() itself
        rank = opt.node_rank * ranks_per_node + local_rank
        world = max(1, opt.world_size) * ranks_per_node
        ctx = du.init_distributed(opt, local_rank=local_rank, rank=rank, world_size=world)
    try:
        run(opt, ctx)
    finally:
        du.cleanup(ctx)


def main(argv=None):
    opt = parse_opts(argv)
    try:
        if opt.distributed and not du.launched_by_torchrun():
            n = torch.cuda.device_count() if not opt.no_cuda else 0
            n = max(1, n)
            mp.spawn(worker, args=(opt, n), nprocs=n)
        else:
            worker(None, opt, 1)
    except (DataError, OptionError, CheckpointError, FileNotFoundError) as e:
        # Bad input: one clear message, no traceback from deep inside.
        print(f'error: {clean_message(e)}', file=sys.stderr, flush=True)
        sys.exit(2)


def clean_message(error):
    """A DataLoader re-raises a worker's error with the worker's traceback in
    the message; the user needs only its last line."""
    text = str(error)
    if 'Original Traceback' not in text:
        return text
    lines = text.strip().splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(r'^[\w.]+(Error|Exception): ', line)]
    if not starts:
        return lines[-1]
    return '\n'.join(lines[starts[-1]:]).split(': ', 1)[1]


if __name__ == '__main__':
    main()
