"""Activation checkpointing per residual stage (torch.utils.checkpoint,
non-reentrant): a stage keeps only its input during the forward pass and
runs again during the backward pass, trading about one more forward for the
memory of its activations.

The recomputation must not count the batch twice in BatchNorm's running
statistics: while a stage is recomputed its BatchNorm layers run with
momentum 0 and keep their ``num_batches_tracked``, so outputs, gradients and
statistics equal those of the plain network.
"""
import contextlib
import re
from collections import OrderedDict

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from models.densenet import DenseBlock

STAGE_NAME = re.compile(r'^layer\d+$')


@contextlib.contextmanager
def _frozen_bn_statistics(module):
    layers = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
              and m.track_running_stats]
    saved = [(m.momentum, m.num_batches_tracked.clone()) for m in layers]
    for m in layers:
        m.momentum = 0.0
    try:
        yield
    finally:
        for m, (momentum, tracked) in zip(layers, saved):
            m.momentum = momentum
            m.num_batches_tracked.copy_(tracked)


class CheckpointedStage(nn.Sequential):
    """nn.Sequential with the same children (so the same state-dict keys) whose
    forward is checkpointed while gradients are being recorded."""

    def forward(self, x):
        if not (self.training and torch.is_grad_enabled()):
            return super().forward(x)
        if torch.compiler.is_compiling():
            # Compiled, the stage is recomputed inside the backward graph, and the
            # statistics updates stay in the forward graph: nothing to freeze.
            return checkpoint(super().forward, x, use_reentrant=False)
        return checkpoint(super().forward, x, use_reentrant=False,
                          context_fn=lambda: (contextlib.nullcontext(),
                                              _frozen_bn_statistics(self)))


def _stages(model):
    """(parent, name, stage): ResNet-style layer1..layerN and DenseNet's dense blocks."""
    for name, child in model.named_children():
        if STAGE_NAME.match(name) and isinstance(child, nn.Sequential):
            yield model, name, child
        elif name == 'features' and isinstance(child, nn.Sequential):
            for sub_name, sub in child.named_children():
                if isinstance(sub, DenseBlock):
                    yield child, sub_name, sub


def enable_grad_checkpointing(model):
    """Checkpoints every residual stage of `model` in place; returns their names.
    Call before DDP / torch.compile wrap the model."""
    names = []
    for parent, name, stage in list(_stages(model)):
        if not isinstance(stage, CheckpointedStage):
            setattr(parent, name, CheckpointedStage(OrderedDict(stage.named_children())))
            if not stage.training:
                getattr(parent, name).eval()
        names.append(name)
    if not names:
        raise ValueError(f'--grad_checkpointing: {type(model).__name__} has no residual stages '
                         f'(layer1.. or dense blocks) to checkpoint')
    return names
