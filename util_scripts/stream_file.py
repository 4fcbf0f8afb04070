"""Play a video file as a live MPEG-TS stream at its own frame rate, so that live
classification can be tried without a camera.

python -m util_scripts.stream_file VIDEO URL [--loop] [--fps F]

    python -m util_scripts.stream_file clip.mp4 udp://127.0.0.1:5000 &
    (then a consumer reads udp://127.0.0.1:5000)

URL is one of
  udp://HOST:PORT  datagrams of 1316 bytes (7 TS packets, as FFmpeg recommends for TS
                   over UDP), sent whether anyone listens or not; a query
                   (?ttl=4&localaddr=...) goes to FFmpeg's udp protocol
  tcp://HOST:PORT  listens on that address and waits for one client, as FFmpeg's
                   tcp://...?listen=1 does (consumers connect as clients, so they can
                   come back to the next run); the wait is done here, so that Ctrl-C
                   ends it
  -                standard output, a pipe into the consumer (... - | consumer)

Only the video stream the loaders read is sent (FFmpeg's pick, never a cover
picture: datasets/video_stream.py); audio and the rest are dropped. A codec that
MPEG-TS carries (h264, hevc, mpeg1video, mpeg2video, mpeg4) is copied packet for
packet, so that the consumer decodes exactly the frames the file's own decoder gives
(what a comparison of live and offline classifications needs); any other (VP8/9,
AV1, MJPEG, ...), or a copy that would show frames the file hides (an edit list
cutting its first frames), is re-encoded to H.264 (libx264, yuv420p, zerolatency),
which the start line says.

Each packet is written when the wall clock reaches its decoding time since the start
(as ffmpeg -re does): a 2 s file takes 2 s. --fps F plays the frames at F a second
instead, their timestamps rescaled (a stream faster than the model, say); --loop plays
the file again and again until stopped, each pass's timestamps continuing the last's.

SIGINT, SIGTERM or the consumer going away (a closed pipe, a dropped connection) end
it with exit status 0, the muxer closed where it still can be. A missing file, one
without video, or another form of URL: one line "error: ...", exit status 2.
As a command it parses its arguments before PyAV is imported (-h answers at once).
"""
# ruff: noqa: E402 -- the imports after the command-line parse are meant to be there
import math
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from datasets.video_stream import only_pictures, video_stream
from utils.cli import Parser
from utils.errors import DataError
from utils.urls import redact_url

URL_FORMS = 'udp://HOST:PORT, tcp://HOST:PORT (listened on for one client) or - (standard output)'
COPY_CODECS = ('h264', 'hevc', 'mpeg1video', 'mpeg2video', 'mpeg4')  # what MPEG-TS carries and decoders read
HEADERS_IN_BAND = ('mpeg1video', 'mpeg2video', 'mpeg4')  # their extradata must be repeated at keyframes in TS
UDP_PACKET = 1316  # 7 x 188-byte TS packets: what fits a 1500-byte Ethernet frame
TICKS = 90000  # MPEG-TS timestamps count 90 kHz ticks
SCAN_PACKETS = 64  # the packets looked at before a copy is chosen (an edit list hides the first ones)
X264_OPTIONS = {'preset': 'veryfast', 'tune': 'zerolatency', 'crf': '18'}


def url_kind(url):
    """'udp', 'tcp' or 'stdout' for the URL forms accepted, else None."""
    if url == '-':
        return 'stdout'
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a port that is no number, or out of range
        return None
    if parts.scheme not in ('udp', 'tcp') or not parts.hostname or not port or parts.path not in ('', '/'):
        return None
    if parts.scheme == 'tcp' and (parts.query not in ('', 'listen=1') or parts.fragment):
        return None  # the listening is done here: other FFmpeg tcp options would be ignored
    return parts.scheme


