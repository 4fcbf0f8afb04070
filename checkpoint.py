"""What a checkpoint of a run holds: written (save_checkpoint, and the savers
main.py's epoch loop calls) and read (what a resumed run takes from it, and
the trained model for predict.py, util_scripts.export and averaging) here.

Keys: 3D-ResNets-PyTorch's 'epoch' (completed epochs), 'arch', 'state_dict',
'optimizer', 'scheduler'; then 'batches_done' (a mid-epoch checkpoint: the
batches of the next epoch it covers, with 'rank_states', every process's
random states and running sums), 'class_names', FINE_TUNING_KEYS, 'scaler',
the EMA's ('ema_state_dict', 'ema_n_averaged'), 'rng_state' and 'opts' (the
options as given). With 'arch' and 'opts' a checkpoint is usable alone.
Files are written atomically and read with weights_only=True
(utils/checkpoint.py). `defaults`, {option: its default}, comes from the
command line (opts.option_defaults): the library never imports opts.py.
"""
import argparse
import os

import torch

from datasets.annotation import load_class_names
from model import classifier_name, generate_model, load_state_dict_checked
from training import EpochTotals, OptimizerConfig, Trainer, make_optimizer, optimizer_kind
from utils import distributed as du
from utils.checkpoint import (
    capture_rng_state,
    find_latest_checkpoint,
    load_checkpoint,
    load_training_checkpoint,
    restore_rng_state,
    save_checkpoint_atomic,
)
from utils.ema import ema_checkpoint_entries, inference_state_dict, load_ema, make_ema
from utils.errors import CheckpointError, DataError, OptionError
from utils.launch import log, on_main_rank
from utils.lr_schedule import LRSchedule, ScheduleConfig, schedule_kind, steps_per_epoch
from utils.precision import amp_dtype
from utils.preemption import agree_to_stop
from utils.result_folder import record_last_checkpoint, recorded_last_checkpoint, set_aside_later_checkpoints
from utils.retention import (
    BEST,
    BestTracker,
    checkpoint_name,
    checkpoint_progress,
    drop_best_after,
    prune_checkpoints,
)
from utils.urls import redact_url, storage_option_names

# Kept apart from 'opts': a resumed run keeps them without being given them.
FINE_TUNING_KEYS = ('n_classes', 'ft_begin_module', 'ft_lr_ratio')
# The schedule settings a resumed run may change, and the schedule each one shapes.
SCHEDULE_SETTINGS = {'warmup_epochs': 'cosine', 'min_lr': 'cosine', 'plateau_patience': 'plateau'}


# ----------------------------------------------------------------------------- writing

def save_checkpoint(path, epoch, opt, record, model, trainer, class_names, batches_done=0,
                    rank_states=None):
    """The state after `batches_done` batches of `epoch` (0: the whole epoch);
    a mid-epoch one also holds every process's rank_state, in rank order."""
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
        'opts': stored_form(opt),
    }, path)


def stored_form(opt):
    """The options as a checkpoint keeps them: paths as strings, values that
    load with weights_only=True."""
    values = {k: str(v) if isinstance(v, os.PathLike) else v for k, v in vars(opt).items()}
    if values.get('video_path'):
        values['video_path'] = redact_url(values['video_path'])  # an HTTP password never goes into a checkpoint
    if 'storage_options' in values:  # nor a storage option's value (a key, a token): its name only
        values['storage_options'] = storage_option_names(values['storage_options'])
    return {k: v for k, v in values.items() if v is None or isinstance(v, (str, int, float, bool, list))}


def rank_state(trainer, ctx):
    """What a mid-epoch checkpoint keeps of each process: its random states
    (CUDA's on a GPU), its mixup/cutmix generator and its epoch's running sums."""
    return {'rng_state': capture_rng_state(ctx.device),
            'mix_rng': trainer.mix_rng.bit_generator.state if trainer.mix_rng is not None else None,
            'epoch_totals': trainer.totals.state_dict() if trainer.totals is not None else None}


