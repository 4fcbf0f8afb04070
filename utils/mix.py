"""Batch-level mixup and cutmix for video clips (Zhang et al. 2018, Yun et al. 2019).

One mixing coefficient per batch, as timm's 'batch' mode: each clip is paired
with its mirror in the per-process batch (clip i with clip N-1-i). Cutmix
pastes one spatial box, the same for every frame of a clip, so the pasted
region moves with neither time nor frame. The targets become class
probabilities, ``lam * onehot(y) + (1 - lam) * onehot(y_pair)``, with ``lam``
corrected to the pasted area; CrossEntropyLoss takes them as they are (and
applies its own label smoothing on top).

Random numbers come from a numpy Generator the caller seeds (per rank and
epoch), so a resumed run draws what the uninterrupted one drew.
"""
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class MixConfig:
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    prob: float = 1.0  # chance that a batch is mixed at all
    switch_prob: float = 0.5  # chance of cutmix instead of mixup when both are on

    @property
    def enabled(self):
        return (self.mixup_alpha > 0 or self.cutmix_alpha > 0) and self.prob > 0


@dataclass
class MixedBatch:
    clips: torch.Tensor
    targets: torch.Tensor  # (N, n_classes) probabilities, or the (N,) labels when unmixed
    dominant: torch.Tensor  # (N,) the label with the larger share, for the accuracy
    lam: float


def cutmix_box(height, width, lam, rng):
    """(top, bottom, left, right) of a box of area about (1 - lam) * H * W,
    its centre uniform over the frame and clipped at the borders."""
    cut = np.sqrt(1.0 - lam)
    cut_h, cut_w = int(height * cut), int(width * cut)
    cy, cx = int(rng.integers(height)), int(rng.integers(width))
    top, bottom = np.clip([cy - cut_h // 2, cy + cut_h // 2], 0, height)
    left, right = np.clip([cx - cut_w // 2, cx + cut_w // 2], 0, width)
    return int(top), int(bottom), int(left), int(right)


def draw_mix(config, height, width, rng):
    """('none' | 'mixup' | 'cutmix', lam, box or None) for one batch."""
    if not config.enabled or rng.random() >= config.prob:
        return 'none', 1.0, None
    use_cutmix = config.cutmix_alpha > 0 and (
        config.mixup_alpha <= 0 or rng.random() < config.switch_prob)
    if not use_cutmix:
        return 'mixup', float(rng.beta(config.mixup_alpha, config.mixup_alpha)), None
    lam = float(rng.beta(config.cutmix_alpha, config.cutmix_alpha))
    top, bottom, left, right = cutmix_box(height, width, lam, rng)
    lam = 1.0 - (bottom - top) * (right - left) / (height * width)  # the area actually pasted
    return 'cutmix', lam, (top, bottom, left, right)


def mix_batch(clips, labels, n_classes, config, rng):
    """Mixes a batch of clips (N, C, T, H, W) with labels (N,).

    Returns a MixedBatch; unmixed batches keep their integer labels, so the
    loss is exactly the plain one.
    """
    kind, lam, box = draw_mix(config, clips.shape[-2], clips.shape[-1], rng)
    if kind == 'none':
        return MixedBatch(clips, labels, labels, 1.0)
    paired = clips.flip(0)
    if kind == 'mixup':
        clips = clips.mul(lam).add_(paired, alpha=1.0 - lam)
    else:
        top, bottom, left, right = box
        clips = clips.clone()
        clips[..., top:bottom, left:right] = paired[..., top:bottom, left:right]
    pair_labels = labels.flip(0)
    onehot = F.one_hot(labels, n_classes).float()
    targets = onehot.mul(lam).add_(F.one_hot(pair_labels, n_classes).float(), alpha=1.0 - lam)
    dominant = labels if lam >= 0.5 else pair_labels
    return MixedBatch(clips, targets, dominant, lam)