def parse_args(argv):
    p = Parser(prog='python -m util_scripts.stream_file',
               description='Play a video file as a live MPEG-TS stream at its own frame rate '
                           '(to try live classification without a camera).')
    p.add_argument('video', type=Path, metavar='VIDEO', help='the video file to play')
    p.add_argument('url', metavar='URL', help=f'where to send it: {URL_FORMS}')
    p.add_argument('--loop', action='store_true',
                   help='play the file again and again, timestamps continuing, until stopped')
    p.add_argument('--fps', type=float, default=None, metavar='F',
                   help="play the frames at F frames a second instead of the file's own rate")
    args = p.parse_args(argv)
    if args.fps is not None and not (args.fps > 0 and math.isfinite(args.fps)):
        p.error(f'--fps must be a positive number of frames a second, not {args.fps:g}')
    if url_kind(args.url) is None:
        p.error(f'unsupported URL {redact_url(args.url)!r}: give {URL_FORMS}')
    return args


if __name__ == '__main__':
    COMMAND_LINE = parse_args(None)

import av
from av.bitstream import BitStreamFilterContext

OUT_TIME_BASE = Fraction(1, TICKS)


class Stopped(Exception):
    """SIGINT or SIGTERM. An Exception, not a BaseException, so that PyAV passes it
    on when it arrives inside one of its write callbacks."""


def _stop(signum, frame):
    raise Stopped(signal.Signals(signum).name)


@dataclass
class Source:
    path: Path
    codec: str  # FFmpeg's name of the codec (not of the decoder PyAV picked)
    width: int
    height: int
    fps: float  # the file's average frame rate
    seconds: float | None  # its duration, when the container knows it
    problem: str  # why it is re-encoded; '' for a stream copy

    @property
    def copy(self):
        return not self.problem


def probe(path):
    """The file's video stream (FFmpeg's pick, as the loader's) as a Source; DataError
    when it cannot be played."""
    if not path.is_file():
        raise DataError(f'{path}: no such file' if not path.exists() else f'{path} is not a file')
    try:
        with av.open(str(path)) as container:
            stream = video_stream(container)
            if stream is None:
                raise DataError(f'{path} has no video stream' +
                                (', only a still picture (a cover)' if only_pictures(container) else ''))
            codec = stream.codec_context.codec.canonical_name
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate or 25
            if stream.duration:
                seconds = float(stream.duration * stream.time_base)
            else:
                seconds = container.duration / 1e6 if container.duration else None
            if seconds is not None and seconds * rate < 1:
                seconds = None  # a guess gone wrong (an MPEG-PS file's, say): not even a frame
            problem = copy_problem(container, stream, codec)
            return Source(path, codec, stream.codec_context.width, stream.codec_context.height,
                          float(rate), seconds, problem)
    except (av.FFmpegError, UnicodeDecodeError) as e:
        raise DataError(f'{path} cannot be read as a video: {e}') from None


def copy_problem(container, stream, codec):
    """Why the stream cannot be copied into MPEG-TS as it is ('' when it can)."""
    if codec not in COPY_CODECS:
        return f'{codec} does not go in MPEG-TS'
    decode_times = False
    for i, packet in enumerate(container.demux(stream)):
        if i == SCAN_PACKETS:
            break
        if packet.is_discard:
            return 'an edit list hides its first frames, which a copy would show'
        if packet.size and packet.pts is None and packet.dts is None:
            return 'its packets have no timestamps'
        decode_times = decode_times or packet.dts is not None
    return '' if decode_times else 'its packets carry no decoding times'


def describe(source, args):
    """The start line: what is played, how, and where to."""
    length = f'{source.seconds:.1f} s' if source.seconds is not None else 'length unknown'
    rate = f'{source.fps:g} fps' + (f' played at {args.fps:g} fps' if args.fps else '')
    how = 'stream copy' if source.copy else f're-encoded to H.264: {source.problem}'
    where = redact_url(args.url) if args.url != '-' else 'standard output'
    wait = ' (listening, waiting for a client)' if url_kind(args.url) == 'tcp' else ''
    loop = ', looped' if args.loop else ''
    return (f'streaming {source.path} ({source.codec} {source.width}x{source.height}, {rate}, {length}, '
            f'{how}{loop}) to {where}{wait}')


class Sink:
    """A write-only file for PyAV that passes each write on at once: a live stream
    must not wait in a buffer."""

    def __init__(self, write, flush=None):
        self._write, self._flush = write, flush

    def write(self, data):
        self._write(data)
        if self._flush is not None:
            self._flush()
        return len(data)