class CheckpointSaver:
    """Writes checkpoints on rank 0 (every rank waits until the file is
    complete), keeps --keep_last of them, and with --keep_last best.pth."""

    def __init__(self, opt, ctx, record, model, trainer, class_names):
        self.opt, self.ctx = opt, ctx
        self.state = (record, model, trainer, class_names)  # what save_checkpoint takes
        if ctx.is_main and record.resume_path is not None:
            set_aside_abandoned_line(opt.result_path, record, ctx)
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
            record_last_checkpoint(self.opt.result_path, path)
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
            on_main_rank(self.ctx, lambda: self.save_best(epoch, acc, val_stats['loss']))
        return path

    def save_best(self, epoch, video_acc, val_loss):
        if self.best.improves(epoch, video_acc, val_loss):
            save_checkpoint(self.best.path, epoch, self.opt, *self.state)
            self.best.saved(epoch, video_acc, val_loss)


def set_aside_abandoned_line(result_path, record, ctx):
    """Checkpoints after the one the run resumes are of a line of training it
    abandons: moved into a subfolder (utils.result_folder), in one line."""
    progress = (record.begin_epoch - 1, record.begin_batch)
    folder, moved = set_aside_later_checkpoints(result_path, progress)
    if folder is None:
        return
    checkpoints = [n for n in moved if checkpoint_progress(n) is not None]
    names = ', '.join(checkpoints[:2]) + (f' ... {checkpoints[-1]}' if len(checkpoints) > 2 else '')
    best = ' and best.pth' if BEST in moved else ''
    after = f'epoch {progress[0]}' + (f' and {progress[1]} batches' if progress[1] else '')
    log(ctx, f'{result_path} holds checkpoints after the one this run resumes ({after}): {names}{best}, '
             f'of a line of training it abandons, moved with copies of its logs into {folder.name}/ '
             f'(--auto_resume and the logs follow this run from here)')


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


# ----------------------------------------------------------------------------- resuming

def fine_tuning_settings(opt, checkpoint, checkpoint_path, defaults):
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
        if stored is not None and value != stored and value != defaults[key]:
            raise OptionError(f'--{key} {value} differs from the {stored!r} of --resume_path '
                              f'{checkpoint_path}: a resumed run keeps it; leave --{key} out')
        settings[key] = value if stored is None else stored
    return settings


def resume_path(opt, ctx):
    """--resume_path; with --auto_resume, the checkpoint the result folder's
    last run wrote last (last_checkpoint.json), else (a folder of an earlier
    version) the newest that loads, or None. Rank 0 chooses, so every rank
    resumes from the same file."""
    if opt.resume_path is not None or not opt.auto_resume:
        return opt.resume_path
    latest = du.broadcast_object(
        auto_resume_checkpoint(opt.result_path) if ctx.is_main else None, ctx)
    if latest is not None:
        log(ctx, f'auto-resume from {latest}')
        if ctx.is_main and (note := written_after(latest)):
            log(ctx, note)
    return latest


def auto_resume_checkpoint(result_path):
    """The checkpoint last_checkpoint.json names when it loads: a higher-numbered
    one is left by a line of training a resume abandoned; else the newest that loads."""
    recorded = recorded_last_checkpoint(result_path)
    if recorded is not None:
        try:
            load_training_checkpoint(recorded)
            return recorded
        except CheckpointError:
            pass
    return find_latest_checkpoint(result_path)


def written_after(chosen):
    """A warning when a lower-numbered checkpoint beside `chosen` was written
    after it (a folder without last_checkpoint.json, of an earlier version:
    a resume from an earlier epoch left the later checkpoints of the line it
    abandoned), else None."""
    if recorded_last_checkpoint(chosen.parent) is not None:
        return None
    newer = [p for p in chosen.parent.glob('save_*.pth') if checkpoint_progress(p.name) is not None
             and p.stat().st_mtime > chosen.stat().st_mtime]
    if not newer:
        return None
    last = max(newer, key=lambda p: p.stat().st_mtime)
    return (f'warning: {last.name} was written after {chosen.name}: {chosen.name} may be of a line of '
            f'training a resume abandoned; to go on from {last.name}, give --resume_path {last} (the '
            f'later checkpoints are then set aside)')


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


