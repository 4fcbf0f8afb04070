"""Clip-level spatial transforms on uint8 clips (T, C, H, W).

The augmentation runs on the whole clip at once through
``torchvision.transforms.v2`` with the clip wrapped as a ``tv_tensors.Video``:
one random crop box / flip / colour-jitter draw for all frames, resizing with
antialiased bilinear interpolation on uint8 (torchvision's fast uint8 path).
Random parameters come from torch's global generator (seeded per DataLoader
worker by PyTorch).  The last step converts to float32, scales to
``[0, value_scale]``, normalizes and permutes to (C, T, H, W), the network's
input layout.

The first, geometric step (crop box and resize) is decided from the frame size
alone, before anything is decoded: :meth:`ClipTransform.plan` returns a
:class:`ClipPlan` (the box and the size it is resized to), from which a loader
that can decode JPEGs at 1/2, 1/4 or 1/8 of their size picks the largest
reduction that still leaves the box at least the output size
(:meth:`ClipPlan.reduction`); ``augment(frames, plan, factor)`` then crops and
resizes the reduced frames.  The plan draws the same random numbers, in the
same order, as the crop step did inside the v2 pipeline, so a clip decoded at
full size is augmented exactly as before.

Mean/std convention: :func:`get_mean_std` and the ``mean``/``std`` arguments
of the builders are in the [0, 1] pixel scale; the builders multiply both by
``value_scale``.  So ``build_*(mean=m, std=s, value_scale=v)`` computes
``(x * v / 255 - m * v) / (s * v)`` for uint8 ``x``.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

__all__ = ['get_mean_std', 'build_train_transform', 'build_eval_transform', 'ClipTransform',
           'NormalizeToInput', 'MultiScaleCornerCrop', 'MEAN_STD', 'ThreeCropTransform',
           'three_crop_boxes', 'EVAL_CROPS', 'ClipPlan', 'ShortSideResize', 'RandomBox',
           'resized_size', 'DCT_FACTORS', 'contiguous_clip', 'flipped_contiguous_clip',
           'FlipToContiguous', 'host_empty']

MEAN_STD = {
    'kinetics': ([0.4345, 0.4051, 0.3775], [0.2768, 0.2713, 0.2737]),
    'activitynet': ([0.4477, 0.4209, 0.3906], [0.2767, 0.2695, 0.2714]),
    '0.5': ([0.5, 0.5, 0.5], [0.5, 0.5, 0.5]),
    'imagenet': ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),  # torchvision's ImageNet weights'
}


def get_mean_std(value_scale: float = 1, dataset: str = 'kinetics', no_mean_norm: bool = False,
                 no_std_norm: bool = False) -> tuple[list[float], list[float]]:
    """Normalisation statistics in the [0, 1] scale, for the ``build_*`` functions
    (which multiply them by ``value_scale``).

    ``no_mean_norm`` -> mean 0.  ``no_std_norm`` -> std ``1 / value_scale``, i.e.
    exactly 1 once scaled: the input is then ``x * value_scale / 255 - mean``.
    """
    key = str(dataset)
    if key not in MEAN_STD:
        raise ValueError(f'--mean_dataset must be one of {sorted(MEAN_STD)}, got {dataset!r}')
    mean, std = (list(v) for v in MEAN_STD[key])
    if no_mean_norm:
        mean = [0.0, 0.0, 0.0]
    if no_std_norm:
        std = [1.0 / value_scale] * 3
    return mean, std


def host_empty(shape, dtype=np.uint8) -> torch.Tensor:
    """An uninitialized CPU tensor in memory numpy allocates: glibc hands numpy's
    freed blocks back at the next call, while each torch.empty of a clip's size
    faults its pages in afresh (24-246 page faults for 0.6-19 MB here, 0.07-0.9 ms
    more a call: python -m bench.jpeg_clip)."""
    return torch.from_numpy(np.empty(shape, dtype))


class NormalizeToInput:
    """uint8 (T, C, H, W) -> float32 (C, T, H, W) (also batched: (N, T, C, H, W) ->
    (N, C, T, H, W)): ``(x * v / 255 - mean * v) / (std * v)``,
    computed as one multiply-subtract per element on the permuted contiguous copy.
    ``mean``/``std`` in the [0, 1] scale; a clip with fewer channels than
    ``mean`` (2-channel flow) uses the first ones."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], value_scale: float = 1):
        mean = torch.tensor([float(m) for m in mean], dtype=torch.float64)
        std = torch.tensor([float(s) for s in std], dtype=torch.float64)
        if (std <= 0).any():
            raise ValueError(f'std must be positive, got {std.tolist()}')
        self.mean, self.std, self.value_scale = mean.tolist(), std.tolist(), value_scale
        # (x * v/255 - m*v) / (s*v) = x * gain - bias
        self._gain = ((value_scale / 255.0) / (std * value_scale)).float()
        self._bias = (mean / std).float()
        self._on_device = {}  # device -> (gain, bias), copied once, not per batch

    def __call__(self, clip: torch.Tensor, memory_format=torch.contiguous_format) -> torch.Tensor:
        """(..., T, C, H, W) uint8 -> (..., C, T, H, W) float32, contiguous (or,
        for batches, in `memory_format`: channels_last_3d with --channels_last)."""
        clip = clip.as_subclass(torch.Tensor)
        c = clip.shape[-3]
        if c > self._gain.numel():
            raise ValueError(f'clip has {c} channels but mean/std have {self._gain.numel()}')
        x = clip.movedim(-3, -4)
        if x.device.type == 'cpu' and memory_format == torch.contiguous_format:
            x = host_empty(x.shape, np.float32).copy_(x)
        else:
            x = x.to(torch.float32, memory_format=memory_format)
        shape = (c, 1, 1, 1)
        gain, bias = self._constants(x.device)
        return x.mul_(gain[:c].view(shape)).sub_(bias[:c].view(shape))

    def _constants(self, device):
        if device.type == 'cpu':
            return self._gain, self._bias
        if device not in self._on_device:
            self._on_device[device] = (self._gain.to(device), self._bias.to(device))
        return self._on_device[device]

    def __getstate__(self):  # workers need no device copies
        return {**self.__dict__, '_on_device': {}}

    def __repr__(self):
        return f'NormalizeToInput(mean={self.mean}, std={self.std}, value_scale={self.value_scale})'


