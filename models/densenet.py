"""3D DenseNet-BC (Huang et al., "Densely Connected Convolutional Networks",
CVPR 2017), as in 3D-ResNets-PyTorch (whose builder crashed on a keyword
mismatch; this is the intended network, with the same checkpoint keys).

`features` is an nn.Sequential with named children conv1, norm1, relu1, pool1,
denseblock1, transition1, ..., denseblock4, norm5; `classifier` is the Linear
head.
"""
from collections import OrderedDict
from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .resnet import check_depth, init_weights

__all__ = ['DenseNet', 'generate_model']


class DenseLayer(nn.Module):
    """BN-ReLU-conv1x1x1 (to bn_size * growth_rate) then BN-ReLU-conv3x3x3 (to
    growth_rate); the new features are concatenated to the input."""

    def __init__(self, num_input_features: int, growth_rate: int, bn_size: int, drop_rate: float = 0.0):
        super().__init__()
        self.norm1 = nn.BatchNorm3d(num_input_features)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv3d(num_input_features, bn_size * growth_rate, kernel_size=1, bias=False)
        self.norm2 = nn.BatchNorm3d(bn_size * growth_rate)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv3d(bn_size * growth_rate, growth_rate, kernel_size=3, padding=1, bias=False)
        self.drop_rate = drop_rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(self.relu1(self.norm1(x)))
        out = self.conv2(self.relu2(self.norm2(out)))
        if self.drop_rate > 0:
            out = F.dropout(out, p=self.drop_rate, training=self.training)
        return torch.cat([x, out], 1)


class DenseBlock(nn.Sequential):
    def __init__(self, num_layers: int, num_input_features: int, growth_rate: int, bn_size: int,
                 drop_rate: float = 0.0):
        super().__init__()
        for i in range(num_layers):
            layer = DenseLayer(num_input_features + i * growth_rate, growth_rate, bn_size, drop_rate)
            self.add_module(f'denselayer{i + 1}', layer)


class Transition(nn.Module):
    """BN-ReLU-conv1x1x1, then 2x2x2 average pooling (stride 2)."""

    def __init__(self, num_input_features: int, num_output_features: int):
        super().__init__()
        self.norm = nn.BatchNorm3d(num_input_features)
        self.relu = nn.ReLU(inplace=True)
        self.conv = nn.Conv3d(num_input_features, num_output_features, kernel_size=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(self.relu(self.norm(x)))
        # A dimension already down to 1 is left alone instead of failing ("output size is too
        # small"), so short clips (e.g. 8 frames) work; otherwise this is AvgPool3d(2, 2).
        kernel = [2 if size > 1 else 1 for size in x.shape[2:]]
        return F.avg_pool3d(x, kernel_size=kernel, stride=kernel)


class DenseNet(nn.Module):
    def __init__(
            self,
            growth_rate: int = 32,
            block_config: Sequence[int] = (6, 12, 24, 16),
            num_init_features: int = 64,
            bn_size: int = 4,
            drop_rate: float = 0.0,
            n_input_channels: int = 3,
            conv1_t_size: int = 7,
            conv1_t_stride: int = 1,
            no_max_pool: bool = False,
            n_classes: int = 400,
    ):
        super().__init__()
        stem = [
            ('conv1', nn.Conv3d(n_input_channels, num_init_features, kernel_size=(conv1_t_size, 7, 7),
                                stride=(conv1_t_stride, 2, 2), padding=(conv1_t_size // 2, 3, 3), bias=False)),
            ('norm1', nn.BatchNorm3d(num_init_features)),
            ('relu1', nn.ReLU(inplace=True)),
            ('pool1', nn.Identity() if no_max_pool else nn.MaxPool3d(kernel_size=3, stride=2, padding=1)),
        ]
        self.features = nn.Sequential(OrderedDict(stem))

        num_features = num_init_features
        for i, num_layers in enumerate(block_config):
            self.features.add_module(
                f'denseblock{i + 1}', DenseBlock(num_layers, num_features, growth_rate, bn_size, drop_rate))
            num_features += num_layers * growth_rate
            if i != len(block_config) - 1:
                # Compression 0.5 (the "C" in DenseNet-BC).
                self.features.add_module(f'transition{i + 1}', Transition(num_features, num_features // 2))
                num_features //= 2
        self.features.add_module('norm5', nn.BatchNorm3d(num_features))

        self.num_features = num_features
        self.classifier = nn.Linear(num_features, n_classes)

        init_weights(self)  # the ResNets' init, and (as in the predecessor) a zero classifier bias
        nn.init.constant_(self.classifier.bias, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.features(x), inplace=True)
        x = F.adaptive_avg_pool3d(x, 1)
        return self.classifier(torch.flatten(x, 1))


# depth -> (growth rate, layers per dense block, stem width)
DEPTH_CONFIGS = {
    121: (32, (6, 12, 24, 16), 64),
    169: (32, (6, 12, 32, 32), 64),
    201: (32, (6, 12, 48, 32), 64),
    264: (32, (6, 12, 64, 48), 64),
}


def generate_model(model_depth: int, **kwargs) -> DenseNet:
    """kwargs: DenseNet's stem and head arguments (n_input_channels, conv1_t_size,
    conv1_t_stride, no_max_pool, n_classes)."""
    check_depth('densenet', model_depth, DEPTH_CONFIGS)
    growth_rate, block_config, num_init_features = DEPTH_CONFIGS[model_depth]
    return DenseNet(growth_rate=growth_rate, block_config=block_config, num_init_features=num_init_features,
                    **kwargs)
