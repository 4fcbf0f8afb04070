"""R(2+1)D ResNet (Tran et al., "A Closer Look at Spatiotemporal Convolutions
for Action Recognition", CVPR 2018), as in 3D-ResNets-PyTorch.

Every 3x3x3 convolution is factorised into a (1, 3, 3) spatial conv, BN, ReLU
and a (3, 1, 1) temporal conv. The intermediate width is chosen so the pair
has about as many parameters as the 3D conv it replaces. Keys and shapes
match the predecessor's checkpoints.
"""
from typing import Optional, Sequence

import torch
import torch.nn as nn

from .resnet import conv1x1x1, get_inplanes, init_weights, make_layer

__all__ = ['ResNet2p1d', 'BasicBlock2p1d', 'Bottleneck2p1d', 'generate_model']


def conv1x3x3(in_planes: int, mid_planes: int, stride: int = 1) -> nn.Conv3d:
    return nn.Conv3d(in_planes, mid_planes, kernel_size=(1, 3, 3), stride=(1, stride, stride),
                     padding=(0, 1, 1), bias=False)


def conv3x1x1(mid_planes: int, planes: int, stride: int = 1) -> nn.Conv3d:
    return nn.Conv3d(mid_planes, planes, kernel_size=(3, 1, 1), stride=(stride, 1, 1),
                     padding=(1, 0, 0), bias=False)


def mid_planes_3x3x3(in_planes: int, out_planes: int) -> int:
    # in*out*27 weights of the 3D conv == in*9*mid + mid*3*out weights of the (2+1)D pair.
    return (in_planes * out_planes * 27) // (in_planes * 9 + 3 * out_planes)


class BasicBlock2p1d(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1, downsample: Optional[nn.Module] = None):
        super().__init__()
        mid1 = mid_planes_3x3x3(in_planes, planes)
        self.conv1_s = conv1x3x3(in_planes, mid1, stride)
        self.bn1_s = nn.BatchNorm3d(mid1)
        self.conv1_t = conv3x1x1(mid1, planes, stride)
        self.bn1_t = nn.BatchNorm3d(planes)
        mid2 = mid_planes_3x3x3(planes, planes)
        self.conv2_s = conv1x3x3(planes, mid2)
        self.bn2_s = nn.BatchNorm3d(mid2)
        self.conv2_t = conv3x1x1(mid2, planes)
        self.bn2_t = nn.BatchNorm3d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1_s(self.conv1_s(x)))
        out = self.relu(self.bn1_t(self.conv1_t(out)))
        out = self.relu(self.bn2_s(self.conv2_s(out)))
        out = self.bn2_t(self.conv2_t(out))
        out += shortcut
        return self.relu(out)


class Bottleneck2p1d(nn.Module):
    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1, downsample: Optional[nn.Module] = None):
        super().__init__()
        self.conv1 = conv1x1x1(in_planes, planes)
        self.bn1 = nn.BatchNorm3d(planes)
        mid = mid_planes_3x3x3(planes, planes)
        self.conv2_s = conv1x3x3(planes, mid, stride)
        self.bn2_s = nn.BatchNorm3d(mid)
        self.conv2_t = conv3x1x1(mid, planes, stride)
        self.bn2_t = nn.BatchNorm3d(planes)
        self.conv3 = conv1x1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm3d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2_s(self.conv2_s(out)))
        out = self.relu(self.bn2_t(self.conv2_t(out)))
        out = self.bn3(self.conv3(out))
        out += shortcut
        return self.relu(out)


class ResNet2p1d(nn.Module):
    """R(2+1)D ResNet. Top-level children, in order: conv1_s, bn1_s, conv1_t,
    bn1_t, relu, maxpool, layer1..layer4, avgpool, fc."""

    def __init__(
            self,
            block: type,
            layers: Sequence[int],
            block_inplanes: Sequence[int],
            n_input_channels: int = 3,
            conv1_t_size: int = 7,
            conv1_t_stride: int = 1,
            no_max_pool: bool = False,
            shortcut_type: str = 'B',
            n_classes: int = 400,
    ):
        super().__init__()
        in_planes = block_inplanes[0]
        # Stem mid width as for a (t, 7, 7) conv. The predecessor computes it for 3 input
        # channels whatever n_input_channels is; kept so flow checkpoints load too.
        mid = (3 * in_planes * conv1_t_size * 49) // (3 * 49 + conv1_t_size * in_planes)
        self.conv1_s = nn.Conv3d(n_input_channels, mid, kernel_size=(1, 7, 7), stride=(1, 2, 2),
                                 padding=(0, 3, 3), bias=False)
        self.bn1_s = nn.BatchNorm3d(mid)
        self.conv1_t = nn.Conv3d(mid, in_planes, kernel_size=(conv1_t_size, 1, 1), stride=(conv1_t_stride, 1, 1),
                                 padding=(conv1_t_size // 2, 0, 0), bias=False)
        self.bn1_t = nn.BatchNorm3d(in_planes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.Identity() if no_max_pool else nn.MaxPool3d(kernel_size=3, stride=2, padding=1)

        for i, (planes, n_blocks) in enumerate(zip(block_inplanes, layers)):
            stage = make_layer(block, in_planes, planes, n_blocks, stride=1 if i == 0 else 2,
                               shortcut_type=shortcut_type)
            self.add_module(f'layer{i + 1}', stage)
            in_planes = planes * block.expansion

        self.avgpool = nn.AdaptiveAvgPool3d(1)
        self.num_features = in_planes
        self.fc = nn.Linear(in_planes, n_classes)

        init_weights(self)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1_s(self.conv1_s(x)))
        x = self.maxpool(self.relu(self.bn1_t(self.conv1_t(x))))
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        return self.layer4(x)

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.avgpool(x), 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


_DEPTHS = {
    10: (BasicBlock2p1d, (1, 1, 1, 1)),
    18: (BasicBlock2p1d, (2, 2, 2, 2)),
    34: (BasicBlock2p1d, (3, 4, 6, 3)),
    50: (Bottleneck2p1d, (3, 4, 6, 3)),
    101: (Bottleneck2p1d, (3, 4, 23, 3)),
    152: (Bottleneck2p1d, (3, 8, 36, 3)),
    200: (Bottleneck2p1d, (3, 24, 36, 3)),
}


def generate_model(
        model_depth: int,
        *,
        n_classes: int = 400,
        n_input_channels: int = 3,
        conv1_t_size: int = 7,
        conv1_t_stride: int = 1,
        no_max_pool: bool = False,
        shortcut_type: str = 'B',
        widen_factor: float = 1.0,
) -> ResNet2p1d:
    if model_depth not in _DEPTHS:
        raise ValueError(f'resnet2p1d depth must be one of {sorted(_DEPTHS)}, got {model_depth}')
    block, layers = _DEPTHS[model_depth]
    return ResNet2p1d(
        block, layers, [int(w * widen_factor) for w in get_inplanes()],
        n_input_channels=n_input_channels, conv1_t_size=conv1_t_size, conv1_t_stride=conv1_t_stride,
        no_max_pool=no_max_pool, shortcut_type=shortcut_type, n_classes=n_classes)
