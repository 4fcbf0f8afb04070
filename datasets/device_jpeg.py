"""JPEG decoders for frames decoded in the main process (--decode_device cuda):
the workers hand over PackedFrames (datasets/loader.py), a batch's frames are
decoded here in one call, on the device the batch is for.

* :class:`NvImageCodecJpeg`: nvImageCodec (``pip install nvidia-nvimgcodec-cu12``,
  or -cu13), NVIDIA's maintained decoder; used when it imports.
* :class:`TorchvisionCudaJpeg`: ``torchvision.io.decode_jpeg(device='cuda')``
  (nvjpeg), while torchvision has it (its image decoding is deprecated).
* :class:`CpuJpeg`: simplejpeg on the CPU, at the DCT reduction the crop allows,
  through the workers' own decoding code: the same frames as the worker path
  (tests/test_device_decoding.py). It is what a CPU process gets, so the whole
  main-process path runs and is tested without a GPU.

The GPU decoders decode at full size (factors ``()``: the plan's box is cropped
from full frames); their frames differ from libjpeg-turbo's by the decoders'
rounding (IDCT, chroma upsampling), which util_scripts/gpu_check.py's gpu_decoding
check measures.

Every decoder's ``decode(items)`` takes ``[(PackedFrames, factor), ...]`` and
returns one uint8 (U, C, h, w) tensor per item on its ``device``; a corrupt
frame or one of another size raises DataError naming the frame, as in the workers.
"""
from __future__ import annotations

import warnings

import simplejpeg
import torch

from datasets.loader import EncodedClip, _corrupt, _size_error
from datasets.spatial_transforms import DCT_FACTORS
from utils.errors import DataError, OptionError

__all__ = ['CpuJpeg', 'TorchvisionCudaJpeg', 'NvImageCodecJpeg', 'device_jpeg_decoder']

INSTALL = ('pip install nvidia-nvimgcodec-cu12 (or -cu13, matching torch.version.cuda), '
           'or leave --decode_device out to decode in the loader workers')


class CpuJpeg:
    """simplejpeg in this process: EncodedClip.decode, as a worker decodes."""
    factors = DCT_FACTORS
    device = torch.device('cpu')
    name = 'simplejpeg (CPU)'

    def decode(self, items) -> list[torch.Tensor]:
        return [frames.unpack().decode(factor) for frames, factor in items]


def _split(items, images, to_chw) -> list[torch.Tensor]:
    """The flat list of decoded images -> one (U, C, H, W) tensor per item; a
    frame whose size is not its first frame's header size is a DataError."""
    out, k = [], 0
    for frames, _ in items:
        n = len(frames.ends)
        chw = [to_chw(image) for image in images[k:k + n]]
        k += n
        for image, name, data in zip(chw, frames.names, frames.frames()):
            if tuple(image.shape[-2:]) != tuple(frames.frame_size):
                raise _size_error(frames.video, name, frames.frame_size, data.numpy().tobytes())
        out.append(torch.stack(chw))
    return out


def _name_corrupt(items, decode_one, error) -> DataError:
    """The DataError of the first frame decode_one(bytes tensor) cannot decode
    (a batch decoder fails as a whole)."""
    for frames, _ in items:
        for name, data in zip(frames.names, frames.frames()):
            try:
                if decode_one(data) is None:
                    raise RuntimeError('the decoder returned no image')
            except (RuntimeError, ValueError) as e:
                return _corrupt(name, frames.video, e)
    first = items[0][0]
    return _corrupt(first.names[0], first.video, error)


class TorchvisionCudaJpeg:
    """torchvision.io.decode_jpeg on a list of frames, device=cuda (nvjpeg,
    batched); the bytes stay on the host, nvjpeg copies them."""
    factors = ()
    name = 'torchvision.io.decode_jpeg (nvjpeg)'

    def __init__(self, device: torch.device):
        with warnings.catch_warnings():  # its image decoding is deprecated: we know
            warnings.simplefilter('ignore')
            from torchvision.io import ImageReadMode, decode_jpeg
        self.device, self._decode, self._mode = device, decode_jpeg, ImageReadMode.RGB

    def _run(self, frames):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            return self._decode(frames, mode=self._mode, device=self.device)

    def decode(self, items) -> list[torch.Tensor]:
        flat = [f for frames, _ in items for f in frames.frames()]
        try:
            images = self._run(flat)
        except RuntimeError as e:
            raise _name_corrupt(items, lambda data: self._run([data]), e) from None
        return _split(items, images, lambda image: image)


class NvImageCodecJpeg:
    """nvImageCodec's batched decoder on the current CUDA stream of ``device``;
    images come back HWC and are taken over through DLPack (no copy, ordered
    on that stream)."""
    factors = ()
    name = 'nvImageCodec'

    def __init__(self, device: torch.device):
        from nvidia import nvimgcodec
        self.device = device
        index = device.index if device.index is not None else torch.cuda.current_device()
        self._decoder = nvimgcodec.Decoder(device_id=index)
        self._params = nvimgcodec.DecodeParams(color_spec=nvimgcodec.ColorSpec.RGB,
                                               allow_any_depth=False)

    def _run(self, frames):
        stream = torch.cuda.current_stream(self.device).cuda_stream
        return self._decoder.decode([f.numpy().tobytes() for f in frames], params=self._params,
                                    cuda_stream=stream)

    def decode(self, items) -> list[torch.Tensor]:
        flat = [f for frames, _ in items for f in frames.frames()]
        try:
            images = self._run(flat)
        except RuntimeError as e:
            raise _name_corrupt(items, lambda data: self._run([data])[0], e) from None
        if any(image is None for image in images):  # failed frames come back as None
            raise _name_corrupt(items, lambda data: self._run([data])[0],
                                RuntimeError('nvImageCodec returned no image'))
        return _split(items, images, lambda image: torch.from_dlpack(image).permute(2, 0, 1))


def _probe(decoder) -> None:
    """Decodes an 8x8 frame: a decoder that imports but cannot run (torchvision
    built without nvjpeg, no driver) fails here, at start-up, not mid-epoch."""
    jpeg = simplejpeg.encode_jpeg(torch.zeros(8, 8, 3, dtype=torch.uint8).numpy())
    images = decoder._run(EncodedClip([[jpeg]], [['probe']], 'probe').pack().frames())
    if images[0] is None or tuple(images[0].shape) not in ((3, 8, 8), (8, 8, 3)):
        raise RuntimeError('an 8x8 test frame did not decode')


def device_jpeg_decoder(device: torch.device):
    """The JPEG decoder for batches on ``device``: CpuJpeg on the CPU; on a GPU
    nvImageCodec if it imports and runs, else torchvision's nvjpeg decoder;
    OptionError in one line when neither works."""
    if device.type == 'cpu':
        return CpuJpeg()
    reasons = []
    for make in (NvImageCodecJpeg, TorchvisionCudaJpeg):
        try:
            decoder = make(device)
            _probe(decoder)
            return decoder
        except ImportError:
            reasons.append(f'{make.name}: not installed')
        except (AttributeError, TypeError, RuntimeError, ValueError) as e:  # no driver, no nvjpeg
            reasons.append(f'{make.name}: {str(e).splitlines()[0] if str(e) else type(e).__name__}')
    raise OptionError(f'--decode_device cuda found no GPU JPEG decoder that runs on {device} '
                      f'({"; ".join(reasons)}): {INSTALL}')
