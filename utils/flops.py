"""Parameter and FLOP counts of a network.

FLOPs come from PyTorch's own ``torch.utils.flop_counter.FlopCounterMode``
(no hand-written per-layer rules). It counts a multiply-add as 2 FLOPs, so
our numbers are 2x the multiply-add ("MAC") counts that torchvision and most
papers publish as "GFLOPS": for r3d_18 on one 3x16x112x112 clip we get
81.393 GFLOPs, torchvision lists 40.697 (= 81.393 / 2).

The forward pass runs on fake tensors (FakeTensorMode: shapes only, no data,
no memory for activations), so counting takes well under a second even for
the deepest models. A model whose parameters are on the meta device is
counted directly on a meta input.
"""
from typing import Sequence, Union

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

__all__ = ['count_parameters', 'count_gflops']


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameter elements (all, or only those with requires_grad)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def count_gflops(model: nn.Module, input_shape: Sequence[int], device: Union[str, torch.device] = 'cpu') -> float:
    """GFLOPs (1e9 FLOPs, a multiply-add counted as 2) of one forward pass on one clip.

    input_shape: the clip's (C, T, H, W); a leading batch dimension of 1 is accepted too.
    device: device of the (fake) input; must be the model's (ignored for a meta model).
    The model is evaluated in eval mode under no_grad; its train/eval mode is restored after.
    """
    shape = tuple(input_shape)
    if len(shape) == 5:
        if shape[0] != 1:
            raise ValueError(f'count_gflops counts one clip; got batch size {shape[0]}')
        shape = shape[1:]
    if len(shape) != 4:
        raise ValueError(f'input_shape must be (C, T, H, W), got {tuple(input_shape)}')

    param = next(model.parameters(), None)
    on_meta = param is not None and param.is_meta
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            if on_meta:
                x = torch.empty((1,) + shape, device='meta')
                with FlopCounterMode(display=False) as counter:
                    model(x)
            else:
                # Real parameters are wrapped as fake tensors on the fly; nothing is computed.
                with FakeTensorMode(allow_non_fake_inputs=True):
                    x = torch.empty((1,) + shape, device=device)
                    with FlopCounterMode(display=False) as counter:
                        model(x)
    finally:
        model.train(was_training)
    return counter.get_total_flops() / 1e9
