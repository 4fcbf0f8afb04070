"""Re-encode videos to train from them fast: a keyframe every N frames and the
short side at most S, every frame kept, in order.

python -m util_scripts.reencode_videos SRC DST [--gop 16] [--short_side 320]
    [--codec libx264] [--crf 23] [--preset medium] [--workers N]

Every video file under SRC (any depth: <class>/<video>.<ext> or flat) becomes
DST/<same relative path>.mp4, written with PyAV (FFmpeg's libraries, no ffmpeg
binary). A clip loader seeks to the keyframe before a clip and decodes from
there: from a download's GOP of 250 frames a random 16-frame clip decodes about
130 frames to keep 16, from a GOP of 16 at most 31.

What is kept and what is not:
* every decoded frame of the video stream every reader takes (FFmpeg's pick,
  datasets/video_stream.py), in presentation order, each with its own
  timestamp (variable frame rate stays variable; a timestamp that does not
  advance is moved one tick past the previous one): the frame count and frame
  positions are the source's, so an annotation built from the source (or its
  jpg folders) fits the new files. The count of every file written is checked.
* rotated (phone) videos are written upright, as the loaders read them (the
  display matrix applied to the pixels; the new file has none).
* frames whose short side is over S are scaled down, as the loader's
  --short_side scales (bicubic, long side truncated); none is enlarged. Then,
  4:2:0 needing an even width and height, an odd side loses its last column or
  row (not scaled again).
* audio, subtitles and other streams are dropped.
Files are written under a temporary name and renamed, so a file in DST is
complete and a rerun skips it; the summary names every video that failed and
gives the sizes before and after.
"""
import argparse
import os
import sys
from fractions import Fraction
from pathlib import Path

from datasets.formats import VIDEO_EXTENSIONS
from utils.atomic import atomic_path
from utils.cli import Parser
from utils.errors import DataError, OptionError

from .utils import fail, run_conversions

CRF_CODECS = ('libx264', 'libx265', 'libvpx-vp9', 'libaom-av1', 'libsvtav1')
PRESET_CODECS = ('libx264', 'libx265')
_REENCODE = 're-download it, or leave it out of the data set'


def check_options(gop: int, short_side: int | None, codec: str, crf: int) -> None:
    """OptionError naming the option for a value that cannot work."""
    if gop < 1:
        raise OptionError(f'--gop {gop}: a keyframe every N frames needs N >= 1 (16 suits '
                          f'16-frame clips)')
    if short_side is not None and short_side < 2:
        raise OptionError(f'--short_side {short_side}: give at least 2 (e.g. 256 or 320), or 0 to '
                          f'keep the frames\' size')
    if not 0 <= crf <= 63:
        raise OptionError(f'--crf {crf}: give 0..51 for libx264/libx265 (23 is x264\'s default)')
    import av
    try:
        found = av.codec.Codec(codec, 'w')
    except (av.FFmpegError, ValueError):
        found = None
    if found is None or found.type != 'video':
        raise OptionError(f'--codec {codec}: not a video encoder of this FFmpeg (PyAV {av.__version__}): '
                          f'use e.g. libx264, libx265, libvpx-vp9 or mpeg4')


def _even(array):
    """The frame with an odd width or height cut by its last column or row (4:2:0)."""
    height, width = array.shape[:2]
    return array[:height - height % 2, :width - width % 2]


def _open_source(src: str):
    import av

    from datasets.video_stream import video_stream
    try:
        container = av.open(src)
    except FileNotFoundError:
        raise DataError(f'video file {src} not found') from None
    except (av.FFmpegError, OSError, UnicodeDecodeError) as e:
        raise DataError(f'video file {src} cannot be opened ({e}): {_REENCODE}') from None
    stream = video_stream(container)
    if stream is None:
        container.close()
        raise DataError(f'video file {src} has no moving video stream: {_REENCODE}')
    return container, stream


def _encoder_options(codec: str, gop: int, crf: int, preset: str, threads: int | None = None) -> dict:
    options = {'g': str(gop)}
    if threads:
        options['threads'] = str(threads)  # x264's bytes depend on its thread count
    if codec in CRF_CODECS:
        options['crf'] = str(crf)
    if codec == 'libvpx-vp9':
        options['b'] = '0'  # constant quality: crf alone
    if codec in PRESET_CODECS:
        options['preset'] = preset
    return options


def reencode_video(src, dst, gop: int = 16, short_side: int | None = 320, codec: str = 'libx264',
                   crf: int = 23, preset: str = 'medium', threads: int | None = None) -> int:
    """Writes ``src``'s frames to ``dst`` (see the module's docstring); returns the
    frame count, checked on the written file. DataError naming ``src`` if it cannot
    be read; ``short_side`` None or 0: the frames' size is kept (made even).
    ``threads``: encoder threads (None: FFmpeg's choice, one per core or so); the
    bytes written can differ between thread counts, so give a fixed one (1) for
    the same bytes on every machine."""
    from datasets.whole_videos import count_frames
    src = os.fspath(src)
    container, stream = _open_source(src)
    try:
        with atomic_path(dst) as tmp:  # removed on an error: a file in DST is whole
            n = _encode(container, stream, src, tmp, short_side,
                        codec, _encoder_options(codec, gop, crf, preset, threads))
            written, _ = count_frames(tmp)
            if written != n:
                raise DataError(f'video file {src}: {n} frames decoded but {written} written: '
                                f'not re-encoded')
    finally:
        container.close()
    return n