def contiguous_clip(clip: torch.Tensor) -> torch.Tensor:
    """``clip`` in contiguous memory, its shape unchanged.  A CPU uint8 clip in
    another layout (the resize's channels-last output, its crops and flips) is
    copied by numpy, about twice as fast as ``Tensor.contiguous`` (0.23 against
    0.43 ms for 16x3x112x112 on one core: python -m bench.data_loading --sections
    layout).  (The float conversion of NormalizeToInput is as fast from
    channels-last memory: it is left to torch.)"""
    clip = clip.as_subclass(torch.Tensor)
    if clip.is_contiguous() or clip.device.type != 'cpu' or clip.dtype != torch.uint8:
        return clip.contiguous()
    out = host_empty(clip.shape)  # uint8, as checked above
    np.copyto(out.numpy(), clip.numpy())
    return out


def flipped_contiguous_clip(clip: torch.Tensor) -> torch.Tensor:
    """``clip`` flipped left-right in contiguous memory: for a CPU uint8 clip, the
    flip and contiguous_clip's copy in one numpy pass (numpy reads the reversed
    view in place; torch's flip would copy the channels-last clip once more)."""
    clip = clip.as_subclass(torch.Tensor)
    if clip.device.type != 'cpu' or clip.dtype != torch.uint8:
        return clip.flip(-1).contiguous()
    out = host_empty(clip.shape)  # uint8, as checked above
    np.copyto(out.numpy(), clip.numpy()[..., ::-1])
    return out


class FlipToContiguous(v2.RandomHorizontalFlip):
    """``v2.RandomHorizontalFlip(p)`` -- the same draw, the same pixels -- whose
    flipped CPU uint8 clip comes out in contiguous memory, the layout the finish
    step needs (flipped_contiguous_clip: one copy where the flip and the finish's
    transposing copy made two; flip + layout of a flipped clip 10-28% cheaper:
    python -m bench.data_loading --frames photo --sections layout).  Used only as
    the last augmentation step, so no step after it sees another layout."""

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        if not (isinstance(inpt, torch.Tensor) and inpt.device.type == 'cpu' and inpt.dtype == torch.uint8):
            return super().transform(inpt, params)  # on the device: torch's flip
        out = flipped_contiguous_clip(inpt)
        return tv_tensors.wrap(out, like=inpt) if isinstance(inpt, tv_tensors.TVTensor) else out


def _query_size(flat_inputs: list[Any]) -> tuple[int, int]:
    for x in flat_inputs:
        if isinstance(x, torch.Tensor):
            h, w = F.get_size(x)
            return h, w
    raise TypeError('no image/video tensor among the inputs')


