"""Wide 3D ResNet (Zagoruyko & Komodakis, "Wide Residual Networks", BMVC 2016),
as in 3D-ResNets-PyTorch: the bottleneck ResNet with every width (stem
included) multiplied by k and a bottleneck expansion of 2 instead of 4.
"""
import torch.nn as nn

from .resnet import BOTTLENECK_DEPTHS, Bottleneck, ResNet, get_inplanes, stage_layout

__all__ = ['WideBottleneck', 'generate_model']


class WideBottleneck(Bottleneck):
    expansion = 2


def generate_model(
        model_depth: int,
        *,
        k: int = 2,
        n_classes: int = 400,
        n_input_channels: int = 3,
        conv1_t_size: int = 7,
        conv1_t_stride: int = 1,
        no_max_pool: bool = False,
        shortcut_type: str = 'B',
) -> nn.Module:
    _, layers = stage_layout('wideresnet', model_depth, None, WideBottleneck, BOTTLENECK_DEPTHS)
    # int() so a fractional k (small test models) still gives integer widths.
    return ResNet(
        WideBottleneck, layers, [int(w * k) for w in get_inplanes()],
        n_input_channels=n_input_channels, conv1_t_size=conv1_t_size, conv1_t_stride=conv1_t_stride,
        no_max_pool=no_max_pool, shortcut_type=shortcut_type, n_classes=n_classes)