def _encode(container, stream, src: str, path, short_side, codec: str, options: dict) -> int:
    """Every frame of ``stream`` encoded into ``path``; returns the count."""
    import av

    from datasets.frame_conversion import frame_array, new_scaler, upright_size
    stream.thread_type = 'AUTO'
    scaler, out, n, last_pts = new_scaler(), None, 0, None
    try:
        for frame in container.decode(stream):
            height, width = upright_size(frame)
            scale = short_side if short_side and min(height, width) > short_side else None
            array = _even(frame_array(frame, 1, scaler, short_side=scale))
            if out is None:
                if min(array.shape[:2]) < 2:
                    raise DataError(f'video file {src}: its {width}x{height} frames are too small '
                                    f'to encode in 4:2:0')
                out, ostream = _output(path, stream, array.shape[:2], codec, options)
                time_base = ostream.codec_context.time_base
            elif array.shape[:2] != (ostream.height, ostream.width):
                raise DataError(f'video file {src} changes its frame size at frame {n} '
                                f'({ostream.width}x{ostream.height} to {array.shape[1]}x'
                                f'{array.shape[0]}): not re-encoded')
            pts = None
            if frame.pts is not None:  # the source's own timestamp (in the stream's time base)
                pts = int(round(frame.pts * (frame.time_base or time_base) / time_base))
            if pts is None or (last_pts is not None and pts <= last_pts):
                pts = 0 if last_pts is None else last_pts + 1  # the encoder needs them to advance
            picture = av.VideoFrame.from_ndarray(array, format='rgb24')
            picture.pts, picture.time_base, last_pts = pts, time_base, pts
            out.mux(ostream.encode(picture))
            n += 1
        if out is None:
            raise DataError(f'video file {src} has no frame to decode: {_REENCODE}')
        out.mux(ostream.encode())
    except av.FFmpegError as e:
        raise DataError(f'video file {src}: decoding or encoding failed after {n} frames ({e}): '
                        f'{_REENCODE}') from None
    finally:
        if out is not None:
            out.close()
    return n


def _output(path: Path, source, size, codec: str, options: dict):
    """The .mp4 container and video stream frames of ``size`` (height, width) are
    encoded into, in the source stream's time base (variable frame rates kept)."""
    import av
    rate = source.average_rate or source.guessed_rate or Fraction(25)
    out = av.open(str(path), 'w', format='mp4')
    stream = out.add_stream(codec, rate=rate, options=options)
    stream.height, stream.width = size
    stream.pix_fmt = 'yuv420p'
    time_base = source.time_base or Fraction(1, 90000)
    stream.codec_context.time_base = time_base
    stream.time_base = time_base
    return out, stream


def video_jobs(src_root: Path, dst_root: Path) -> list[tuple[Path, Path]]:
    """(source, destination) of every video file under src_root, sorted; two
    sources that would write one file (clip.avi and clip.mkv) stop the run."""
    jobs, seen = [], {}
    for root, dirs, files in os.walk(src_root):
        dirs[:] = sorted(d for d in dirs if not d.startswith('.'))
        for name in sorted(files):
            if name.startswith('.') or os.path.splitext(name)[1].lower() not in VIDEO_EXTENSIONS:
                continue
            src = Path(root) / name
            dst = (dst_root / src.relative_to(src_root)).with_suffix('.mp4')
            if dst in seen:
                fail(f'{seen[dst]} and {src} would both be written to {dst}: rename one')
            seen[dst] = src
            jobs.append((src, dst))
    return jobs


def _whole(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'{text!r} is not a whole number') from None
    return value


def parse_args(argv):
    p = Parser(description=__doc__.split('\n\n')[0])
    p.add_argument('src', type=Path, metavar='SRC', help='folder of the videos (any depth)')
    p.add_argument('dst', type=Path, metavar='DST', help='folder of the re-encoded .mp4 files (created)')
    p.add_argument('--gop', type=_whole, default=16,
                   help='a keyframe every N frames (default 16: a 16-frame clip decodes at most 31)')
    p.add_argument('--short_side', type=_whole, default=320,
                   help='scale frames whose short side is longer down to this (default 320; 0: '
                        'keep the size)')
    p.add_argument('--codec', default='libx264',
                   help='FFmpeg video encoder (default libx264; libx265, libvpx-vp9, mpeg4, ...)')
    p.add_argument('--crf', type=_whole, default=23,
                   help=f'constant quality of {", ".join(CRF_CODECS)} (default 23; lower: larger, better)')
    p.add_argument('--preset', default='medium', help='x264/x265 preset (default medium)')
    p.add_argument('--workers', type=int, default=1, help='videos encoded at once (processes; 0: one a core)')
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        check_options(args.gop, args.short_side or None, args.codec, args.crf)
    except OptionError as e:
        fail(str(e))
    if not args.src.is_dir():
        fail(f'SRC {args.src} is not a folder of videos')
    jobs = video_jobs(args.src, args.dst)
    if not jobs:
        fail(f'no video files ({", ".join(VIDEO_EXTENSIONS)}) under {args.src}')
    settings = dict(gop=args.gop, short_side=args.short_side or None, codec=args.codec,
                    crf=args.crf, preset=args.preset)
    run_conversions(jobs, _Job(settings), args.workers, processes=True)
    before = sum(src.stat().st_size for src, _ in jobs)
    after = sum(dst.stat().st_size for _, dst in jobs if dst.exists())
    print(f'{len(jobs)} videos: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB '
          f'({after / max(before, 1):.2f}x)', file=sys.stdout)


class _Job:
    """run_conversions' job (picklable for the worker processes)."""

    def __init__(self, settings):
        self.settings = settings

    def __call__(self, job):
        src, dst = job
        if dst.exists():
            return str(src), 'skipped', ''
        try:
            n = reencode_video(src, dst, **self.settings)
        except DataError as e:
            return str(src), 'failed', str(e)
        return str(src), 'converted', f'{n} frames'


if __name__ == '__main__':
    main()