class MultiScaleCornerCrop(v2.Transform):
    """Square crop of side ``short_side * scale`` (scale drawn from ``scales``) at
    a position drawn from center / top-left / top-right / bottom-left /
    bottom-right, resized to ``size`` -- one draw per call (per clip)."""

    def __init__(self, size: int, scales: Sequence[float] = (1, 2 ** -0.25, 2 ** -0.5,
                                                            2 ** -0.75, 0.5),
                 positions: Sequence[str] = ('c', 'tl', 'tr', 'bl', 'br'), antialias=True):
        super().__init__()
        self.size = [int(size), int(size)]
        self.scales = [float(s) for s in scales]
        self.positions = list(positions)
        self.antialias = antialias

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        height, width = _query_size(flat_inputs)
        scale = self.scales[int(torch.randint(len(self.scales), ()))]
        pos = self.positions[int(torch.randint(len(self.positions), ()))]
        crop = max(1, int(min(height, width) * scale))
        top = {'c': (height - crop) // 2, 'tl': 0, 'tr': 0,
               'bl': height - crop, 'br': height - crop}[pos]
        left = {'c': (width - crop) // 2, 'tl': 0, 'bl': 0,
                'tr': width - crop, 'br': width - crop}[pos]
        return dict(top=top, left=left, height=crop, width=crop)

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        return self._call_kernel(F.resized_crop, inpt, **params, size=self.size,
                                 antialias=self.antialias)


DCT_FACTORS = (2, 4, 8)  # the reductions libjpeg decodes fastest (in the DCT domain)