def resumed_learning_rate(opt, ctx, checkpoint, lr, defaults):
    """The full rate (param group 0's) a resumed optimizer continues from: the
    checkpoint's (a new --learning_rate is ignored then, in one line); `lr`
    without a checkpoint to train from."""
    if checkpoint is None or opt.no_train:
        return lr
    groups = (checkpoint.get('optimizer') or {}).get('param_groups') or [{}]
    stored = groups[0].get('initial_lr', lr)  # set by the schedules but plateau
    stored_opts = checkpoint.get('opts') or {}
    given = opt.learning_rate != defaults['learning_rate']
    if given and opt.learning_rate != stored_opts.get('learning_rate', opt.learning_rate):
        log(ctx, f'--learning_rate {opt.learning_rate:g} is ignored on resume: the optimizer and its '
                 f'schedule continue from the checkpoint\'s ({stored:g}); --pretrain_path starts a '
                 f'new optimization from its weights at a new rate')
    return stored


def schedule_changes(opt, checkpoint, defaults):
    """What a resumed training changes of its checkpoint's schedule, for the run
    record: {option: {'checkpoint': its value, 'now': this run's}} of
    --n_epochs and of the SCHEDULE_SETTINGS given that shape --lr_scheduler."""
    if checkpoint is None or opt.no_train:
        return {}
    stored = checkpoint.get('opts') or {}
    changes = {}
    for key in ('n_epochs', *SCHEDULE_SETTINGS):
        old, now = stored.get(key), getattr(opt, key)
        given = key == 'n_epochs' or now != defaults[key]  # n_epochs is never the checkpoint's
        shapes = SCHEDULE_SETTINGS.get(key, opt.lr_scheduler) == opt.lr_scheduler
        if old is not None and given and shapes and now != old:
            changes[key] = {'checkpoint': old, 'now': now}
    return changes


def describe_schedule_changes(changes, schedule, checkpoint_rate):
    """The line that says what schedule_changes found; with cosine, the rate the
    next step runs at on the new schedule and on the checkpoint's."""
    line = ', '.join(f'--{key} {change["now"]:g} replaces the checkpoint\'s {change["checkpoint"]:g}'
                     for key, change in changes.items()) + ' from here on'
    if schedule.kind == 'cosine':
        rate = schedule.scheduler.optimizer.param_groups[0]['lr']
        line += (f': the cosine schedule is recomputed, optimizer step {schedule.steps_done + 1} runs at '
                 f'lr {rate:g} (the checkpoint\'s schedule: {checkpoint_rate:g})')
    return line


def schedule_config(opt, ctx, checkpoint, defaults):
    """--lr_scheduler's settings. On resume, a SCHEDULE_SETTINGS option not
    given is the checkpoint's, and a new value applies from the checkpoint on
    (make_trainer says so). --warmup_epochs and --min_lr given with another
    schedule than cosine are named: they do nothing there."""
    stored = (checkpoint or {}).get('opts') or {}
    values, given = {}, set()
    for key in SCHEDULE_SETTINGS:
        value, old = getattr(opt, key), stored.get(key)
        if value != defaults[key]:
            given.add(key)
        if old is not None and key not in given:
            value = old
        values[key] = value
    if opt.lr_scheduler != 'cosine' and given & {'warmup_epochs', 'min_lr'}:
        log(ctx, f'--warmup_epochs and --min_lr shape the cosine schedule only: ignored with '
                 f'--lr_scheduler {opt.lr_scheduler}')
    return ScheduleConfig(opt.lr_scheduler, milestones=tuple(opt.multistep_milestones),
                          n_epochs=opt.n_epochs, **values)


