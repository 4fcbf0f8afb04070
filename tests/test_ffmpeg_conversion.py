"""Decoded frames come out in RGB exactly as FFmpeg's command line converts them
(``ffmpeg -i V -vf format=rgb24``), in every pixel format and size users have.

The reference is libavfilter itself: a PyAV filter graph built as fftools builds
it, the buffer source given the frame's colour matrix and range, and the scaler
libavfilter inserts before ``format=rgb24`` (the command line's flags for it,
``flags=bicubic``, are the scale filter's default: checked here too).  Reduced
(1/2, 1/4, 1/8) and short-side conversions are compared to the same filters with
the loader's flags: ``scale=W:H:flags=area,format=F,format=rgb24`` (reduced in
YUV, F the pixel format reduced in, then converted as full-size frames) and
``scale=W:H:flags=bilinear|bicubic,format=rgb24``.  Every frame, max difference 0."""
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pytest

from datasets.frame_conversion import _reformat_is_ffmpegs, frame_array, new_scaler, reduced_size, scaled_size
from datasets.video import VideoClipLoader
from datasets.whole_videos import iter_frames

N_FRAMES = 6
SHORT_SIDE = 30


@dataclass(frozen=True)
class Setting:
    codec: str
    pix_fmt: str
    size: tuple[int, int]  # (width, height)
    # the encoder's tags: AVColorSpace, AVColorPrimaries, AVColorTransferCharacteristic,
    # AVColorRange
    colour: tuple[int, int, int, int]
    suffix: str = '.mp4'
    options: tuple = ()


BT709_TV = (1, 1, 1, 1)
BT601_PC = (6, 6, 6, 2)
HLG_TV = (9, 9, 18, 1)  # BT.2020 non-constant luminance, ARIB STD-B67 (HLG)
PQ_TV = (9, 9, 16, 1)  # BT.2020, SMPTE 2084 (PQ, HDR10)
PQ_PC = (9, 9, 16, 2)
QUIET_X265 = (('x265-params', 'log-level=none'),)
VP9_FAST = (('deadline', 'realtime'), ('cpu-used', '8'))
FAST_SVT = (('preset', '12'), ('svtav1-params', 'lp=1'))

SETTINGS = {
    'h264-420-bt709-tv-64x48': Setting('libx264', 'yuv420p', (64, 48), BT709_TV),
    'vp9-420-bt601-pc-64x48': Setting('libvpx-vp9', 'yuv420p', (64, 48), BT601_PC, '.webm',
                                      VP9_FAST),
    'h264-yuvj420p-pc-64x48': Setting('libx264', 'yuvj420p', (64, 48), BT601_PC),
    'mpeg2-420-bt709-tv-121x81': Setting('mpeg2video', 'yuv420p', (121, 81), BT709_TV, '.mpg'),
    'ffv1-420-bt601-pc-61x47': Setting('ffv1', 'yuv420p', (61, 47), BT601_PC, '.mkv'),
    'h264-422-bt709-tv-64x48': Setting('libx264', 'yuv422p', (64, 48), BT709_TV),
    'mpeg2-422-bt709-tv-121x81': Setting('mpeg2video', 'yuv422p', (121, 81), BT709_TV, '.mkv'),
    'h264-444-bt709-tv-61x47': Setting('libx264', 'yuv444p', (61, 47), BT709_TV),
    'h264-high10-420-bt709-tv-64x48': Setting('libx264', 'yuv420p10le', (64, 48), BT709_TV),
    'hevc-10-420-bt2020-hlg-tv-64x48': Setting('libx265', 'yuv420p10le', (64, 48), HLG_TV,
                                               options=QUIET_X265),
    'hevc-10-420-bt2020-pq-pc-64x48': Setting('libx265', 'yuv420p10le', (64, 48), PQ_PC,
                                              options=QUIET_X265),
    'hevc-12-420-bt2020-pq-tv-64x48': Setting('libx265', 'yuv420p12le', (64, 48), PQ_TV,
                                              options=QUIET_X265),
    'vp9-10-420-bt2020-pq-tv-64x48': Setting('libvpx-vp9', 'yuv420p10le', (64, 48), PQ_TV, '.webm',
                                             VP9_FAST),
    'av1-10-420-bt2020-hlg-tv-64x48': Setting('libsvtav1', 'yuv420p10le', (64, 48), HLG_TV, '.mkv',
                                              FAST_SVT),
    'ffv1-10-420-bt2020-pq-tv-61x47': Setting('ffv1', 'yuv420p10le', (61, 47), PQ_TV, '.mkv'),
    'ffv1-10-444-bt2020-hlg-tv-61x47': Setting('ffv1', 'yuv444p10le', (61, 47), HLG_TV, '.mkv'),
    'ffv1-gray-tv-61x47': Setting('ffv1', 'gray', (61, 47), BT709_TV, '.mkv'),
    'ffv1-bgr0-61x47': Setting('ffv1', 'bgr0', (61, 47), (0, 2, 2, 2), '.mkv'),
    # chroma sited top-left (x264's chromaloc=2, as BT.2020 asks): the scale filter
    # ignores a frame's chroma location, PyAV's reformatter follows it
    'h264-420-topleft-bt709-tv-64x48': Setting('libx264', 'yuv420p', (64, 48), BT709_TV,
                                               options=(('x264-params', 'chromaloc=2'),)),
    'h264-high10-420-topleft-bt2020-hlg-tv-64x48': Setting(
        'libx264', 'yuv420p10le', (64, 48), HLG_TV, options=(('x264-params', 'chromaloc=2'),)),
    # interlaced coding: the scale filter converts the frame whole (interl=0), the
    # reformatter field by field
    'h264-420-interlaced-bt709-tv-64x48': Setting('libx264', 'yuv420p', (64, 48), BT709_TV,
                                                  options=(('flags', '+ildct'),)),
    'mpeg2-420-interlaced-bt709-tv-64x48': Setting('mpeg2video', 'yuv420p', (64, 48), BT709_TV,
                                                   '.mpg', (('flags', '+ildct+ilme'),)),
}