class ClipPlan(NamedTuple):
    """The geometric step of a clip's augmentation, decided from the frame size
    before anything is decoded: ``box`` (top, left, height, width) of frames of
    ``frame`` size (height, width) as stored is resized to ``size`` (height, width)."""
    frame: tuple[int, int]
    box: tuple[int, int, int, int]
    size: tuple[int, int]

    def reduction(self, factors: Sequence[int] = DCT_FACTORS) -> int:
        """The largest of ``factors`` f at which the box still has at least ``size``
        pixels each way, so that decoding at 1/f upsamples nothing that full-size
        decoding would not; 1 if there is none."""
        _, _, height, width = self.box
        fits = [f for f in factors if height >= f * self.size[0] and width >= f * self.size[1]]
        return max(fits, default=1)

    def box_at(self, factor: int) -> tuple[int, int, int, int]:
        """The box in frames decoded at 1/factor (libjpeg's size, ceil(n / factor)):
        each edge at the nearest reduced pixel, so it keeps at least
        ``floor(height / factor)`` x ``floor(width / factor)`` pixels."""
        if factor == 1:
            return self.box
        top, left, height, width = self.box

        def edge(x):  # rounded half up
            return (x + factor // 2) // factor
        return edge(top), edge(left), edge(top + height) - edge(top), edge(left + width) - edge(left)


def resized_size(height: int, width: int, size: int) -> tuple[int, int]:
    """(height, width) after ``v2.Resize(size)``: the short side becomes ``size``,
    the long one ``int(size * long / short)``."""
    if width <= height:
        return int(size * height / width), size
    return size, int(size * width / height)


def _shape_only(height: int, width: int) -> torch.Tensor:
    """A tensor of shape (height, width) with no memory behind it: what a v2
    transform's ``make_params`` needs to draw a box for frames of that size."""
    return torch.empty((), dtype=torch.uint8).expand(height, width)


class _Geometry:
    """Crop ``plan.box`` (taken at the decoding factor) and resize it to
    ``plan.size``: bilinear with antialiasing, on the whole uint8 clip."""

    def __call__(self, clip: torch.Tensor, plan: ClipPlan, factor: int = 1) -> torch.Tensor:
        top, left, height, width = plan.box_at(factor)
        return F.resized_crop(clip, top, left, height, width, list(plan.size), antialias=True)


class ShortSideResize(_Geometry):
    """The short side resized to ``size`` (as ``v2.Resize(size)``), the whole frame kept."""

    def __init__(self, size: int):
        self.size = int(size)

    def plan(self, height: int, width: int) -> ClipPlan:
        return ClipPlan((height, width), (0, 0, height, width),
                        resized_size(height, width, self.size))

    def __repr__(self):
        return f'ShortSideResize({self.size})'


class RandomBox(_Geometry):
    """A v2 crop-and-resize transform (RandomResizedCrop, MultiScaleCornerCrop)
    whose box is drawn by its own ``make_params`` from the frame size alone --
    the same draws, in the same order, as when it runs inside a v2 pipeline."""

    def __init__(self, crop: v2.Transform):
        self.crop = crop

    def plan(self, height: int, width: int) -> ClipPlan:
        p = self.crop.make_params([_shape_only(height, width)])
        return ClipPlan((height, width), (p['top'], p['left'], p['height'], p['width']),
                        tuple(self.crop.size))

    def __repr__(self):
        return f'RandomBox({self.crop})'


class ClipTransform:
    """``geometry`` (crop box and resize, planned from the frame size), then
    ``augment`` (the other uint8 -> uint8 steps on the whole clip, v2
    transforms), then ``finish`` (-> normalized float (C, T, H, W)).
    ``deterministic`` is True for eval transforms: the data set may then
    augment the union of several clips' frames once."""

    def __init__(self, augment: v2.Transform | None, finish: NormalizeToInput,
                 deterministic: bool, geometry: _Geometry | None = None):
        self.geometry = geometry
        self.augment_transform = augment
        self.finish = finish
        self.deterministic = deterministic

    def plan(self, frame_size: Sequence[int]) -> ClipPlan | None:
        """The clip's geometric step for frames of ``frame_size`` (height, width);
        draws the crop box's random numbers (None: no geometric step)."""
        if self.geometry is None:
            return None
        return self.geometry.plan(int(frame_size[0]), int(frame_size[1]))

    def augment(self, clip: torch.Tensor, plan: ClipPlan | None = None,
                factor: int = 1) -> torch.Tensor:
        """uint8 (T, C, H, W) -> uint8 (T, C, h, w), same parameters for every frame.
        ``plan``: from :meth:`plan` on the stored frame size (drawn here if None);
        ``factor``: the clip was decoded at 1/factor of that size."""
        clip = tv_tensors.Video(clip)
        if self.geometry is not None:
            if plan is None:
                plan = self.plan(clip.shape[-2:])
            clip = self.geometry(clip, plan, factor)
        if self.augment_transform is not None:
            clip = self.augment_transform(clip)
        return clip.as_subclass(torch.Tensor)

    def __call__(self, clip: torch.Tensor) -> torch.Tensor:
        return self.finish(self.augment(clip))

    def defer_normalization(self) -> NormalizeToInput:
        """From now on, clips stay uint8 (T, C, H, W); returns the normalizer for
        the consumer to apply on the device after the copy (4x fewer bytes
        through shared memory, pinned memory and PCIe)."""
        normalizer = self.finish
        if isinstance(normalizer, NormalizeToInput):
            self.finish = KeepUint8(normalizer)
        return normalizer

    @property
    def device_normalizer(self) -> NormalizeToInput | None:
        """The normalizer the consumer applies on the device after
        defer_normalization() (datasets/device_batches.py), else None: the clips
        come out normalized."""
        return self.finish.normalizer if isinstance(self.finish, KeepUint8) else None

    def __repr__(self):
        return (f'ClipTransform(geometry={self.geometry}, augment={self.augment_transform}, '
                f'finish={self.finish})')


class KeepUint8:
    """The finish step of a ClipTransform whose normalization runs on the
    device: `normalizer`, applied there by the consumer."""

    def __init__(self, normalizer: NormalizeToInput):
        self.normalizer = normalizer

    def __call__(self, clip: torch.Tensor) -> torch.Tensor:
        return contiguous_clip(clip)

    def __repr__(self):
        return 'KeepUint8()'


def build_train_transform(sample_size: int, train_crop: str = 'random', min_scale: float = 0.25,
                          min_ratio: float = 0.75, hflip: bool = True, colorjitter: bool = False,
                          mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                          value_scale: float = 1, randaugment: Sequence[int] | None = None,
                          random_erasing: float = 0.0) -> ClipTransform:
    """Training augmentation for uint8 clips (T, C, H, W) -> float (C, T, H, W).

    train_crop: 'random' = RandomResizedCrop(scale=(min_scale, 1), ratio=(min_ratio,
    1 / min_ratio)); 'corner' = :class:`MultiScaleCornerCrop`; 'center' = resize
    the short side to sample_size and center-crop.  Then horizontal flip
    (p = 0.5) and ColorJitter(0.4, 0.4, 0.4, 0.1), each with one draw per clip.
    ``randaugment=(N, M)`` adds RandAugment(num_ops=N, magnitude=M) and
    ``random_erasing=p`` RandomErasing(p), both also one draw per clip; see
    :func:`clip_regularizers`.
    mean/std in the [0, 1] scale (default: Kinetics), scaled by value_scale.
    """
    if mean is None or std is None:
        dmean, dstd = get_mean_std(value_scale)
        mean = dmean if mean is None else mean
        std = dstd if std is None else std
    steps = []
    if train_crop == 'random':
        geometry = RandomBox(v2.RandomResizedCrop(sample_size, scale=(min_scale, 1.0),
                                                  ratio=(min_ratio, 1.0 / min_ratio),
                                                  antialias=True))
    elif train_crop == 'corner':
        geometry = RandomBox(MultiScaleCornerCrop(sample_size))
    elif train_crop == 'center':
        geometry, steps = ShortSideResize(sample_size), [v2.CenterCrop(sample_size)]
    else:
        raise ValueError(f"--train_crop must be random, corner or center, got {train_crop!r}")
    rest = clip_regularizers(randaugment, random_erasing, mean)
    if colorjitter:
        rest.insert(0, v2.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1))
    if hflip:  # last, with nothing after it: its copy also makes the clip contiguous
        steps.append(v2.RandomHorizontalFlip(0.5) if rest else FlipToContiguous(0.5))
    steps += rest
    return ClipTransform(v2.Compose(steps) if steps else None,
                         NormalizeToInput(mean, std, value_scale), deterministic=False,
                         geometry=geometry)


