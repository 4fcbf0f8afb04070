"""Tiny video files written with PyAV (no ffmpeg binary needed) for the tests."""
from pathlib import Path

import numpy as np

CODECS = {'.mp4': 'libx264', '.avi': 'mpeg4', '.mkv': 'libx264', '.webm': 'libvpx'}


def frame_image(i: int, width: int, height: int) -> np.ndarray:
    """Frame i (< 80): its index coded in steps of 12 in red (i % 20) and 60 in
    blue (i // 20), so it survives lossy coding, plus a white bar at column 2 * i."""
    img = np.full((height, width, 3), 40, np.uint8)
    img[..., 0] = 12 * (i % 20)
    img[..., 2] = 20 + 60 * (i // 20)
    img[:, (2 * i) % width, :] = 255
    return img


def frame_level(image) -> int:
    """The index coded by frame_image in an (H, W, 3) array or image."""
    a = np.asarray(image).astype(np.float32)
    return round(float(np.median(a[..., 0])) / 12) + 20 * round(
        (float(np.median(a[..., 2])) - 20) / 60)


def write_video(path, n_frames: int = 12, width: int = 32, height: int = 24, fps: int = 25,
                gop: int = 5, rotation: int = 0, images=None) -> Path:
    """An H.264 .mp4/.mkv (with B-frames), MPEG-4 .avi or VP8 .webm of
    ``frame_image`` frames (or ``images``, (H, W, 3) uint8), a keyframe every ``gop``."""
    import av
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    codec = CODECS[path.suffix]
    with av.open(str(path), 'w') as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, 'yuv420p'
        stream.codec_context.gop_size = gop
        if codec == 'libx264':
            stream.options = {'bf': '2', 'crf': '10', 'keyint_min': str(gop),
                              'sc_threshold': '0'}
        else:
            stream.bit_rate = 2_000_000
        if rotation:
            stream.set_display_rotation(rotation)
        frames = images if images is not None else \
            [frame_image(i, width, height) for i in range(n_frames)]
        for img in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format='rgb24')):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def red_levels(clip) -> list[int]:
    """Frame indices recovered from a uint8 (T, C, H, W) clip of frame_image frames."""
    return [frame_level(f.permute(1, 2, 0).numpy()) for f in clip]


def videos_from_jpgs(jpg_root, dst_root, ext: str = '.mp4', fps: int = 25,
                     other_ext: dict | None = None) -> Path:
    """Write every ``<label>/<video_id>/image_*.jpg`` folder under ``jpg_root`` as
    ``<label>/<video_id><ext>`` under ``dst_root`` (the synthetic set as videos);
    ``other_ext`` maps labels to another extension."""
    from PIL import Image
    jpg_root, dst_root = Path(jpg_root), Path(dst_root)
    for folder in sorted(p for p in jpg_root.glob('*/*') if p.is_dir()):
        images = [np.asarray(Image.open(f).convert('RGB'))
                  for f in sorted(folder.glob('image_*.jpg'))]
        height, width = images[0].shape[:2]
        suffix = (other_ext or {}).get(folder.parent.name, ext)
        write_video(dst_root / folder.parent.name / f'{folder.name}{suffix}', width=width,
                    height=height, fps=fps, gop=6, images=images)
    return dst_root