def udp_url(url):
    """url with FFmpeg's udp pkt_size set to 1316 bytes, unless its query sets one."""
    parts = urlsplit(url)
    if 'pkt_size' in parse_qs(parts.query):
        return url
    return f'{url.rstrip("?&")}{"&" if parts.query else "?"}pkt_size={UDP_PACKET}'


def accept_client(url):
    """Listen on url's address and wait for one client (a signal ends the wait:
    FFmpeg's own listen=1 blocks in C, where Python's signal handlers cannot run)."""
    parts = urlsplit(url)
    family = socket.getaddrinfo(parts.hostname, parts.port, type=socket.SOCK_STREAM,
                                flags=socket.AI_PASSIVE)[0][0]
    with socket.create_server((parts.hostname, parts.port), family=family) as server:
        client, _ = server.accept()
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client


def open_output(url, kind):
    """(the MPEG-TS muxer writing to url, the client socket to close after it or None)."""
    flush = {'flush_packets': '1'}  # each packet out at once: a live stream, not a file
    if kind == 'udp':
        return av.open(udp_url(url), 'w', format='mpegts', container_options=flush), None
    if kind == 'stdout':
        out = sys.stdout.buffer
        return av.open(Sink(out.write, out.flush), 'w', format='mpegts', container_options=flush), None
    client = accept_client(url)
    return av.open(Sink(client.sendall), 'w', format='mpegts', container_options=flush), client


def add_output_stream(muxer, source, template, args):
    """The muxer's video stream: the file's, copied, or a libx264 encoder's."""
    if source.copy:
        return muxer.add_stream_from_template(template)
    rate = Fraction(args.fps or source.fps).limit_denominator(1001)
    stream = muxer.add_stream('libx264', rate=rate, options=dict(X264_OPTIONS))
    # 4:2:0 needs an even width and height
    stream.width, stream.height = max(2, source.width & ~1), max(2, source.height & ~1)
    stream.pix_fmt = 'yuv420p'
    stream.codec_context.time_base = OUT_TIME_BASE
    return stream


class Clock:
    """Maps a pass's timestamps (seconds) onto the output's 90 kHz ticks, --fps
    rescaling them and each pass starting where the last ended, and waits for each."""

    def __init__(self, scale):
        self.start = time.monotonic()
        self.scale = scale  # the file's frame rate over --fps (1 without it)
        self.offset = 0  # ticks: where the pass starts
        self.origin = None  # seconds: the pass's first timestamp
        self.first = self.end = None  # ticks: the pass's first presentation time, and its last's end

    def new_pass(self):
        if self.end is not None:
            self.offset += self.end - self.first
        self.origin = self.first = self.end = None

    def ticks(self, seconds):
        if seconds is None:
            return None
        if self.origin is None:
            self.origin = seconds
        return round((seconds - self.origin) * self.scale * TICKS) + self.offset

    def shown(self, pts, duration):
        """Note a frame shown at pts (ticks) for duration ticks: the pass's extent."""
        self.first = pts if self.first is None else min(self.first, pts)
        self.end = pts + duration if self.end is None else max(self.end, pts + duration)

    def wait(self, ticks):
        delay = self.start + ticks / TICKS - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def seconds_of(ts, time_base):
    return None if ts is None else float(ts * time_base)


def copy_pass(source, muxer, out_stream, clock):
    """Write one pass over the file's packets, retimed, each at its time."""
    frame_ticks = round(clock.scale * TICKS / source.fps)
    with av.open(str(source.path)) as container:
        stream = video_stream(container)
        time_base = stream.time_base
        headers = None
        if source.codec in HEADERS_IN_BAND and stream.codec_context.extradata:
            headers = BitStreamFilterContext('dump_extra', stream)  # MPEG-TS has no global header
        step = round(1 / (source.fps * time_base)) or 1
        for packet, dts in decode_times(container.demux(stream), step):
            dts = clock.ticks(seconds_of(dts, time_base))
            pts = clock.ticks(seconds_of(packet.pts, time_base))
            duration = round(packet.duration * time_base * clock.scale * TICKS) if packet.duration else None
            for out in headers.filter(packet) if headers is not None else [packet]:
                out.time_base = OUT_TIME_BASE
                out.pts, out.dts, out.duration = pts, dts, duration
                out.stream = out_stream
                if pts is not None:
                    clock.shown(pts, duration or frame_ticks)
                clock.wait(dts)
                muxer.mux_one(out)