def source_images(width: int, height: int, seed: int = 0) -> list[np.ndarray]:
    """rgb48 frames: colour gradients, a pattern moving 3 pixels a frame and noise
    (the low bits of 10/12-bit samples and the chroma both vary)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    out = []
    for i in range(N_FRAMES):
        base = np.stack([x / width, y / height, ((x + y + 3 * i) % 17) / 17], -1) * 50000 + 5000
        out.append(np.clip(base + rng.normal(0, 3000, base.shape), 0, 65535).astype(np.uint16))
    return out


def write(path, s: Setting) -> None:
    import av
    width, height = s.size
    colorspace, primaries, trc, colour_range = s.colour
    with av.open(str(path), 'w') as container:
        stream = container.add_stream(s.codec, rate=25, options=dict(s.options))
        stream.width, stream.height, stream.pix_fmt = width, height, s.pix_fmt
        ctx = stream.codec_context
        ctx.colorspace, ctx.color_primaries, ctx.color_trc, ctx.color_range = \
            colorspace, primaries, trc, colour_range
        for image in source_images(width, height):
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format='rgb48le')))
        container.mux(stream.encode())


def _encodes(s: Setting) -> None:
    import av
    if s.codec not in av.codecs_available:
        pytest.skip(f'encoder {s.codec} is not in this PyAV wheel')
    formats = {f.name for f in av.Codec(s.codec, 'w').video_formats or ()}
    if s.pix_fmt not in formats:
        pytest.skip(f'encoder {s.codec} of this PyAV wheel does not write {s.pix_fmt}')


@pytest.fixture(scope='module')
def videos(tmp_path_factory):
    """name -> (path, its decoded frames), written on first use."""
    folder, made = tmp_path_factory.mktemp('conversion'), {}

    def get(name):
        s = SETTINGS[name]
        _encodes(s)
        if name not in made:
            import av
            path = folder / f'{name}{s.suffix}'
            write(path, s)
            with av.open(str(path)) as container:
                frames = list(container.decode(video=0))
            assert len(frames) == N_FRAMES and frames[0].format.name == s.pix_fmt
            assert (frames[0].colorspace, frames[0].color_range) == (s.colour[0], s.colour[3])
            made[name] = path, frames
        return made[name]
    return get


def ffmpeg_rgb(frames, chain: str = 'format=rgb24') -> list[np.ndarray]:
    """The frames through libavfilter: buffer -> ``chain`` -> buffersink, one graph for
    the video, its source given the frames' colour matrix and range as fftools gives it."""
    import av
    first = frames[0]
    graph = av.filter.Graph()
    last = graph.add('buffer', video_size=f'{first.width}x{first.height}',
                     pix_fmt=first.format.name, time_base=str(first.time_base or Fraction(1, 25)),
                     pixel_aspect='1/1', colorspace=str(int(first.colorspace)),
                     range=str(int(first.color_range)))
    filters = [graph.add(name, args or None) for name, _, args in (p.partition('=') for p in chain.split(','))]
    graph.link_nodes(last, *filters, graph.add('buffersink')).configure()  # PyAV's own chaining
    out = []
    for frame in frames:
        graph.push(frame)
        out.append(graph.pull().to_ndarray())
    return out


