"""Tiny video files written with PyAV (no ffmpeg binary needed) for the tests."""
from pathlib import Path

import numpy as np

CODECS = {'.mp4': 'libx264', '.avi': 'mpeg4', '.mkv': 'libx264', '.webm': 'libvpx',
          '.mov': 'libx264'}


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
    codec = CODECS[path.suffix.lower()]
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
                     other_ext: dict | None = None, size: tuple[int, int] | None = None) -> Path:
    """Write every ``<label>/<video_id>/image_*.jpg`` folder under ``jpg_root`` as
    ``<label>/<video_id><ext>`` under ``dst_root`` (the synthetic set as videos);
    ``other_ext`` maps labels to another extension; ``size`` (width, height)
    resizes the frames."""
    from PIL import Image
    jpg_root, dst_root = Path(jpg_root), Path(dst_root)
    for folder in sorted(p for p in jpg_root.glob('*/*') if p.is_dir()):
        frames = [Image.open(f).convert('RGB') for f in sorted(folder.glob('image_*.jpg'))]
        images = [np.asarray(f if size is None else f.resize(size, Image.BILINEAR))
                  for f in frames]
        height, width = images[0].shape[:2]
        suffix = (other_ext or {}).get(folder.parent.name, ext)
        write_video(dst_root / folder.parent.name / f'{folder.name}{suffix}', width=width,
                    height=height, fps=fps, gop=6, images=images)
    return dst_root


# ----------------------------------------------------------------------------- frame-exact corpus
# Each frame carries its index as a 16-bit binary code: a 4x4 grid of 16x16 black
# or white blocks (bit b is block b, row-major), which survives any lossy codec.
CODE_BLOCK = 16
CODE_SIZE = 64  # frames are CODE_SIZE x CODE_SIZE (SVT-AV1 needs at least 64)

# name -> (file suffix, FFmpeg encoder, its options, keyframe interval set on the codec
# context or None, muxer or None for the suffix's).  The corpus of the frame-exactness
# test (tests/test_video_exact.py): the codecs of the issue, then one file for every
# other extension the loader accepts (datasets.video.VIDEO_EXTENSIONS).
CORPUS = {
    'mpeg4_avi_g3': ('.avi', 'mpeg4', {'bf': '0'}, 3, None),
    'mpeg4_avi_g3_bframes': ('.avi', 'mpeg4', {'bf': '2'}, 3, None),
    'mpeg4_avi_g12': ('.avi', 'mpeg4', {'bf': '0'}, 12, None),
    'mpeg4_avi_g12_bframes': ('.avi', 'mpeg4', {'bf': '2'}, 12, None),
    'mjpeg_avi': ('.avi', 'mjpeg', {}, None, None),
    'h264_mp4_default_gop': ('.mp4', 'libx264', {'crf': '18'}, None, None),
    'h264_mp4_g16': ('.mp4', 'libx264', {'crf': '18', 'g': '16'}, None, None),
    'hevc_mkv': ('.mkv', 'libx265', {'crf': '18', 'x265-params': 'log-level=none:keyint=20'},
                 None, None),
    'vp9_webm': ('.webm', 'libvpx-vp9', {'crf': '20', 'b': '0', 'g': '15',
                                         'deadline': 'realtime', 'cpu-used': '8'}, None, None),
    'av1_mp4': ('.mp4', 'libsvtav1', {'crf': '30', 'g': '24', 'preset': '12',
                                      'svtav1-params': 'lp=1'}, None, None),
    'h264_mov': ('.mov', 'libx264', {'crf': '18', 'g': '10'}, None, None),
    'h264_m4v': ('.m4v', 'libx264', {'crf': '18', 'g': '10'}, None, 'ipod'),
    'flv1_flv': ('.flv', 'flv', {}, 10, None),
    'mpeg2_mpg': ('.mpg', 'mpeg2video', {'bf': '2'}, 12, None),
    'mpeg1_mpeg': ('.mpeg', 'mpeg1video', {'bf': '2'}, 12, 'mpeg'),
    'mpeg4_3gp': ('.3gp', 'mpeg4', {'bf': '2'}, 10, None),
    'wmv2_wmv': ('.wmv', 'wmv2', {}, 10, None),
    'vp8_ogv': ('.ogv', 'libvpx', {'g': '10'}, None, None),  # the wheel has no Theora encoder
}