def make_trainer(opt, ctx, record, model, checkpoint, n_batches, defaults):
    """Optimizer, schedule, gradient scaler and EMA as the options make them,
    with the states of `checkpoint` (None: a fresh run)."""
    optimizer = make_optimizer(model, OptimizerConfig(
        opt.optimizer, record.learning_rate, momentum=opt.momentum, dampening=opt.dampening,
        weight_decay=opt.weight_decay, nesterov=opt.nesterov, head=classifier_name(opt.model),
        backbone_lr_ratio=record.ft_lr_ratio))
    config = schedule_config(opt, ctx, checkpoint, defaults)
    schedule = LRSchedule(optimizer, config, steps_per_epoch(n_batches, opt.accumulation_steps))
    fp16 = record.amp and amp_dtype(ctx.device, opt.amp_dtype) == torch.float16
    scaler = torch.amp.GradScaler(ctx.device.type, enabled=fp16)
    ema = make_ema(model, opt.ema_decay) if opt.ema_decay > 0 else None
    if ema is not None and checkpoint is not None and \
            not load_ema(ema, checkpoint, f'--resume_path {record.resume_path}'):
        log(ctx, f'{record.resume_path} has no EMA weights: the average starts from its weights')
    if checkpoint is not None and 'optimizer' in checkpoint:
        optimizer.load_state_dict(checkpoint['optimizer'])
        checkpoint_rate = optimizer.param_groups[0]['lr']
        schedule.load_state_dict(checkpoint['scheduler'], milestones=(
            opt.multistep_milestones if opt.overwrite_milestones else None),
            patience=config.plateau_patience if 'plateau_patience' in (checkpoint.get('opts') or {})
            else None)
        if record.schedule_changes:
            log(ctx, describe_schedule_changes(record.schedule_changes, schedule, checkpoint_rate))
        if checkpoint.get('scaler') and fp16:  # empty from a bf16 or fp32 run
            scaler.load_state_dict(checkpoint['scaler'])
    return Trainer(optimizer, schedule, scaler, ema)


def check_class_names(stored, found, checkpoint_path, annotation_path, fine_tuning):
    """The checkpoint's class names (`stored`; None: the predecessor's, which
    kept none) against the annotation's (`found`), whose counts are equal by
    now: the same names in another order would train and score under swapped
    names, other names are another task. Raises DataError; fine_tuning
    (--pretrain_path) expects new classes: returns a note line then."""
    if not stored or not found or list(stored) == list(found):
        return None
    source = f'--resume_path {checkpoint_path}'
    if sorted(stored) == sorted(found):
        moved = [(name, i, found.index(name)) for i, name in enumerate(stored) if found[i] != name][:2]
        (a, a_was, a_is), (b, b_was, b_is) = moved
        raise DataError(
            f'{annotation_path} lists the classes of {source} in another order: \'{a}\' is label '
            f'{a_was} in the checkpoint and {a_is} here, \'{b}\' {b_was} and {b_is}; resumed, they would '
            f'train and score under swapped names: write the annotation in the checkpoint\'s order '
            f'(python -m util_scripts.folder_json ROOT OUT.json --labels_from {checkpoint_path}), or '
            f'start a new optimization from its weights with --pretrain_path {checkpoint_path}')
    missing = [name for name in stored if name not in found]
    new = [name for name in found if name not in stored]
    difference = ', '.join([f'{_first_of(missing)} is not in it'] * bool(missing) +
                           [f'{_first_of(new)} is new'] * bool(new))
    if fine_tuning:
        return (f'{annotation_path} has other classes than {source}: {difference}: fine-tuning '
                f'(--pretrain_path) goes on under the annotation\'s names')
    raise DataError(f'{annotation_path} has other classes than {source}: {difference}; resume with '
                    f'the annotation it was trained on, or fine-tune its weights on these classes with '
                    f'--pretrain_path {checkpoint_path}')


def _first_of(names):
    return f"'{names[0]}'" + (f' (and {len(names) - 1} more)' if len(names) > 1 else '')


