"""Pre-activation 3D ResNet (He et al., "Identity Mappings in Deep Residual
Networks", ECCV 2016) on the ResNet stem, as in 3D-ResNets-PyTorch.

Blocks run BN -> ReLU -> conv; the shortcut takes the block's raw input and
there is no ReLU after the addition. As in the predecessor (whose builder
crashed; the key lists are those of the intended network) there is no final
BN/ReLU before pooling, so its checkpoints' keys match exactly.
"""
from typing import Optional

import torch.nn as nn

from .resnet import ResidualBlock, ResNet, conv1x1x1, conv3x3x3, get_inplanes, stage_layout

__all__ = ['PreActBasicBlock', 'PreActBottleneck', 'generate_model']


class PreActBasicBlock(ResidualBlock):
    expansion = 1
    chain = (('conv1', 'bn1'), ('conv2', 'bn2'))
    pre_activation = True

    def __init__(self, in_planes: int, planes: int, stride: int = 1, downsample: Optional[nn.Module] = None):
        super().__init__()
        # Registration order bn1, conv1, bn2, conv2 is the checkpoint key order.
        self.bn1 = nn.BatchNorm3d(in_planes)
        self.conv1 = conv3x3x3(in_planes, planes, stride)
        self.bn2 = nn.BatchNorm3d(planes)
        self.conv2 = conv3x3x3(planes, planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample



class PreActBottleneck(ResidualBlock):
    expansion = 4
    chain = (('conv1', 'bn1'), ('conv2', 'bn2'), ('conv3', 'bn3'))
    pre_activation = True

    def __init__(self, in_planes: int, planes: int, stride: int = 1, downsample: Optional[nn.Module] = None):
        super().__init__()
        self.bn1 = nn.BatchNorm3d(in_planes)
        self.conv1 = conv1x1x1(in_planes, planes)
        self.bn2 = nn.BatchNorm3d(planes)
        self.conv2 = conv3x3x3(planes, planes, stride)
        self.bn3 = nn.BatchNorm3d(planes)
        self.conv3 = conv1x1x1(planes, planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample



def generate_model(model_depth: int, *, widen_factor: float = 1.0, **kwargs) -> ResNet:
    """kwargs: ResNet's stem, shortcut and head arguments (see resnet.generate_model)."""
    block, layers = stage_layout('preresnet', model_depth, PreActBasicBlock, PreActBottleneck)
    return ResNet(block, layers, get_inplanes(widen_factor), **kwargs)
