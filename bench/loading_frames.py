"""The generated videos of bench/data_loading.py (--frames): noise frames (blocks of
colour plus per-pixel noise moving) or photo frames (scikit-image's photographs
panned and zoomed: camera-like), written as the formats it compares: H.264 .mp4
and MPEG-4 .avi with PyAV, jpg folders and hdf5 files made by our tools."""
import functools
import math
from pathlib import Path

import numpy as np
from PIL import Image

FORMATS = {'mp4': ('libx264', {'preset': 'medium', 'crf': '23'}),  # x264 default GOP (250)
           'avi': ('mpeg4', {'g': '12', 'b': '800k'}),  # FFmpeg's MPEG-4 default GOP
           'mp4_g16': ('libx264', {'preset': 'medium', 'crf': '23', 'g': '16'})}


def frames_of(v, n_frames, size, rng):
    """Textured frames (smooth colour blobs, a moving pattern, noise): compress like video."""
    h, w = size
    base = rng.integers(0, 255, (h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
    base = np.kron(base, np.ones((16, 16, 1), dtype=np.uint8))[:h, :w].astype(np.int16)
    for f in range(n_frames):
        noise = rng.integers(-12, 12, (h, w, 3), dtype=np.int16)
        yield np.clip(np.roll(base, (f, 2 * f), axis=(0, 1)) + noise, 0, 255).astype(np.uint8)


@functools.lru_cache(maxsize=1)
def photographs():
    """scikit-image's bundled colour photographs (in its wheel, no download), at least
    400x300 each: room for the 1.25x window of photo_frames."""
    try:
        from skimage import data
    except ImportError:
        raise SystemExit('--frames photo needs scikit-image (a bench-only dependency): '
                         'pip install -r requirements-dev.txt') from None
    return (data.astronaut(), data.coffee(), data.chelsea(), data.rocket(), data.stereo_motorcycle()[0])


def photo_frames(v, n_frames, size):
    """Camera-like frames: a window of the frames' aspect pans across photograph
    v % 5 while zooming slowly (1.25x the frame size to 1x, or back for odd v),
    resampled bilinearly to ``size`` (sub-pixel steps: smooth motion).  Deterministic."""
    h, w = size
    photo = Image.fromarray(photographs()[v % len(photographs())])
    width, height = photo.size
    for f in range(n_frames):
        t = f / max(1, n_frames - 1)
        zoom = 1.25 - 0.25 * t if v % 2 == 0 else 1 + 0.25 * t
        box_w, box_h = w * zoom, h * zoom
        left = (width - box_w) * (0.5 + 0.5 * math.sin(math.pi * t + v))
        top = (height - box_h) * (0.5 + 0.5 * math.sin(0.7 * math.pi * t + 2 * v))
        yield np.asarray(photo.resize((w, h), Image.BILINEAR, box=(left, top, left + box_w, top + box_h)))


FRAMES = ('noise', 'photo')
QUALITY = {'noise': 95, 'photo': 90}  # generate_video_jpgs's default; a camera's, as in issue 25
FRAME_NAMES = {'noise': 'blocks of colour plus per-pixel noise',
               'photo': "scikit-image's photographs, panned and zoomed"}


def video_frames(frames, n_videos, n_frames, size):
    """Each video's frames (an iterator per video, in order) of kind ``frames``."""
    rng = np.random.default_rng(0)  # noise: one stream across the videos, as before
    for v in range(n_videos):
        yield (frames_of(v, n_frames, size, rng) if frames == 'noise'
               else photo_frames(v, n_frames, size))


def write_video_files(root, n_videos, n_frames, size, frames='noise', on_frame=None):
    """The videos of FORMATS; ``on_frame(v, f, rgb)`` also sees every frame."""
    import av
    for v, images in enumerate(video_frames(frames, n_videos, n_frames, size)):
        containers = {}
        for ext, (codec, options) in FORMATS.items():
            container = av.open(str(root / ext / 'cls' / f'video_{v}.{ext[:3]}'), 'w')
            stream = container.add_stream(codec, rate=25, options=options)
            stream.width, stream.height, stream.pix_fmt = size[1], size[0], 'yuv420p'
            containers[ext] = (container, stream)
        for f, img in enumerate(images):
            if on_frame:
                on_frame(v, f, img)
            frame = av.VideoFrame.from_ndarray(img, format='rgb24')
            for container, stream in containers.values():
                container.mux(stream.encode(frame))
        for container, stream in containers.values():
            container.mux(stream.encode())
            container.close()


def encode_photo_jpeg(img, quality):
    """A camera's JPEG: 4:2:0 chroma, as FFmpeg's and generate_video_jpgs's encoders write."""
    import simplejpeg
    return simplejpeg.encode_jpeg(np.ascontiguousarray(img), quality=quality, colorsubsampling='420')


def prepare(root, n_videos, n_frames, size, quality=95, frames='noise'):
    """mp4/avi written with PyAV; jpg (JPEG ``quality``) made from the mp4 by our tools
    (noise frames) or from the frames themselves with simplejpeg (photo frames: no
    second lossy pass), hdf5 from the jpg folders by our tools."""
    from util_scripts import generate_video_hdf5, generate_video_jpgs
    for ext in FORMATS:
        (root / ext / 'cls').mkdir(parents=True)
    on_frame = None
    if frames == 'photo':
        def on_frame(v, f, img):
            folder = root / 'jpg' / 'cls' / f'video_{v}'
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f'image_{f + 1:05d}.jpg').write_bytes(encode_photo_jpeg(img, quality))
    write_video_files(root, n_videos, n_frames, size, frames, on_frame)
    if frames == 'noise':
        generate_video_jpgs.main([str(root / 'mp4'), str(root / 'jpg'), 'ucf101', '--size', '-1',
                                  '--n_jobs', '2', '--quality', str(quality)])
    generate_video_hdf5.main([str(root / 'jpg'), str(root / 'hdf5'), 'ucf101', '--n_jobs', '2'])
    paths = {'jpg': [root / 'jpg' / 'cls' / f'video_{v}' for v in range(n_videos)],
             'hdf5': [root / 'hdf5' / 'cls' / f'video_{v}.hdf5' for v in range(n_videos)]}
    for ext in FORMATS:
        paths[ext] = [root / ext / 'cls' / f'video_{v}.{ext[:3]}' for v in range(n_videos)]
    return paths


def disk_mb(path) -> float:
    return sum(f.stat().st_size for f in Path(path).rglob('*') if f.is_file()) / 1e6