def max_diff(got, want) -> int:
    """Largest difference over all frames (got: (T, C, H, W) tensor or (H, W, 3) arrays)."""
    if hasattr(got, 'permute'):
        got = list(got.permute(0, 2, 3, 1).numpy())
    assert len(got) == len(want)
    worst = 0
    for g, w in zip(got, want):
        assert g.shape == w.shape, (g.shape, w.shape)
        worst = max(worst, int(np.abs(g.astype(np.int32) - w.astype(np.int32)).max()))
    return worst


# Settings whose full-size frames the loader converts with PyAV's reformatter (its
# faster path: progressive 8-bit 4:2:0 / 4:2:2 of even height, 4:4:4, gray, RGB);
# the others go through a filter graph.  Both must give FFmpeg's bytes.
REFORMATTED = {'h264-420-bt709-tv-64x48', 'vp9-420-bt601-pc-64x48', 'h264-yuvj420p-pc-64x48',
               'h264-422-bt709-tv-64x48', 'h264-444-bt709-tv-61x47',
               'ffv1-10-444-bt2020-hlg-tv-61x47', 'ffv1-gray-tv-61x47', 'ffv1-bgr0-61x47',
               'h264-420-topleft-bt709-tv-64x48'}


def assert_same(got, want, what: str) -> None:
    worst = max_diff(got, want)
    assert worst == 0, f'{what}: up to {worst} levels from FFmpeg\'s conversion'


@pytest.mark.parametrize('name', SETTINGS)
def test_full_size_frames_are_ffmpegs(videos, name):
    path, frames = videos(name)
    assert {_reformat_is_ffmpegs(f) for f in frames} == {name in REFORMATTED}
    want = ffmpeg_rgb(frames)
    # the command line's flags for the scaler it inserts give what the graph inserts
    assert_same(ffmpeg_rgb(frames, 'scale=flags=bicubic,format=rgb24'), want, 'flags=bicubic')
    scaler = new_scaler(1)  # the live streams' path (datasets/live.py)
    assert_same([frame_array(f, 1, scaler) for f in frames], want, 'frame_array')
    assert_same(VideoClipLoader(threads=1)(path, range(N_FRAMES)), want, 'VideoClipLoader')
    assert_same(list(iter_frames(path, threads=1)), want, 'iter_frames')


def reduced_in(fmt: str, factor: int) -> str | None:
    """The pixel format the loader reduces a ``fmt`` frame in (None: scaled in the
    conversion to RGB): its own at 1/2, 4:4:4 at 1/4 and 1/8 (gray: its own)."""
    if not fmt.startswith(('yuv', 'nv', 'gray')):
        return None
    if factor == 2 or fmt.startswith('gray'):
        return fmt
    return 'yuvj444p' if fmt.startswith('yuvj') else 'yuv444p'


@pytest.mark.parametrize('name', SETTINGS)
def test_reduced_frames_are_ffmpegs_area_scale_then_conversion(videos, name):
    path, frames = videos(name)
    loader = VideoClipLoader(threads=1)
    for factor in (2, 4, 8):
        height, width = reduced_size(frames[0].height, frames[0].width, factor)
        fmt = reduced_in(frames[0].format.name, factor)
        chain = f'scale={width}:{height}:flags=area' + (f',format={fmt}' if fmt else '')
        want = ffmpeg_rgb(frames, chain + ',format=rgb24')
        assert_same(loader.read(path, range(N_FRAMES)).decode(factor), want, f'1/{factor}')


@pytest.mark.parametrize('name', SETTINGS)
def test_short_side_frames_are_ffmpegs_scale(videos, name):
    """The loader's short side scales bilinear, iter_frames' bicubic, each in the
    conversion to RGB (one scale filter)."""
    path, frames = videos(name)
    width, height = scaled_size(frames[0].width, frames[0].height, SHORT_SIDE)
    bilinear = ffmpeg_rgb(frames, f'scale={width}:{height}:flags=bilinear,format=rgb24')
    bicubic = ffmpeg_rgb(frames, f'scale={width}:{height}:flags=bicubic,format=rgb24')
    loader = VideoClipLoader(short_side=SHORT_SIDE, threads=1)
    assert_same(loader(path, range(N_FRAMES)), bilinear, 'VideoClipLoader')
    assert_same(list(iter_frames(path, short_side=SHORT_SIDE, threads=1)), bicubic, 'iter_frames')
