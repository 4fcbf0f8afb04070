"""Precise BatchNorm statistics (Wu & Johnson 2021; PySlowFast's --precise_bn).

The running mean and variance a BatchNorm layer keeps during training are an
exponential average over weights that kept changing. Before validation they
are recomputed with the final weights: the plain average of the batch
statistics over N training batches (BatchNorm's own cumulative mode,
momentum=None), then averaged over ranks. Nothing else changes: weights,
``num_batches_tracked`` and momenta are as before, and layers in eval mode
(frozen by fine-tuning) keep their statistics.
"""
import torch
import torch.distributed as dist
import torch.nn as nn

from utils.distributed import unwrap


def _trained_bn_layers(net):
    return [m for m in net.modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training
            and m.track_running_stats]


@torch.no_grad()
def recompute_bn_stats(model, batches, ctx):
    """Recomputes the statistics of the BatchNorm layers that are in training
    mode, from the clips yielded by `batches` (already on the device, normalized).

    Runs the network without its DDP wrapper (DDP would broadcast rank 0's
    buffers before each forward). Returns the number of batches used.
    """
    net = unwrap(model)
    layers = _trained_bn_layers(net)
    if not layers:
        return 0
    saved = [(m.momentum, m.num_batches_tracked.clone()) for m in layers]
    for m in layers:
        m.reset_running_stats()
        m.momentum = None  # cumulative average of the batch statistics
    n = 0
    for clips in batches:
        net(clips)
        n += 1
    for m, (momentum, tracked) in zip(layers, saved):
        m.momentum = momentum
        m.num_batches_tracked.copy_(tracked)
    if ctx.distributed:
        stats = torch.cat([torch.cat([m.running_mean, m.running_var]) for m in layers])
        dist.all_reduce(stats, op=dist.ReduceOp.SUM)
        stats /= ctx.world_size
        offset = 0
        for m in layers:
            c = m.running_mean.numel()
            m.running_mean.copy_(stats[offset:offset + c])
            m.running_var.copy_(stats[offset + c:offset + 2 * c])
            offset += 2 * c
    return n
