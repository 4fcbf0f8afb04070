"""X3D (Feichtenhofer, "X3D: Expanding Architectures for Efficient Video
Recognition", CVPR 2020): a ResNet of bottleneck blocks whose 3x3x3 convolution
is channel-wise (depthwise), with squeeze-excitation in every other block and
Swish after it, expanded from a tiny base network in width, depth, clip length
and crop size.

State-dict keys and shapes equal those of PyTorchVideo's ``create_x3d`` as its
hub models x3d_xs/s/m/l build it, so the Kinetics-400 checkpoints it publishes
load with ``strict=True``; the module names are therefore PyTorchVideo's:
``blocks.0`` the stem, ``blocks.1``..``blocks.4`` the stages, ``blocks.5`` the
head with the classifier ``blocks.5.proj``. Two differences from it:
- the head pools globally (adaptive pooling), so any clip size runs; at the
  clip a size was built for this is the same average as PyTorchVideo's
  fixed-size pooling;
- the output is logits: PyTorchVideo's head ends in a softmax (create_x3d's
  head_activation), in training too.
"""
import math
from typing import Optional

import torch
import torch.nn as nn

from models.x3d_sizes import SIZES, X3D_CLIPS, X3DSize

__all__ = ['X3D', 'X3DSize', 'SIZES', 'X3D_CLIPS', 'CLASSIFIER', 'generate_model', 'sizes_matching']

CLASSIFIER = 'blocks.5.proj'
BASE_WIDTH = 12  # the stem's width before the width factor
BASE_DEPTHS = (1, 2, 5, 3)  # blocks per stage before the depth factor


