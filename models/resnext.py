"""3D ResNeXt (Xie et al., "Aggregated Residual Transformations for Deep Neural
Networks", CVPR 2017), as in 3D-ResNets-PyTorch.

Stage widths are [128, 256, 512, 1024] (the stem too) with a bottleneck
expansion of 2; the 3x3x3 conv is grouped into `cardinality` groups of a
mid width cardinality * planes // 32. The predecessor's builder crashed
(n_classes passed as widen_factor); this is the intended network.
"""
from typing import Optional

import torch.nn as nn

from .resnet import BOTTLENECK_DEPTHS, Bottleneck, ResNet, stage_layout

__all__ = ['ResNeXtBottleneck', 'generate_model', 'get_inplanes']


def get_inplanes() -> list:
    return [128, 256, 512, 1024]


class ResNeXtBottleneck(Bottleneck):
    """The bottleneck (same layers, keys and forward) with a grouped 3x3x3 conv."""
    expansion = 2

    def __init__(self, in_planes: int, planes: int, stride: int = 1, downsample: Optional[nn.Module] = None,
                 cardinality: int = 32):
        super().__init__(in_planes, planes, stride, downsample,
                         mid_planes=cardinality * planes // 32, groups=cardinality)


def generate_model(model_depth: int, *, cardinality: int = 32, **kwargs) -> ResNet:
    """kwargs: ResNet's stem, shortcut and head arguments (see resnet.generate_model)."""
    _, layers = stage_layout('resnext', model_depth, None, ResNeXtBottleneck, BOTTLENECK_DEPTHS)
    # The classifier sees 1024 * 2 features. The predecessor sized it cardinality * 32 * 2,
    # which is the same for the published cardinality 32 and a shape error otherwise.
    return ResNet(ResNeXtBottleneck, layers, get_inplanes(), block_kwargs={'cardinality': cardinality},
                  **kwargs)
