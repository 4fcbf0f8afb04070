"""Wide 3D ResNet (Zagoruyko & Komodakis, "Wide Residual Networks", BMVC 2016),
as in 3D-ResNets-PyTorch: the bottleneck ResNet with every width (stem
included) multiplied by k and a bottleneck expansion of 2 instead of 4.
"""
from .resnet import BOTTLENECK_DEPTHS, Bottleneck, ResNet, get_inplanes, stage_layout

__all__ = ['WideBottleneck', 'generate_model']


class WideBottleneck(Bottleneck):
    expansion = 2


def generate_model(model_depth: int, *, k: float = 2, **kwargs) -> ResNet:
    """kwargs: ResNet's stem, shortcut and head arguments (see resnet.generate_model)."""
    _, layers = stage_layout('wideresnet', model_depth, None, WideBottleneck, BOTTLENECK_DEPTHS)
    return ResNet(WideBottleneck, layers, get_inplanes(k), **kwargs)
