"""X3D's sizes: the clip each was trained on, its depth factor and the frame
stride of its Kinetics recipe. Standard library only, so that opts.py (which
parses before torch is imported) reads its defaults from here."""
from dataclasses import dataclass

__all__ = ['X3DSize', 'SIZES', 'X3D_CLIPS']


@dataclass(frozen=True)
class X3DSize:
    """The paper's Table 2 and PyTorchVideo's hub (width and bottleneck factors
    are the same for all sizes); frame_stride is PyTorchVideo's model zoo's
    sampling rate (every n-th frame of 30 fps video)."""
    clip_length: int
    crop_size: int
    depth_factor: float
    frame_stride: int


SIZES = {
    'xs': X3DSize(clip_length=4, crop_size=160, depth_factor=2.2, frame_stride=12),
    's': X3DSize(clip_length=13, crop_size=160, depth_factor=2.2, frame_stride=6),
    'm': X3DSize(clip_length=16, crop_size=224, depth_factor=2.2, frame_stride=5),
    'l': X3DSize(clip_length=16, crop_size=312, depth_factor=5.0, frame_stride=5),
}
# size -> (sample_duration, sample_size): the clip the size is measured and run at.
X3D_CLIPS = {name: (size.clip_length, size.crop_size) for name, size in SIZES.items()}
