"""Average the weights of several checkpoints of one run into one checkpoint.

    python -m util_scripts.average_checkpoints results/save_8.pth results/save_9.pth \
        results/save_10.pth --output results/average.pth [--weights ema]

Every checkpoint must hold the same architecture (``arch``) with the same
state-dict keys and shapes, class names and class count, and the same model and
input options (``MODEL_AND_INPUT_OPTIONS``); the output carries them over
(``opts`` and the fine-tuning settings from the last file), so ``predict.py``
reads it alone. Floating-point tensors are averaged; integer
buffers (BatchNorm's ``num_batches_tracked``) are taken from the last file.
The output loads like any checkpoint: ``--resume_path average.pth --no_train
--inference`` runs it (it has no optimizer state, so training from it starts
afresh at the epoch after the last file's). BatchNorm statistics are averaged
too; recomputing them (``--precise_bn``) is an option when they disagree.
"""
import argparse
import sys
from pathlib import Path

from checkpoint import FINE_TUNING_KEYS
from utils.checkpoint import load_checkpoint, save_checkpoint_atomic
from utils.errors import CheckpointError


def _weights(checkpoint, which, path):
    key = 'state_dict' if which == 'raw' else 'ema_state_dict'
    if key not in checkpoint:
        raise CheckpointError(f'{path} has no {key} (--weights {which})')
    return checkpoint[key]


def _check_same_architecture(reference, ref_path, state, arch, path):
    if arch != reference['arch']:
        raise CheckpointError(f'{path} holds {arch} but {ref_path} holds {reference["arch"]}: '
                              f'only checkpoints of one architecture can be averaged')
    if list(state) != list(reference['state']):
        missing = set(reference['state']) ^ set(state)
        raise CheckpointError(f'{path} and {ref_path} have different state-dict keys '
                              f'(e.g. {sorted(missing)[:3]})')
    for key, value in state.items():
        if value.shape != reference['state'][key].shape:
            raise CheckpointError(f'{path}: {key} has shape {tuple(value.shape)}, '
                                  f'{ref_path} {tuple(reference["state"][key].shape)}')


# What a checkpoint says about the network and what it is shown, besides the
# state dict's keys and shapes (checked apart): inputs must agree on them.
RUN_KEYS = ('n_classes', 'class_names')  # and 'arch', checked with the state dict
MODEL_AND_INPUT_OPTIONS = (
    'model', 'model_depth', 'resnet_shortcut', 'resnet_widen_factor', 'wide_resnet_k',
    'resnext_cardinality', 'conv1_t_size', 'conv1_t_stride', 'no_max_pool', 'input_type',
    'sample_size', 'sample_duration', 'sample_t_stride', 'value_scale', 'mean_dataset',
    'no_mean_norm', 'no_std_norm')
# Carried over from the last file, as its epoch is (predict.py and resuming read them).
CARRIED_KEYS = ('class_names', 'arch', 'opts', *FINE_TUNING_KEYS)


def _settings(checkpoint):
    """{key: value} of the settings the inputs must share (those the file holds)."""
    settings = {k: checkpoint[k] for k in RUN_KEYS if k in checkpoint}
    opts = checkpoint.get('opts') or {}
    settings.update({f'opts.{k}': opts[k] for k in MODEL_AND_INPUT_OPTIONS if k in opts})
    return settings


def _short(value):
    """A value for a one-line message: long lists (class names) cut to three."""
    if isinstance(value, list) and len(value) > 3:
        return repr(value[:3])[:-1] + ', ...]'
    return repr(value)


def _check_same_settings(reference, ref_path, checkpoint, path):
    for key, value in _settings(checkpoint).items():
        if key in reference and reference[key] != value:
            raise CheckpointError(f'{path} and {ref_path} disagree on {key} ({_short(value)} '
                                  f'vs {_short(reference[key])}): only checkpoints of one '
                                  f'model with one input setting can be averaged')
        reference.setdefault(key, value)


def average_checkpoints(paths, which='raw'):
    """The averaged checkpoint (a dict ready to save) of the files at `paths`,
    with the last file's epoch, options, class names and architecture."""
    if len(paths) < 2:
        raise ValueError('give at least two checkpoints to average')
    reference, sums, settings = None, None, {}
    for path in paths:
        checkpoint = load_checkpoint(path)
        state = _weights(checkpoint, which, path)
        arch = checkpoint.get('arch')
        _check_same_settings(settings, paths[0], checkpoint, path)
        if reference is None:
            reference = {'arch': arch, 'state': state}
            sums = {k: v.double() if v.is_floating_point() else v.clone() for k, v in state.items()}
            continue
        _check_same_architecture(reference, paths[0], state, arch, path)
        for key, value in state.items():
            sums[key] = sums[key] + value.double() if value.is_floating_point() else value.clone()
    averaged = {k: (v / len(paths)).to(reference['state'][k].dtype) if v.is_floating_point()
                else v for k, v in sums.items()}
    carried = {k: checkpoint[k] for k in CARRIED_KEYS if k in checkpoint}
    return {**carried, 'epoch': checkpoint.get('epoch', 0), 'arch': reference['arch'],
            'state_dict': averaged, 'averaged_from': [str(p) for p in paths],
            'averaged_weights': which}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('checkpoints', nargs='+', type=Path)
    parser.add_argument('--output', type=Path, required=True)
    parser.add_argument('--weights', choices=['raw', 'ema'], default='raw',
                        help='average the raw weights or the EMA weights of each file')
    args = parser.parse_args(argv)
    try:
        averaged = average_checkpoints(args.checkpoints, args.weights)
    except (CheckpointError, FileNotFoundError, ValueError) as e:
        print(f'error: {e}', file=sys.stderr)
        sys.exit(2)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    save_checkpoint_atomic(averaged, args.output)
    print(f'averaged {len(args.checkpoints)} checkpoints ({averaged["arch"]}, '
          f'{args.weights} weights) into {args.output}')


if __name__ == '__main__':
    main()