def load_resumed_weights(model, checkpoint, opt, record):
    """The weights of the checkpoint the run resumes (--no_train: those
    --inference_weights names), once it is known to hold the model the options
    build; record.begin_epoch and begin_batch say where the run goes on."""
    if checkpoint.get('arch', opt.arch) != opt.arch:
        raise OptionError(f'--resume_path {record.resume_path} holds a {checkpoint["arch"]} '
                          f'model but the options build {opt.arch}')
    source = f'--resume_path {record.resume_path}'
    weights = 'raw' if not opt.no_train else opt.inference_weights
    load_state_dict_checked(model, inference_state_dict(checkpoint, weights, source), source, opt)
    record.begin_epoch = checkpoint['epoch'] + 1
    record.begin_batch = checkpoint.get('batches_done', 0)


def check_resume_batch(record, n_batches):
    if record.begin_batch >= n_batches:
        raise OptionError(f'{record.resume_path} was written after {record.begin_batch} batches of '
                          f'epoch {record.begin_epoch}, which has {n_batches} here: resume '
                          f'with the --batch_size and number of processes it was written with')


def restore_rank_state(checkpoint, ctx, trainer):
    """This process's random states, mixup/cutmix generator and epoch sums as a
    mid-epoch checkpoint saved them; False (after one line) when it was written
    by another number of processes. Checkpoints written before rank_states
    kept one process's states, at the top level."""
    states = checkpoint.get('rank_states') or \
        [{'rng_state': checkpoint.get('rng_state'), 'mix_rng': checkpoint.get('mix_rng')}]
    if len(states) != ctx.world_size:
        log(ctx, f'the mid-epoch checkpoint holds the random states of {len(states)} process(es), '
                 f'this run has {ctx.world_size}: the rest of the epoch draws from per-process '
                 f'streams derived from --manual_seed (the weights will differ from an '
                 f'uninterrupted run\'s)')
        return False
    state = states[ctx.rank]
    restore_rng_state(state['rng_state'], ctx.device)
    if state.get('mix_rng'):
        trainer.mix_rng.bit_generator.state = state['mix_rng']
    trainer.totals = EpochTotals(ctx.device, state.get('epoch_totals'))
    return True


# ----------------------------------------------------------------------------- reading

def stored_options(checkpoint, path, defaults):
    """The options the checkpoint's run was started with, over `defaults`
    (options added since then keep theirs)."""
    stored = checkpoint.get('opts')
    if not isinstance(stored, dict):
        raise CheckpointError(f'{path} holds no options ("opts"): it was not written by '
                              f'main.py, so the architecture is unknown')
    options = dict(defaults)
    options.update(stored)
    # the run's own values when it resumed without repeating them (main.py)
    options.update({k: checkpoint[k] for k in ('n_classes', 'ft_begin_module') if k in checkpoint})
    options['n_input_channels'] = 2 if options['input_type'] == 'flow' else 3
    return argparse.Namespace(**options)


def class_names_of(checkpoint, path, annotation_path=None):
    """The names of the network's outputs: the checkpoint's, in its order (an
    annotation listing them in another order must not rename its outputs);
    `annotation_path`'s for a checkpoint that stores none."""
    names = checkpoint.get('class_names')
    if names:
        return list(names)
    if annotation_path is not None:
        return load_class_names(annotation_path)
    raise CheckpointError(f'{path} stores no class names (written before they were '
                          f'saved): pass --annotation_path with the training annotation')


def load_trained_model(path, defaults, annotation_path=None, device='cpu', weights='raw'):
    """(network in eval mode on ``device``, its options, its class names: the
    checkpoint's, or those of `annotation_path`); weights='ema' takes the
    checkpoint's EMA weights (--ema_decay runs)."""
    checkpoint = load_checkpoint(path)
    options = stored_options(checkpoint, path, defaults)
    class_names = class_names_of(checkpoint, path, annotation_path)
    if len(class_names) != options.n_classes:
        raise OptionError(f'{path} has {options.n_classes} classes but {len(class_names)} '
                          f'class names were found: check --annotation_path')
    model = generate_model(options)
    state_dict = inference_state_dict(checkpoint, weights, f'checkpoint {path}', '--weights')
    load_state_dict_checked(model, state_dict, f'checkpoint {path}', options)
    return model.to(device).eval(), options, class_names
