"""R(2+1)D ResNet (Tran et al., "A Closer Look at Spatiotemporal Convolutions
for Action Recognition", CVPR 2018), as in 3D-ResNets-PyTorch.

Every 3x3x3 convolution is factorised into a (1, 3, 3) spatial conv, BN, ReLU
and a (3, 1, 1) temporal conv. The intermediate width is chosen so the pair
has about as many parameters as the 3D conv it replaces. Keys and shapes
match the predecessor's checkpoints.
"""
from typing import Optional

import torch
import torch.nn as nn

from .resnet import ResidualBlock, ResNet, conv1x1x1, get_inplanes, stage_layout

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


class BasicBlock2p1d(ResidualBlock):
    expansion = 1
    chain = (('conv1_s', 'bn1_s'), ('conv1_t', 'bn1_t'), ('conv2_s', 'bn2_s'), ('conv2_t', 'bn2_t'))

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



class Bottleneck2p1d(ResidualBlock):
    expansion = 4
    chain = (('conv1', 'bn1'), ('conv2_s', 'bn2_s'), ('conv2_t', 'bn2_t'), ('conv3', 'bn3'))

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



class ResNet2p1d(ResNet):
    """R(2+1)D ResNet: the ResNet with a factorised stem and (2+1)D blocks.
    Top-level children, in order: conv1_s, bn1_s, conv1_t, bn1_t, relu,
    maxpool, layer1..layer4, avgpool, fc."""

    def make_stem(self, n_input_channels: int, planes: int, t_size: int, t_stride: int) -> None:
        # Mid width as for a (t, 7, 7) conv. The predecessor computes it for 3 input
        # channels whatever n_input_channels is; kept so flow checkpoints load too.
        mid = (3 * planes * t_size * 49) // (3 * 49 + t_size * planes)
        self.conv1_s = nn.Conv3d(n_input_channels, mid, kernel_size=(1, 7, 7), stride=(1, 2, 2),
                                 padding=(0, 3, 3), bias=False)
        self.bn1_s = nn.BatchNorm3d(mid)
        self.conv1_t = nn.Conv3d(mid, planes, kernel_size=(t_size, 1, 1), stride=(t_stride, 1, 1),
                                 padding=(t_size // 2, 0, 0), bias=False)
        self.bn1_t = nn.BatchNorm3d(planes)

    def stem(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1_s(self.conv1_s(x)))
        return self.relu(self.bn1_t(self.conv1_t(x)))


def generate_model(model_depth: int, *, widen_factor: float = 1.0, **kwargs) -> ResNet2p1d:
    """kwargs: ResNet's stem, shortcut and head arguments (see resnet.generate_model)."""
    block, layers = stage_layout('resnet2p1d', model_depth, BasicBlock2p1d, Bottleneck2p1d)
    return ResNet2p1d(block, layers, get_inplanes(widen_factor), **kwargs)
