"""Starting a 3D ResNet from a 2D ImageNet ResNet (I3D's inflation, Carreira &
Zisserman, CVPR 2017): every k x k kernel is repeated over the 3D kernel's
temporal size and divided by it, so that on a static clip (one image repeated
over time) each 3D layer computes what the 2D layer computes on the image.
BatchNorm is copied and the classifier is left new.

The 2D file is a torchvision (or timm: the same key names) ResNet state dict.
Away from the temporal edges the property is exact; the first and last frames
see zero padding in part of the temporal kernel.
"""
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from models.resnet import STAGE_BLOCKS
from utils.checkpoint import load_checkpoint, strip_module_prefix
from utils.errors import CheckpointError, OptionError

__all__ = ['Inflation', 'refuse_family', 'load_2d_state_dict', 'depth_of_2d', 'check_depth_2d',
           'inflate_kernel', 'inflate_into']

INFLATABLE_FAMILIES = ('resnet', 'wideresnet', 'resnext')
REFUSED_FAMILIES = {
    'resnet2p1d': 'R(2+1)D cannot hold 2D kernels exactly: its mid widths (110 in the stem) are not '
                  'the 2D widths, and the BN + ReLU between each spatial and temporal conv breaks the '
                  'factorisation (MMAction2 does not inflate it either); inflate into --model resnet, '
                  'or start from a video checkpoint with --pretrain_path (e.g. --model r2plus1d_18 '
                  'with torchvision\'s Kinetics weights)',
    'preresnet': 'preresnet puts each BatchNorm before its conv, torchvision\'s ResNets after it: the '
                 'same shapes mean other things; inflate into --model resnet',
}
# Why torchvision's wide_resnet50_2 / resnext files never fit (checked against its builders).
LAYOUT_HINTS = {
    'wideresnet': 'this wideresnet keeps 3D-ResNets-PyTorch\'s layout, whose stem is 64 x k wide '
                  '(torchvision\'s wide_resnet50_2: 64)',
    'resnext': 'this resnext keeps 3D-ResNets-PyTorch\'s layout: a 128-wide stem (torchvision\'s: 64) '
               'and 4 channels per group (resnext101_32x8d: 8)',
}


@dataclass(frozen=True)
class Inflation:
    """Which tensors of the 3D network came from where: `inflated` are conv
    kernels repeated over time, `copied` taken as they are (BatchNorm),
    `new` keep their fresh initialisation (the classifier)."""
    inflated: tuple
    copied: tuple
    new: tuple
    kernel_kinds: tuple  # (('3x3 to 3x3x3', 16), ...)

    def summary(self, source):
        kinds = ', '.join(f'{n} {kind}' for kind, n in self.kernel_kinds)
        return (f'{source}: {len(self.inflated)} conv kernels inflated ({kinds}: each repeated over '
                f'time and divided by the temporal size), {len(self.copied)} BatchNorm tensors copied, '
                f'{len(self.new)} left new ({", ".join(self.new)})')


def refuse_family(model_name):
    """The families whose tensors cannot take a 2D ResNet's, refused before the file is read."""
    if model_name in REFUSED_FAMILIES:
        raise OptionError(f'--inflate_from with --model {model_name}: {REFUSED_FAMILIES[model_name]}')
    if model_name not in INFLATABLE_FAMILIES:
        raise OptionError(f'--inflate_from inflates 2D ResNets into --model resnet (also wideresnet and '
                          f'resnext where the shapes agree), not --model {model_name}')


def load_2d_state_dict(path):
    """The 2D network's tensors: a torch.save file (loaded with weights_only=True) of a
    state dict, bare or under 'state_dict' or 'model'; or a .safetensors file."""
    path = Path(path)
    state = _load_safetensors(path) if path.suffix == '.safetensors' else load_checkpoint(path)
    for key in ('state_dict', 'model'):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    if not isinstance(state, dict) or not state or \
            not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f'--inflate_from {path} holds no state dict (tensors by name, bare or under '
                              f'"state_dict" or "model"): save the 2D network with '
                              f'torch.save(model.state_dict(), path)')
    return strip_module_prefix(state)


def _load_safetensors(path):
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise CheckpointError(f'--inflate_from {path} is a .safetensors file and the safetensors package '
                              f'is not installed: pip install safetensors, or save the state dict with '
                              f'torch.save') from None
    if not path.is_file():
        raise CheckpointError(f'--inflate_from {path} does not exist: check the path')
    try:
        return load_file(str(path), device='cpu')
    except Exception as e:  # truncated or not a safetensors file
        raise CheckpointError(f'cannot read --inflate_from {path} as safetensors: {e}') from e