def decode_times(packets, step):
    """(packet, decoding time) for the packets, the times the demuxer left out filled
    in: a Matroska file's first packets have none (theirs come before the first known
    one, step apart), a later one follows the last one's."""
    waiting, last = [], None
    for packet in packets:
        if packet.pts is None and packet.dts is None:
            continue  # the empty packet that ends the demuxing
        if packet.dts is None and last is None and len(waiting) < SCAN_PACKETS:
            waiting.append(packet)
            continue
        dts = packet.dts if packet.dts is not None else (last + step if last is not None else packet.pts)
        for i, early in enumerate(waiting):
            yield early, dts - (len(waiting) - i) * step
        waiting = []
        yield packet, dts
        last = dts
    for early in waiting:  # none anywhere (copy_problem lets no such file through)
        yield early, early.pts


def encode_pass(source, muxer, out_stream, clock):
    """Write one pass over the file's frames, decoded, retimed and encoded to H.264."""
    frame_ticks = round(clock.scale * TICKS / source.fps)
    last = None
    with av.open(str(source.path)) as container:
        stream = video_stream(container)
        for i, frame in enumerate(container.decode(stream)):
            seconds = frame.time if frame.pts is not None else i / source.fps
            pts = clock.ticks(seconds)
            pts = pts if last is None or pts > last else last + 1  # the encoder needs them increasing
            last = pts
            image = frame.reformat(width=out_stream.width, height=out_stream.height, format='yuv420p')
            image.pts, image.time_base = pts, OUT_TIME_BASE
            clock.shown(pts, frame_ticks)
            write_paced(muxer, out_stream.encode(image), clock)


def write_paced(muxer, packets, clock):
    for packet in packets:
        ts = packet.dts if packet.dts is not None else packet.pts
        clock.wait(round(ts * packet.time_base * TICKS))
        muxer.mux_one(packet)


def play(source, muxer, out_stream, args):
    """Stream the file once, or again and again with --loop."""
    clock = Clock(source.fps / args.fps if args.fps else 1.0)
    one_pass = copy_pass if source.copy else encode_pass
    while True:
        clock.new_pass()
        one_pass(source, muxer, out_stream, clock)
        if not args.loop or clock.end is None:  # a pass without a frame would loop for nothing
            break
    if not source.copy:
        write_paced(muxer, out_stream.encode(None), clock)


def close_quietly(muxer, client):
    """Close the muxer (its last packets, when the consumer still takes them) and the
    connection; errors of a consumer already gone are no news."""
    for close in (muxer.close if muxer is not None else None, client.close if client is not None else None):
        if close is None:
            continue
        try:
            close()
        except (OSError, av.FFmpegError, ValueError, Stopped):
            pass


def main(args):
    kind = url_kind(args.url)
    if kind == 'stdout' and sys.stdout.isatty():
        fail('standard output is a terminal: pipe it into a consumer (... - | consumer), '
             'or give udp://HOST:PORT or tcp://HOST:PORT')
    try:
        source = probe(args.video)
    except DataError as e:
        fail(e)
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    print(describe(source, args), file=sys.stderr, flush=True)
    muxer = client = None
    try:
        with av.open(str(source.path)) as container:  # the template of a stream copy
            template = video_stream(container)
            muxer, client = open_output(args.url, kind)
            out_stream = add_output_stream(muxer, source, template, args)
        play(source, muxer, out_stream, args)
    except Stopped:
        pass
    except ConnectionError:  # BrokenPipeError, ConnectionResetError: the consumer is gone
        if kind == 'stdout':  # nor may the interpreter's last flush of stdout complain
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, av.FFmpegError) as e:
        fail(f'cannot stream {source.path} to {redact_url(args.url)}: {e}', status=1)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        close_quietly(muxer, client)
    return 0


def fail(message, status=2):
    print(f'error: {message}', file=sys.stderr, flush=True)
    raise SystemExit(status)


if __name__ == '__main__':
    sys.exit(main(COMMAND_LINE))
