"""torchvision's video classifiers behind the same builder interface as the
other families, so torchvision's published Kinetics-400 weights (the usual
starting point) can be fine-tuned here.

The networks are torchvision's own modules, built with weights=None (nothing
is downloaded), so a state_dict of e.g. ``torchvision.models.video.r3d_18()``
loads with ``strict=True``. All take (N, C, T, H, W) input.

Notes:
- s3d: torchvision pools with a fixed AvgPool3d((2, 7, 7)), which only fits
  inputs of at least 16x224x224. It is replaced by global average pooling:
  identical output at 16x224x224, and smaller clips work.
- mvit_v2_s: its relative position tables are built for exactly 16x224x224
  clips; other sizes fail inside torchvision.
"""
import torch.nn as nn
import torchvision

__all__ = ['TORCHVISION_MODELS', 'classifier_name', 'generate_model']

# name -> attribute path of the final classification layer
_CLASSIFIERS = {
    'r3d_18': 'fc',
    'mc3_18': 'fc',
    'r2plus1d_18': 'fc',
    's3d': 'classifier.1',  # a 1x1x1 Conv3d (logits are averaged over positions afterwards)
    'mvit_v2_s': 'head.1',
    'swin3d_t': 'head',
}
TORCHVISION_MODELS = tuple(_CLASSIFIERS)


def classifier_name(name: str) -> str:
    """Attribute path of the final classification layer of torchvision model `name`
    (nn.Linear, except s3d's 1x1x1 nn.Conv3d); use with get/set_submodule to replace it."""
    if name not in _CLASSIFIERS:
        raise ValueError(f'unknown torchvision video model {name!r}; choose from {TORCHVISION_MODELS}')
    return _CLASSIFIERS[name]


def _replace_input_conv(model: nn.Module, n_input_channels: int) -> None:
    # The first Conv3d is the one reading the clip (stem.0, features.0.0.0, conv_proj, patch_embed.proj).
    name, conv = next((n, m) for n, m in model.named_modules() if isinstance(m, nn.Conv3d))
    new = nn.Conv3d(n_input_channels, conv.out_channels, kernel_size=conv.kernel_size, stride=conv.stride,
                    padding=conv.padding, dilation=conv.dilation, groups=conv.groups,
                    bias=conv.bias is not None, device=conv.weight.device, dtype=conv.weight.dtype)
    nn.init.kaiming_normal_(new.weight, mode='fan_out', nonlinearity='relu')
    if new.bias is not None:
        nn.init.zeros_(new.bias)
    model.set_submodule(name, new)


def generate_model(name: str, *, n_classes: int = 400, n_input_channels: int = 3) -> nn.Module:
    if name not in _CLASSIFIERS:
        raise ValueError(f'unknown torchvision video model {name!r}; choose from {TORCHVISION_MODELS}')
    model = getattr(torchvision.models.video, name)(weights=None, num_classes=n_classes)
    if n_input_channels != 3:
        _replace_input_conv(model, n_input_channels)
    if name == 's3d':
        model.avgpool = nn.AdaptiveAvgPool3d(1)
    return model