def code_image(i: int, size: int = CODE_SIZE) -> np.ndarray:
    """(size, size, 3) uint8 frame showing ``i`` (< 65536) as 16 black/white blocks,
    on a mid-grey background with a moving dot (so that frames differ in content too)."""
    img = np.full((size, size, 3), 128, np.uint8)
    for bit in range(16):
        r, c = divmod(bit, 4)
        img[r * CODE_BLOCK:(r + 1) * CODE_BLOCK, c * CODE_BLOCK:(c + 1) * CODE_BLOCK] = \
            255 if (i >> bit) & 1 else 0
    return img


def read_code(image) -> int:
    """The index code_image drew into an (H, W, 3) array (block means > 128: 1)."""
    a = np.asarray(image).astype(np.float32).mean(axis=2)
    value = 0
    for bit in range(16):
        r, c = divmod(bit, 4)
        block = a[r * CODE_BLOCK + 4:(r + 1) * CODE_BLOCK - 4, c * CODE_BLOCK + 4:(c + 1) * CODE_BLOCK - 4]
        value |= int(block.mean() > 128) << bit
    return value


def clip_codes(clip) -> list[int]:
    """Frame indices read from a uint8 (T, C, H, W) clip of code_image frames."""
    return [read_code(f.permute(1, 2, 0).numpy()) for f in clip]


def write_coded_video(path, codec: str, n_frames: int, options: dict | None = None,
                      gop: int | None = None, fmt: str | None = None, fps: int = 25,
                      mux_options: dict | None = None, first_pts: int = 0) -> Path:
    """``n_frames`` code_image frames encoded with ``codec`` (FFmpeg encoder name) and
    its ``options``; ``gop``: the keyframe interval set on the codec context; ``fmt``:
    the muxer (None: the one FFmpeg picks for the suffix) and its ``mux_options``.
    ``first_pts`` < 0: the first frames get negative timestamps, which the MP4 muxer
    hides behind an edit list (as a cut by stream copy does)."""
    import fractions

    import av
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), 'w', format=fmt, options=mux_options) as container:
        stream = container.add_stream(codec, rate=fps, options=dict(options or {}))
        stream.width = stream.height = CODE_SIZE
        stream.pix_fmt = 'yuvj420p' if codec == 'mjpeg' else 'yuv420p'
        if gop is not None:
            stream.codec_context.gop_size = gop
        if codec in ('mpeg4', 'mjpeg', 'flv', 'mpeg2video', 'mpeg1video', 'wmv2'):
            stream.bit_rate = 2_000_000
        time_base = fractions.Fraction(1, fps)
        stream.codec_context.time_base = time_base
        for i in range(n_frames):
            frame = av.VideoFrame.from_ndarray(code_image(i), format='rgb24')
            frame.pts, frame.time_base = first_pts + i, time_base
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path


def write_corpus_video(folder, name: str, n_frames: int) -> Path:
    suffix, codec, options, gop, fmt = CORPUS[name]
    return write_coded_video(Path(folder) / f'{name}{suffix}', codec, n_frames, options, gop, fmt)


# ----------------------------------------------------------------------------- files muxed as real ones are
# tests/test_real_files.py: variable frame rates, long last frames, far-off first
# timestamps, 10-bit, full range, rotation and odd sizes.  The index is drawn as the
# same 4x4 binary code, the blocks scaled to the frame (any size), with noise added
# so that frames hold real data (a file cut at 50% of its bytes is cut in its frames,
# not in its header).