def clip_regularizers(randaugment: Sequence[int] | None, random_erasing: float,
                      mean: Sequence[float]) -> list:
    """RandAugment (N ops at magnitude M) and random erasing on the uint8 clip.

    Both see the clip as one video, so every frame gets the same ops and the
    same erased box. The box is filled with the mean gray of the data set,
    which normalisation maps to about 0 (timm erases normalised images with 0).
    """
    steps = []
    if randaugment:
        num_ops, magnitude = (int(v) for v in randaugment)
        steps.append(v2.RandAugment(num_ops=num_ops, magnitude=magnitude))
    if random_erasing > 0:
        gray = round(255 * sum(mean[:3]) / len(mean[:3]))
        steps.append(v2.RandomErasing(p=random_erasing, value=gray))
    return steps


EVAL_CROPS = ('center', 'nocrop', 'three')


def three_crop_boxes(height: int, width: int, size: int) -> list[tuple[int, int, int, int]]:
    """(top, left, height, width) of three ``size`` squares along the long side:
    left / center / right of a wide frame, top / center / bottom of a tall one
    (three times the center of a square one)."""
    if height < size or width < size:
        raise ValueError(f'a {height}x{width} frame is smaller than the {size}x{size} crop')

    def center(n):  # rounded like v2.CenterCrop, so the middle crop is 'center''s
        return int(round((n - size) / 2.0))

    if width >= height:
        return [(center(height), left, size, size) for left in (0, center(width), width - size)]
    return [(top, center(width), size, size) for top in (0, center(height), height - size)]


class ThreeCropTransform(ClipTransform):
    """Resize the short side to ``size``, then the three :func:`three_crop_boxes`:
    uint8 (T, C, H, W) -> (3, T, C, size, size) -> float (3, C, T, size, size).
    The decoded clip is resized once and cropped three times (views, not copies)."""

    n_crops = 3

    def __init__(self, size: int, finish: NormalizeToInput):
        super().__init__(None, finish, deterministic=True, geometry=ShortSideResize(size))
        self.size = int(size)

    def augment(self, clip: torch.Tensor, plan: ClipPlan | None = None,
                factor: int = 1) -> torch.Tensor:
        resized = super().augment(clip, plan, factor)
        h, w = resized.shape[-2:]
        crops = [resized[..., t:t + ch, lf:lf + cw]
                 for t, lf, ch, cw in three_crop_boxes(h, w, self.size)]
        if resized.device.type != 'cpu' or resized.dtype != torch.uint8:
            return torch.stack(crops)
        out = host_empty((len(crops), *crops[0].shape))
        for view, crop in zip(out.numpy(), crops):
            np.copyto(view, crop.numpy())  # contiguous_clip's copy, into the stack
        return out


def build_eval_transform(sample_size: int, mean: Sequence[float] | None = None,
                         std: Sequence[float] | None = None, value_scale: float = 1,
                         crop: str = 'center') -> ClipTransform:
    """Validation / inference: resize the short side to sample_size, then center
    crop ('center'), keep the whole frame ('nocrop') or take three crops along
    the long side ('three', a :class:`ThreeCropTransform`: one more leading
    dimension of 3 views)."""
    if mean is None or std is None:
        dmean, dstd = get_mean_std(value_scale)
        mean = dmean if mean is None else mean
        std = dstd if std is None else std
    if crop not in EVAL_CROPS:
        raise ValueError(f'crop must be one of {", ".join(EVAL_CROPS)}, got {crop!r}')
    finish = NormalizeToInput(mean, std, value_scale)
    if crop == 'three':
        return ThreeCropTransform(sample_size, finish)
    rest = v2.CenterCrop(sample_size) if crop == 'center' else None
    return ClipTransform(rest, finish, deterministic=True,
                         geometry=ShortSideResize(sample_size))