def depth_of_2d(state_2d):
    """(depth or None, blocks per stage, bottleneck?) told by a 2D ResNet's keys."""
    counts = []
    for stage in range(1, 5):
        prefix = f'layer{stage}.'
        indices = {k[len(prefix):].split('.')[0] for k in state_2d if k.startswith(prefix)}
        counts.append(max((int(i) + 1 for i in indices if i.isdigit()), default=0))
    bottleneck = 'layer1.0.conv3.weight' in state_2d
    for depth, layout in STAGE_BLOCKS.items():
        if tuple(counts) == layout and (depth >= 50) == bottleneck:
            return depth, tuple(counts), bottleneck
    return None, tuple(counts), bottleneck


def check_depth_2d(state_2d, model_depth, path):
    depth, counts, bottleneck = depth_of_2d(state_2d)
    if depth is None:
        block = 'bottleneck' if bottleneck else 'basic'
        raise OptionError(f'--inflate_from {path} is not a 2D ResNet of a depth built here ({block} blocks '
                          f'{counts} per stage; depths {", ".join(map(str, STAGE_BLOCKS))}): give a '
                          f'torchvision or timm ResNet state dict')
    if depth != model_depth:
        raise OptionError(f'--inflate_from {path} is a ResNet-{depth}; use --model_depth {depth} '
                          f'(not {model_depth})')


def inflate_kernel(kernel_2d, temporal_size):
    """(out, in, k, k) -> (out, in, t, k, k): the kernel repeated t times and
    divided by t, so a static input gives the 2D response."""
    return kernel_2d.unsqueeze(2).repeat(1, 1, temporal_size, 1, 1) / temporal_size


def _plan(own, state_2d, classifier):
    """Sorts the 3D network's keys into inflated, copied and new; returns the
    shape mismatches and the 2D keys that have no place here."""
    inflated, copied, new, mismatched = [], [], [], []
    for key, target in own.items():
        source = state_2d.get(key)
        if key.startswith(classifier):
            new.append(key)
        elif source is None:
            mismatched.append((key, None, tuple(target.shape)))
        elif source.dim() == 4 and target.dim() == 5 and \
                source.shape[:2] == target.shape[:2] and source.shape[2:] == target.shape[3:]:
            inflated.append(key)
        elif source.shape == target.shape:
            copied.append(key)
        else:
            mismatched.append((key, tuple(source.shape), tuple(target.shape)))
    unexpected = [k for k in state_2d if k not in own and not k.startswith(classifier)]
    return (inflated, copied, new), mismatched, unexpected


def _mismatch_line(source, model_name, mismatched, unexpected, own):
    if mismatched:
        key, there, here = mismatched[0]
        first = f'{key} is missing there' if there is None else f'{key} is {there} there, {here} here'
    else:
        (key, there, here), first = (unexpected[0], None, None), f'{unexpected[0]} has no place here'
    more = len(mismatched) + len(unexpected) - 1
    line = f'{source} does not fit --model {model_name}: {first}' + (f' (and {more} more)' if more else '')
    if model_name in LAYOUT_HINTS:
        return f'{line}; {LAYOUT_HINTS[model_name]}'
    if key == 'conv1.weight' and there is not None and there[1] != here[1]:
        return f'{line}; ImageNet weights take RGB: use --input_type rgb'
    if key == 'conv1.weight' and there is not None and there[0] != here[0]:
        return f'{line}; its stem is {there[0]} wide: use --resnet_widen_factor {there[0] / 64:g}'
    if any('downsample' in k for k in unexpected) and not any('downsample' in k for k in own):
        return f'{line}; it has downsample layers: use --resnet_shortcut B'
    return line


def inflate_into(model, state_2d, source, model_name, classifier='fc'):
    """Loads the 2D tensors into the 3D `model` (kernels inflated, BatchNorm
    copied, `classifier` left as initialised); nothing is loaded unless every
    other tensor fits. Returns the Inflation."""
    own = model.state_dict()
    (inflated, copied, new), mismatched, unexpected = _plan(own, state_2d, classifier + '.')
    if mismatched or unexpected:
        raise OptionError(_mismatch_line(source, model_name, mismatched, unexpected, own))
    weights = dict(own)
    kinds = Counter()
    for key in inflated:
        t, h, w = own[key].shape[2:]
        weights[key] = inflate_kernel(state_2d[key], t)
        kinds[f'{h}x{w} to {t}x{h}x{w}'] += 1
    for key in copied:
        weights[key] = state_2d[key]
    model.load_state_dict(weights, strict=True)
    return Inflation(tuple(inflated), tuple(copied), tuple(new), tuple(sorted(kinds.items())))
