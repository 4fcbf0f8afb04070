"""JPEGs that are not YCbCr, decoded by the data path (datasets/loader.py,
simplejpeg) as by torchvision.io.decode_jpeg: CMYK frames (libjpeg hands out
CMYK; torchvision converts it to RGB, and RGB to gray, with its own integer
formulas) and grayscale frames read as RGB."""
import io

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg

from datasets.loader import JpgClipLoader, decode_frames


def pillow_jpeg(mode, height, width, seed, **options):
    """A JPEG of smooth random colours plus noise (every level of each channel occurs)."""
    rng = np.random.default_rng(seed)
    channels = {'CMYK': 4, 'L': 1}[mode]
    y, x = np.mgrid[0:height, 0:width]
    base = (x[..., None] * rng.uniform(0.5, 3, channels) + y[..., None] * rng.uniform(0.5, 3, channels))
    img = (base + rng.normal(0, 40, (height, width, channels))) % 256
    img = img.astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img[..., 0] if channels == 1 else img, mode).save(buf, 'JPEG', **options)
    return buf.getvalue()


def torchvision_frames(data, mode):
    return torch.stack([decode_jpeg(torch.frombuffer(bytearray(d), dtype=torch.uint8), mode=mode)
                        for d in data])


def write_video(folder, data):
    folder.mkdir()
    for p, d in enumerate(data):
        (folder / f'image_{p + 1:05d}.jpg').write_bytes(d)
    return folder


@pytest.mark.parametrize('height, width', [(48, 64), (33, 17)])
def test_cmyk_frames_equal_torchvisions(tmp_path, height, width):
    data = [pillow_jpeg('CMYK', height, width, seed, **options) for seed, options in
            enumerate([dict(quality=95), dict(quality=75), dict(quality=90, progressive=True)])]
    folder = write_video(tmp_path / 'cmyk', data)
    for colorspace, mode in (('RGB', ImageReadMode.RGB), ('GRAY', ImageReadMode.GRAY)):
        got = JpgClipLoader(colorspace)(folder, [2, 0, 1, 0])
        expected = torchvision_frames(data, mode)[[2, 0, 1, 0]]
        assert got.shape == expected.shape
        assert (got.int() - expected.int()).abs().max().item() == 0, colorspace


def test_scaled_cmyk_frames_are_the_scaled_cmyk_decode_converted(tmp_path):
    """At 1/2, the CMYK that libjpeg scales in the DCT domain, converted as
    R = round(C * K / 255) (the value torchvision's integer formula computes)."""
    import simplejpeg
    data = [pillow_jpeg('CMYK', 40, 56, seed) for seed in range(2)]
    got = decode_frames(data, ['a.jpg', 'b.jpg'], 'video', 'RGB', factor=2)
    cmyk = np.stack([simplejpeg.decode_jpeg(d, colorspace='CMYK', min_factor=2, min_height=20,
                                            min_width=28) for d in data]).astype(np.float64)
    expected = np.rint(cmyk[..., :3] * cmyk[..., 3:] / 255)
    assert got.shape == (2, 20, 28, 3)
    assert np.array_equal(got.numpy(), expected)


def test_grayscale_frames_read_as_rgb_equal_torchvisions(tmp_path):
    data = [pillow_jpeg('L', 33, 47, seed, quality=q) for seed, q in enumerate((95, 70))]
    folder = write_video(tmp_path / 'gray', data)
    assert torch.equal(JpgClipLoader('RGB')(folder, [0, 1]), torchvision_frames(data, ImageReadMode.RGB))
    assert torch.equal(JpgClipLoader('GRAY')(folder, [0, 1]), torchvision_frames(data, ImageReadMode.GRAY))


def test_a_cmyk_frame_of_another_size_is_named(tmp_path):
    from utils.errors import DataError
    data = [pillow_jpeg('CMYK', 32, 32, 0), pillow_jpeg('CMYK', 40, 32, 1)]
    with pytest.raises(DataError, match='frames of video v have different sizes: b.jpg is 40x32'):
        decode_frames(data, ['a.jpg', 'b.jpg'], 'v')
