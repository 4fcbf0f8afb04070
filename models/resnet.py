"""3D ResNet (Hara et al., "Can Spatiotemporal 3D CNNs Retrace the History of
2D CNNs and ImageNet?", CVPR 2018).

State-dict keys and shapes match the checkpoints published for
3D-ResNets-PyTorch, so they load with ``strict=True``.

This file also holds the pieces shared by the other ResNet-style families
(pre-activation, wide, ResNeXt, R(2+1)D): the network with its stem and
classifier arguments, the bottleneck block (wide and ResNeXt subclass it),
the type-A shortcut, the layer builder and the weight initialisation.
"""
from typing import Callable, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ['ResNet', 'ResidualBlock', 'BasicBlock', 'Bottleneck', 'ZeroPadShortcut', 'generate_model', 'get_inplanes',
           'STAGE_BLOCKS', 'BOTTLENECK_DEPTHS', 'stage_layout', 'check_depth', 'DepthError']


def get_inplanes(widen_factor: float = 1.0) -> list:
    """Widths of layer1..layer4 (the stem has the first): 64, 128, 256, 512 times
    widen_factor, int() so that a fractional factor (small test models) gives whole widths."""
    return [int(w * widen_factor) for w in (64, 128, 256, 512)]


def conv3x3x3(in_planes: int, out_planes: int, stride: int = 1, groups: int = 1) -> nn.Conv3d:
    return nn.Conv3d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, groups=groups,
                     bias=False)


def conv1x1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv3d:
    return nn.Conv3d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class ZeroPadShortcut(nn.Module):
    """Parameter-free shortcut (type A): subsample by `stride` in T, H and W,
    then append zero channels up to `out_planes`.

    Unlike the predecessor it neither detaches the input (gradients flow
    through the shortcut) nor hard-codes a device: the zeros are created by
    F.pad and so follow the input's device, dtype and autocast state.
    """

    def __init__(self, out_planes: int, stride: int = 1):
        super().__init__()
        self.out_planes = out_planes
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride != 1:
            # Same result as avg_pool3d(x, kernel_size=1, stride=stride), without a kernel call.
            s = self.stride
            x = x[:, :, ::s, ::s, ::s]
        # F.pad pads from the last dim backwards: (W, H, T, C) -> zeros after the existing channels.
        return F.pad(x, (0, 0, 0, 0, 0, 0, 0, self.out_planes - x.shape[1]))

    def extra_repr(self) -> str:
        return f'out_planes={self.out_planes}, stride={self.stride}'


def make_shortcut(in_planes: int, out_planes: int, stride: int, shortcut_type: str) -> Optional[nn.Module]:
    """Shortcut for a block whose stride or width changes; None keeps the identity."""
    if stride == 1 and in_planes == out_planes:
        return None
    if shortcut_type == 'A':
        return ZeroPadShortcut(out_planes, stride)
    if shortcut_type == 'B':
        return nn.Sequential(conv1x1x1(in_planes, out_planes, stride), nn.BatchNorm3d(out_planes))
    raise ValueError(f"shortcut_type must be 'A' or 'B', got {shortcut_type!r}")


def make_layer(
        block: Callable[..., nn.Module],
        in_planes: int,
        planes: int,
        blocks: int,
        stride: int,
        shortcut_type: str,
        block_kwargs: Optional[dict] = None,
) -> nn.Sequential:
    """A stage of `blocks` residual blocks; only the first one strides or changes width."""
    block_kwargs = block_kwargs or {}
    out_planes = planes * block.expansion
    layers = [block(in_planes, planes, stride=stride,
                    downsample=make_shortcut(in_planes, out_planes, stride, shortcut_type), **block_kwargs)]
    for _ in range(1, blocks):
        layers.append(block(out_planes, planes, **block_kwargs))
    return nn.Sequential(*layers)


def init_weights(module: nn.Module) -> None:
    """Predecessor's init: Kaiming-normal (fan_out, ReLU) convs, BN weight 1 and bias 0.
    Linear layers keep PyTorch's default init."""
    for m in module.modules():
        if isinstance(m, nn.Conv3d):
            nn.init.kaiming_normal_(m.weight, mode='fan_out', nonlinearity='relu')
        elif isinstance(m, nn.BatchNorm3d):
            nn.init.constant_(m.weight, 1)
            nn.init.constant_(m.bias, 0)


class ResidualBlock(nn.Module):
    """A residual block run from the names of its (conv, BN) pairs, in order
    (`chain`), so that every ResNet-style block shares one forward: conv -> BN
    -> ReLU, the last ReLU after the shortcut is added; or, pre-activation,
    BN -> ReLU -> conv with no ReLU after the addition. Each block registers
    its layers itself, in its checkpoints' key order."""
    chain: tuple = ()
    pre_activation = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = x
        for i, (conv, bn) in enumerate(self.chain):
            conv, bn = getattr(self, conv), getattr(self, bn)
            if self.pre_activation:
                out = conv(self.relu(bn(out)))
            else:
                out = bn(conv(out))
                out = self.relu(out) if i < len(self.chain) - 1 else out
        if self.pre_activation:
            return out + shortcut
        out += shortcut
        return self.relu(out)


class BasicBlock(ResidualBlock):
    expansion = 1
    chain = (('conv1', 'bn1'), ('conv2', 'bn2'))

    def __init__(self, in_planes: int, planes: int, stride: int = 1, downsample: Optional[nn.Module] = None):
        super().__init__()
        self.conv1 = conv3x3x3(in_planes, planes, stride)
        self.bn1 = nn.BatchNorm3d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3x3(planes, planes)
        self.bn2 = nn.BatchNorm3d(planes)
        self.downsample = downsample