def grid_code_image(i: int, width: int, height: int, noise: int = 40) -> np.ndarray:
    """(height, width, 3) uint8 frame showing ``i`` as 16 black/white blocks of
    (height // 4) x (width // 4) (row-major, bit b is block b), plus uniform noise of
    +-``noise`` levels drawn from seed ``i``; what the blocks leave is mid-grey."""
    bh, bw = height // 4, width // 4
    img = np.full((height, width, 3), 128, np.int16)
    for bit in range(16):
        r, c = divmod(bit, 4)
        img[r * bh:(r + 1) * bh, c * bw:(c + 1) * bw] = 255 if (i >> bit) & 1 else 0
    if noise:
        img += np.random.default_rng(i).integers(-noise, noise + 1, img.shape, dtype=np.int16)
    return np.clip(img, 0, 255).astype(np.uint8)


def read_grid_code(image) -> int:
    """The index grid_code_image drew into an (H, W, 3) array: each block's mean away
    from its edges (a quarter of the block) > 128 is a 1."""
    a = np.asarray(image).astype(np.float32).mean(axis=2)
    bh, bw = a.shape[0] // 4, a.shape[1] // 4
    mh, mw = max(1, bh // 4), max(1, bw // 4)
    value = 0
    for bit in range(16):
        r, c = divmod(bit, 4)
        block = a[r * bh + mh:(r + 1) * bh - mh, c * bw + mw:(c + 1) * bw - mw]
        value |= int(block.mean() > 128) << bit
    return value


def grid_clip_codes(clip) -> list[int]:
    """Frame indices read from a uint8 (T, C, H, W) clip of grid_code_image frames."""
    return [read_grid_code(f.permute(1, 2, 0).numpy()) for f in clip]


def write_timed_video(path, codec: str, pts: list[int], time_base, options: dict | None = None,
                      size: tuple[int, int] = (CODE_SIZE, CODE_SIZE), pix_fmt: str = 'yuv420p',
                      gop: int | None = None, durations: dict | None = None, rotation: int = 0,
                      fmt: str | None = None, mux_options: dict | None = None,
                      bit_rate: int | None = None, color_range: int | None = None) -> Path:
    """Frame ``i`` (grid_code_image) given timestamp ``pts[i]`` in ``time_base`` (a
    Fraction) and encoded with ``codec``: gaps between timestamps are a variable frame
    rate (dropped slots).  ``size``: (width, height) stored; ``rotation``: the display
    matrix's rotation in degrees (counterclockwise, as phones write it), the frames
    stored turned so that they are upright once it is applied.  ``durations``: {pts:
    duration} set on the packets (the muxer writes them: a long last frame).
    ``gop``: the keyframe interval set on the codec context; ``color_range``: the
    frames' (2: full, JPEG range)."""
    import fractions

    import av
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    time_base = fractions.Fraction(time_base)
    width, height = size
    turns = round(rotation / 90) % 4
    upright = (height, width) if turns % 2 else (width, height)
    with av.open(str(path), 'w', format=fmt, options=mux_options) as container:
        stream = container.add_stream(codec, rate=1 / time_base, options=dict(options or {}))
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        if gop is not None:
            stream.codec_context.gop_size = gop
        if bit_rate is not None:
            stream.bit_rate = bit_rate
        if color_range is not None:
            stream.codec_context.color_range = color_range
        stream.codec_context.time_base = time_base
        if rotation:
            stream.set_display_rotation(rotation)

        def mux(packets):
            for packet in packets:
                if durations and packet.pts in durations:
                    packet.duration = durations[packet.pts]
                container.mux(packet)

        for i, t in enumerate(pts):
            image = np.ascontiguousarray(np.rot90(grid_code_image(i, *upright), -turns))
            frame = av.VideoFrame.from_ndarray(image, format='rgb24')
            if color_range is not None:
                frame.color_range = color_range
            frame.pts, frame.time_base = t, time_base
            mux(stream.encode(frame))
        mux(stream.encode())
    return path
