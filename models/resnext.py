"""3D ResNeXt (Xie et al., "Aggregated Residual Transformations for Deep Neural
Networks", CVPR 2017), as in 3D-ResNets-PyTorch.

Stage widths are [128, 256, 512, 1024] (the stem too) with a bottleneck
expansion of 2; the 3x3x3 conv is grouped into `cardinality` groups of a
mid width cardinality * planes // 32. The predecessor's builder crashed
(n_classes passed as widen_factor); this is the intended network.
"""
from typing import Optional

import torch
import torch.nn as nn

from .resnet import BOTTLENECK_DEPTHS, ResNet, conv1x1x1, stage_layout

__all__ = ['ResNeXtBottleneck', 'generate_model', 'get_inplanes']


def get_inplanes() -> list:
    return [128, 256, 512, 1024]


class ResNeXtBottleneck(nn.Module):
    expansion = 2

    def __init__(self, in_planes: int, planes: int, stride: int = 1, downsample: Optional[nn.Module] = None,
                 cardinality: int = 32):
        super().__init__()
        mid_planes = cardinality * planes // 32
        self.conv1 = conv1x1x1(in_planes, mid_planes)
        self.bn1 = nn.BatchNorm3d(mid_planes)
        self.conv2 = nn.Conv3d(mid_planes, mid_planes, kernel_size=3, stride=stride, padding=1,
                               groups=cardinality, bias=False)
        self.bn2 = nn.BatchNorm3d(mid_planes)
        self.conv3 = conv1x1x1(mid_planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm3d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += shortcut
        return self.relu(out)


def generate_model(
        model_depth: int,
        *,
        cardinality: int = 32,
        n_classes: int = 400,
        n_input_channels: int = 3,
        conv1_t_size: int = 7,
        conv1_t_stride: int = 1,
        no_max_pool: bool = False,
        shortcut_type: str = 'B',
) -> nn.Module:
    _, layers = stage_layout('resnext', model_depth, None, ResNeXtBottleneck, BOTTLENECK_DEPTHS)
    # The classifier sees 1024 * 2 features. The predecessor sized it cardinality * 32 * 2,
    # which is the same for the published cardinality 32 and a shape error otherwise.
    return ResNet(
        ResNeXtBottleneck, layers, get_inplanes(),
        n_input_channels=n_input_channels, conv1_t_size=conv1_t_size, conv1_t_stride=conv1_t_stride,
        no_max_pool=no_max_pool, shortcut_type=shortcut_type, n_classes=n_classes,
        block_kwargs={'cardinality': cardinality})