class Bottleneck(ResidualBlock):
    """1x1x1 conv to mid_planes (default planes), 3x3x3 conv (stride, in `groups` groups),
    1x1x1 conv to planes * expansion. ResNeXt's block sets mid_planes and groups."""
    expansion = 4
    chain = (('conv1', 'bn1'), ('conv2', 'bn2'), ('conv3', 'bn3'))

    def __init__(self, in_planes: int, planes: int, stride: int = 1, downsample: Optional[nn.Module] = None,
                 mid_planes: Optional[int] = None, groups: int = 1):
        super().__init__()
        mid_planes = planes if mid_planes is None else mid_planes
        self.conv1 = conv1x1x1(in_planes, mid_planes)
        self.bn1 = nn.BatchNorm3d(mid_planes)
        self.conv2 = conv3x3x3(mid_planes, mid_planes, stride, groups)
        self.bn2 = nn.BatchNorm3d(mid_planes)
        self.conv3 = conv1x1x1(mid_planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm3d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample



class ResNet(nn.Module):
    """3D ResNet: stem, four stages (strides 1, 2, 2, 2 in T, H and W), global
    average pooling and a linear classifier `fc`.

    The stem is a (t, 7, 7) conv with stride (t_stride, 2, 2) followed by BN, ReLU
    and a 3x3x3 max-pool (stride 2) unless `no_max_pool`. Top-level children are,
    in order: conv1, bn1, relu, maxpool, layer1..layer4, avgpool, fc; fine-tuning
    freezes a prefix of them by name.

    The stem, shortcut and classifier arguments are declared here only: every
    ResNet-style family's generate_model passes them on as keyword arguments.
    """

    def __init__(
            self,
            block: Callable[..., nn.Module],
            layers: Sequence[int],
            block_inplanes: Sequence[int],
            n_input_channels: int = 3,
            conv1_t_size: int = 7,
            conv1_t_stride: int = 1,
            no_max_pool: bool = False,
            shortcut_type: str = 'B',
            n_classes: int = 400,
            block_kwargs: Optional[dict] = None,
    ):
        super().__init__()
        in_planes = block_inplanes[0]
        self.make_stem(n_input_channels, in_planes, conv1_t_size, conv1_t_stride)
        self.relu = nn.ReLU(inplace=True)
        # Identity rather than a skipped module keeps forward() and the child list uniform.
        self.maxpool = nn.Identity() if no_max_pool else nn.MaxPool3d(kernel_size=3, stride=2, padding=1)

        for i, (planes, n_blocks) in enumerate(zip(block_inplanes, layers)):
            stage = make_layer(block, in_planes, planes, n_blocks, stride=1 if i == 0 else 2,
                               shortcut_type=shortcut_type, block_kwargs=block_kwargs)
            self.add_module(f'layer{i + 1}', stage)
            in_planes = planes * block.expansion

        # Adaptive pooling: any clip size works (short clips, 'nocrop' inference).
        self.avgpool = nn.AdaptiveAvgPool3d(1)
        self.num_features = in_planes
        self.fc = nn.Linear(in_planes, n_classes)

        init_weights(self)

    def make_stem(self, n_input_channels: int, planes: int, t_size: int, t_stride: int) -> None:
        """The first convolution and its BN (registered first: state_dict key order)."""
        self.conv1 = nn.Conv3d(
            n_input_channels, planes, kernel_size=(t_size, 7, 7),
            stride=(t_stride, 2, 2), padding=(t_size // 2, 3, 3), bias=False)
        self.bn1 = nn.BatchNorm3d(planes)

    def stem(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn1(self.conv1(x)))

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.stem(x))
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        return self.layer4(x)

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.avgpool(x), 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


# Residual blocks per stage for each depth, shared by every ResNet-style family.
STAGE_BLOCKS = {
    10: (1, 1, 1, 1),
    18: (2, 2, 2, 2),
    34: (3, 4, 6, 3),
    50: (3, 4, 6, 3),
    101: (3, 4, 23, 3),
    152: (3, 8, 36, 3),
    200: (3, 24, 36, 3),
}


BOTTLENECK_DEPTHS = (50, 101, 152, 200)  # wideresnet and resnext exist only at these


class DepthError(ValueError):
    """A family asked for a depth it does not have; `depths` lists those it has."""

    def __init__(self, family: str, model_depth: int, depths):
        self.depths = tuple(sorted(depths))
        super().__init__(f'{family} depth must be one of {self.depths}, got {model_depth}')


def check_depth(family: str, model_depth: int, depths) -> None:
    """The one depth check of every family (model.py turns it into an option error)."""
    if model_depth not in depths:
        raise DepthError(family, model_depth, depths)


def stage_layout(family: str, model_depth: int, basic, bottleneck, depths=tuple(STAGE_BLOCKS)):
    """(block, blocks per stage) of `model_depth`: the basic block below 50 layers,
    the bottleneck from 50 on."""
    check_depth(family, model_depth, depths)
    return (basic if model_depth < 50 else bottleneck), STAGE_BLOCKS[model_depth]


def generate_model(model_depth: int, *, widen_factor: float = 1.0, **kwargs) -> ResNet:
    """kwargs: ResNet's stem, shortcut and head arguments (n_input_channels, conv1_t_size,
    conv1_t_stride, no_max_pool, shortcut_type, n_classes); every ResNet-style family passes
    them on like this."""
    block, layers = stage_layout('resnet', model_depth, BasicBlock, Bottleneck)
    return ResNet(block, layers, get_inplanes(widen_factor), **kwargs)