def round_width(width: float, multiplier: float, divisor: int = 8) -> int:
    """width * multiplier to the nearest multiple of divisor (at least divisor,
    and at least 90 % of the exact value): X3D's (and PyTorchVideo's) rule."""
    exact = width * multiplier
    rounded = max(divisor, int(exact + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * exact else rounded


def stage_depths(depth_factor: float) -> list:
    return [math.ceil(depth_factor * d) for d in BASE_DEPTHS]


class SqueezeExcitation(nn.Module):
    """Channel weights from the globally pooled input: conv, ReLU, conv, sigmoid."""

    def __init__(self, channels: int, reduced: int):
        super().__init__()
        self.block = nn.Sequential(nn.Conv3d(channels, reduced, kernel_size=1), nn.ReLU(inplace=True),
                                   nn.Conv3d(reduced, channels, kernel_size=1), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.block(x.mean((2, 3, 4), keepdim=True))


class SpatialThenTemporalConv(nn.Module):
    """The stem's (1, 3, 3) convolution (stride (1, 2, 2)), then a depthwise (t, 1, 1) one.
    PyTorchVideo names them the other way round (conv_t is the spatial one); its keys kept."""

    def __init__(self, in_channels: int, out_channels: int, t_kernel: int = 5):
        super().__init__()
        self.conv_t = nn.Conv3d(in_channels, out_channels, kernel_size=(1, 3, 3), stride=(1, 2, 2),
                                padding=(0, 1, 1), bias=False)
        self.conv_xy = nn.Conv3d(out_channels, out_channels, kernel_size=(t_kernel, 1, 1),
                                 padding=(t_kernel // 2, 0, 0), groups=out_channels, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_xy(self.conv_t(x))


class X3DStem(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = SpatialThenTemporalConv(in_channels, out_channels)
        self.norm = nn.BatchNorm3d(out_channels)
        self.activation = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.norm(self.conv(x)))


class X3DBottleneck(nn.Module):
    """1x1x1 conv to `inner` channels, BN, ReLU; depthwise 3x3x3 conv (spatial
    stride), BN, squeeze-excitation (reduced to `se_channels`; 0: none), Swish;
    1x1x1 conv to `out_channels`, BN (zero-initialised: each block starts as the identity)."""

    def __init__(self, in_channels: int, inner: int, out_channels: int, stride: int, se_channels: int):
        super().__init__()
        self.conv_a = nn.Conv3d(in_channels, inner, kernel_size=1, bias=False)
        self.norm_a = nn.BatchNorm3d(inner)
        self.act_a = nn.ReLU(inplace=True)
        self.conv_b = nn.Conv3d(inner, inner, kernel_size=3, stride=(1, stride, stride), padding=1,
                                groups=inner, bias=False)
        se = SqueezeExcitation(inner, se_channels) if se_channels else nn.Identity()
        self.norm_b = nn.Sequential(nn.BatchNorm3d(inner), se)
        self.act_b = nn.SiLU()  # Swish: x * sigmoid(x)
        self.conv_c = nn.Conv3d(inner, out_channels, kernel_size=1, bias=False)
        self.norm_c = nn.BatchNorm3d(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act_a(self.norm_a(self.conv_a(x)))
        x = self.act_b(self.norm_b(self.conv_b(x)))
        return self.norm_c(self.conv_c(x))


class X3DBlock(nn.Module):
    """A residual block: the bottleneck (`branch2`) plus the shortcut, then ReLU.
    The shortcut is a strided 1x1x1 conv where the stride or width changes,
    with BN only where the width changes (as PyTorchVideo: the first stage's
    shortcut has none)."""

    def __init__(self, in_channels: int, inner: int, out_channels: int, stride: int, se_channels: int):
        super().__init__()
        needs_conv = in_channels != out_channels or stride > 1
        self.branch1_conv = nn.Conv3d(in_channels, out_channels, kernel_size=1, stride=(1, stride, stride),
                                      bias=False) if needs_conv else None
        self.branch1_norm = nn.BatchNorm3d(out_channels) if in_channels != out_channels else None
        self.branch2 = X3DBottleneck(in_channels, inner, out_channels, stride, se_channels)
        self.activation = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        if self.branch1_conv is not None:
            shortcut = self.branch1_conv(shortcut)
        if self.branch1_norm is not None:
            shortcut = self.branch1_norm(shortcut)
        return self.activation(shortcut + self.branch2(x))


class X3DStage(nn.Module):
    """`depth` blocks; the first one halves H and W, every other one (the 1st, 3rd, ...) has SE."""

    def __init__(self, depth: int, in_channels: int, inner: int, out_channels: int, se_ratio: float):
        super().__init__()
        se_channels = round_width(inner, se_ratio) if se_ratio > 0 else 0
        self.res_blocks = nn.ModuleList(
            X3DBlock(in_channels if i == 0 else out_channels, inner, out_channels, stride=2 if i == 0 else 1,
                     se_channels=se_channels if i % 2 == 0 else 0)
            for i in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.res_blocks:
            x = block(x)
        return x


class ProjectedPool(nn.Module):
    """1x1x1 conv, BN, ReLU; global average pooling; 1x1x1 conv to the feature width, ReLU."""

    def __init__(self, in_channels: int, inner: int, out_channels: int):
        super().__init__()
        self.pre_conv = nn.Conv3d(in_channels, inner, kernel_size=1, bias=False)
        self.pre_norm = nn.BatchNorm3d(inner)
        self.pre_act = nn.ReLU(inplace=True)
        self.pool = nn.AdaptiveAvgPool3d(1)  # PyTorchVideo: an AvgPool3d sized for one clip size
        self.post_conv = nn.Conv3d(inner, out_channels, kernel_size=1, bias=False)
        self.post_act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.pre_act(self.pre_norm(self.pre_conv(x))))
        return self.post_act(self.post_conv(x))


class X3DHead(nn.Module):
    def __init__(self, in_channels: int, inner: int, features: int, n_classes: int, dropout: float):
        super().__init__()
        self.pool = ProjectedPool(in_channels, inner, features)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.proj = nn.Linear(features, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Logits: PyTorchVideo applies a softmax here.
        return self.proj(self.dropout(torch.flatten(self.pool(x), 1)))


class X3D(nn.Module):
    """Stem (spatial stride 2), four stages (spatial stride 2 each, no temporal
    stride), head; all in ``blocks`` (an nn.ModuleList), whose entries
    fine-tuning names blocks.0 .. blocks.5.

    width_factor scales every width (the stem's 12 and the stages' 12, 24, 48,
    96), depth_factor the stages' 1, 2, 5, 3 blocks; bottleneck_factor gives
    the bottlenecks' inner width, se_ratio the squeeze-excitation's reduced
    width (0: no SE), head_width the features the classifier reads.
    """

    def __init__(self, n_classes: int = 400, n_input_channels: int = 3, width_factor: float = 2.0,
                 depth_factor: float = 2.2, bottleneck_factor: float = 2.25, se_ratio: float = 0.0625,
                 head_width: int = 2048, dropout: float = 0.5):
        super().__init__()
        in_channels = round_width(BASE_WIDTH, width_factor)
        blocks = [X3DStem(n_input_channels, in_channels)]
        for i, depth in enumerate(stage_depths(depth_factor)):
            out_channels = round_width(BASE_WIDTH * 2 ** i, width_factor)
            inner = int(bottleneck_factor * out_channels)
            blocks.append(X3DStage(depth, in_channels, inner, out_channels, se_ratio))
            in_channels = out_channels
        blocks.append(X3DHead(in_channels, inner, head_width, n_classes, dropout))
        self.blocks = nn.ModuleList(blocks)
        self.num_features = head_width
        init_weights(self)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks[:-1]:
            x = block(x)
        return x

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[-1](x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


def init_weights(model: X3D) -> None:
    """PyTorchVideo's: Kaiming-normal (fan_out) convs with zero bias, BN weight 1 and
    bias 0 but the last BN of each bottleneck at weight 0, the classifier N(0, 0.01)."""
    for m in model.modules():
        if isinstance(m, nn.Conv3d):
            nn.init.kaiming_normal_(m.weight, mode='fan_out', nonlinearity='relu')
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm3d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.01)
            nn.init.zeros_(m.bias)
    for m in model.modules():
        if isinstance(m, X3DBottleneck):
            nn.init.zeros_(m.norm_c.weight)


def generate_model(size: str = 's', *, n_classes: int = 400, n_input_channels: int = 3,
                   dropout: float = 0.5) -> X3D:
    """X3D-XS, -S, -M or -L; XS, S and M are one network (they differ in the clip it sees)."""
    if size not in SIZES:
        raise ValueError(f'X3D size must be one of {tuple(SIZES)}, got {size!r}')
    return X3D(n_classes=n_classes, n_input_channels=n_input_channels,
               depth_factor=SIZES[size].depth_factor, dropout=dropout)


def sizes_matching(state_dict: dict) -> Optional[tuple]:
    """The sizes whose network has as many blocks in each stage as `state_dict`
    (None: not an X3D state dict): a hint for a mismatched checkpoint."""
    depths = [len({k.split('.')[3] for k in state_dict if k.startswith(f'blocks.{i}.res_blocks.')})
              for i in range(1, 5)]
    if not all(depths):
        return None
    return tuple(s for s, spec in SIZES.items() if stage_depths(spec.depth_factor) == depths)
