"""Exponential moving average of the weights (and BatchNorm buffers), built on
torch.optim.swa_utils.AveragedModel.

The average starts at the weights it is made from and, after every optimizer
step, becomes ``decay * ema + (1 - decay) * weights``. Buffers are averaged
too (``use_buffers=True``), so the EMA network's BatchNorm statistics follow
its averaged weights rather than the last step's.

Checkpoints hold the averaged network with plain keys (``ema_state_dict``, a
model state dict that any model of the architecture loads) and the update
count (``ema_n_averaged``).
"""
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from utils.checkpoint import CheckpointError
from utils.distributed import unwrap


def make_ema(model, decay):
    """An AveragedModel of the network inside `model` (DDP / compile wrappers
    removed), starting at its current weights."""
    net = unwrap(model)
    ema = AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)
    ema.update_parameters(net)  # n_averaged 0 -> 1: copies, later updates average
    ema.requires_grad_(False)
    return ema


def update_ema(ema, model):
    ema.update_parameters(unwrap(model))


def ema_checkpoint_entries(ema):
    return {'ema_state_dict': ema.module.state_dict(),
            'ema_n_averaged': int(ema.n_averaged.item())}


def load_ema(ema, checkpoint, source):
    """Restores the EMA from a checkpoint written by ema_checkpoint_entries.

    A checkpoint without EMA entries (saved before --ema_decay was given)
    starts the average at the loaded weights; returns False then."""
    if 'ema_state_dict' not in checkpoint:
        return False
    try:
        ema.module.load_state_dict(checkpoint['ema_state_dict'])
    except RuntimeError as e:
        raise CheckpointError(f'{source}: its ema_state_dict does not fit the model: {e}') from e
    ema.n_averaged.fill_(int(checkpoint['ema_n_averaged']))
    return True


def inference_state_dict(checkpoint, weights, source, option='--inference_weights'):
    """The state dict to run: the raw weights, or the EMA ones (weights='ema');
    ``option`` is the tool's name for the choice, for the message."""
    if weights == 'raw':
        return checkpoint['state_dict']
    if 'ema_state_dict' not in checkpoint:
        raise CheckpointError(f'{source} holds no EMA weights (it was trained without '
                              f'--ema_decay): use {option} raw')
    return checkpoint['ema_state_dict']

