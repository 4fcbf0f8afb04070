"""Exponential moving average of the weights (and BatchNorm buffers).

The average starts at the weights it is made from and, after every optimizer
step, becomes ``decay * ema + (1 - decay) * weights``. Buffers are averaged
too, so the EMA network's BatchNorm statistics follow its averaged weights
rather than the last step's.

The arithmetic is that of torch.optim.swa_utils.AveragedModel with
get_ema_multi_avg_fn and use_buffers=True (one torch._foreach_lerp_ per
device and dtype; integer buffers as ``ema * decay + x * (1 - decay)``), bit
for bit. AveragedModel itself keeps its update count in a CPU tensor and copies
it to the device for every group at every update, a blocking host/device
synchronisation per optimizer step; here the count is a Python int.

Checkpoints hold the averaged network with plain keys (``ema_state_dict``, a
model state dict that any model of the architecture loads) and the update
count (``ema_n_averaged``).
"""
import copy
import itertools

import torch

from utils.distributed import unwrap
from utils.errors import CheckpointError


class ModelEma:
    """The averaged copy of a network (`module`) and its update count
    (`n_averaged`; the starting copy counts as one, as in AveragedModel)."""

    def __init__(self, net, decay):
        self.module = copy.deepcopy(net).requires_grad_(False)
        self.decay = decay
        self.n_averaged = 1

    @torch.no_grad()
    def update(self, net):
        groups = {}
        for ema, current in zip(_tensors(self.module), _tensors(net), strict=True):
            pair = groups.setdefault((ema.device, ema.dtype), ([], []))
            pair[0].append(ema.detach())
            pair[1].append(current.detach())
        for ema_list, current_list in groups.values():
            if ema_list[0].is_floating_point() or ema_list[0].is_complex():
                torch._foreach_lerp_(ema_list, current_list, 1 - self.decay)
            else:  # num_batches_tracked
                for ema, current in zip(ema_list, current_list):
                    ema.copy_(ema * self.decay + current * (1 - self.decay))
        self.n_averaged += 1


def _tensors(net):
    return itertools.chain(net.parameters(), net.buffers())


def make_ema(model, decay):
    """The EMA of the network inside `model` (DDP / compile wrappers removed),
    starting at its current weights."""
    return ModelEma(unwrap(model), decay)


def update_ema(ema, model):
    ema.update(unwrap(model))


def ema_checkpoint_entries(ema):
    return {'ema_state_dict': ema.module.state_dict(),
            'ema_n_averaged': ema.n_averaged}


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
    ema.n_averaged = int(checkpoint['ema_n_averaged'])
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

