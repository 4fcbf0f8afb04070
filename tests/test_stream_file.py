"""Tests of util_scripts/stream_file.py, a video file played as a live MPEG-TS stream
(to standard output, UDP and TCP); utils/urls.py's redact_url: tests/test_urls.py.

The producer runs as the command it is, in a subprocess that a timer kills after
LIMIT seconds, so that no test can hang; the consumers are PyAV, as a live
classifier's would be. The files are tiny (tests/video_files.py) and mostly played
faster than their rate (--fps 100), so that each test takes a second or two.
"""
import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import av
import numpy as np
import pytest

from tests.servers import free_port, wait_bound
from tests.video_files import read_code, write_coded_video, write_video

REPO = Path(__file__).resolve().parents[1]
COMMAND = [sys.executable, '-m', 'util_scripts.stream_file']
LIMIT = 30  # seconds after which a producer is killed, whatever it is doing


def start(*args):
    """The producer, started on args; a timer kills it after LIMIT seconds."""
    proc = subprocess.Popen([*COMMAND, *map(str, args)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    timer = threading.Timer(LIMIT, proc.kill)
    timer.daemon = True
    timer.start()
    proc.watchdog = timer
    return proc


def finish(proc):
    """(exit status, stderr text) once the producer has ended."""
    try:
        _, err = proc.communicate(timeout=LIMIT)
    finally:
        proc.kill()
        proc.watchdog.cancel()
    return proc.returncode, err.decode(errors='replace')


def run(*args):
    """(exit status, stderr text) of a producer that is expected to end at once."""
    proc = subprocess.run([*COMMAND, *map(str, args)], cwd=REPO, capture_output=True, timeout=LIMIT)
    return proc.returncode, proc.stderr.decode(errors='replace')


def file_frames(path):
    """The file's own decoded frames, rgb24 arrays."""
    with av.open(str(path)) as container:
        return [f.to_ndarray(format='rgb24') for f in container.decode(video=0)]


def decode(container, limit=None):
    """(rgb24 frames, their pts) of the container's video, up to limit frames; a read
    error (a UDP stream that has gone quiet) ends it, the decoder's last frames kept."""
    frames, times = [], []
    stream = container.streams.video[0]

    def keep(decoded):
        for frame in decoded:
            frames.append(frame.to_ndarray(format='rgb24'))
            times.append(frame.pts)

    try:
        for packet in container.demux(stream):
            keep(stream.decode(packet))
            if limit is not None and len(frames) >= limit:
                return frames[:limit], times[:limit]
    except av.FFmpegError:
        keep(stream.codec_context.decode(None))
    return frames, times


def decode_pipe(proc, limit=None):
    with av.open(proc.stdout, format='mpegts') as container:
        return decode(container, limit)


def assert_frames(frames, reference):
    assert len(frames) == len(reference)
    for i, (frame, ref) in enumerate(zip(frames, reference)):
        assert np.array_equal(frame, ref), f'frame {i} differs from the file\'s'


@pytest.fixture
def clip(tmp_path):
    """A 20-frame 25 fps H.264 mp4 with B-frames, 32x24."""
    return write_video(tmp_path / 'clip.mp4', n_frames=20, width=32, height=24, fps=25)


@pytest.mark.slow  # producer processes streaming in real time
def test_stdout_is_the_files_frames(clip):
    proc = start(clip, '-', '--fps', '100')
    frames, times = decode_pipe(proc)
    status, err = finish(proc)
    assert status == 0, err
    assert err.count('\n') == 1 and err.startswith(f'streaming {clip} (h264 32x24, 25 fps played at 100 fps')
    assert 'stream copy' in err and 'to standard output' in err
    assert_frames(frames, file_frames(clip))
    assert all(b > a for a, b in zip(times, times[1:]))


def read_timed(proc):
    """(all the bytes of proc's stdout, seconds from the first byte to the end)."""
    chunks, first = [], None
    while chunk := os.read(proc.stdout.fileno(), 1 << 16):
        first = time.monotonic() if first is None else first
        chunks.append(chunk)
    return b''.join(chunks), time.monotonic() - first


@pytest.mark.slow  # producer processes streaming in real time
def test_pacing(tmp_path):
    """A 25-frame 25 fps file takes its 0.96 s from the first frame to the last; 50 frames
    at --fps 100 take 0.49 s, their timestamps 1/100 s apart."""
    own = write_video(tmp_path / 'own.mp4', n_frames=25, fps=25)
    fast = write_video(tmp_path / 'fast.mp4', n_frames=50, fps=25)
    spans, steps = [], []
    for path, extra in ((own, ()), (fast, ('--fps', '100'))):
        proc = start(path, '-', *extra)
        data, span = read_timed(proc)
        status, err = finish(proc)
        assert status == 0, err
        with av.open(io.BytesIO(data), format='mpegts') as container:
            frames, times = decode(container)
        assert len(frames) == (25 if path == own else 50)
        spans.append(span)
        steps.append(set(np.diff(times).tolist()))
    assert spans[0] >= 0.8, spans
    assert 0.4 <= spans[1] < min(spans[0], 1.2), spans  # at 25 fps the 50 frames would take 1.96 s
    assert steps == [{3600}, {900}]  # 90 kHz ticks: 1/25 s, then 1/100 s


@pytest.mark.slow  # producer processes streaming in real time
def test_udp(clip):
    port = free_port(socket.SOCK_DGRAM)
    url = f'udp://127.0.0.1:{port}'
    received = {}

    # MPEG-TS has no header: the open reads 5 s of stream (analyzeduration) unless told
    # less; a read that waits over 1 s (timeout's second value) is the stream's end
    options = {'fifo_size': '100000', 'overrun_nonfatal': '1', 'timeout': '10000000',
               'analyzeduration': '200000'}

    def receiver():
        try:
            with av.open(url, format='mpegts', options=options, timeout=(10, 1.0)) as c:
                received['frames'], received['times'] = decode(c)
        except Exception as e:  # reported by the test
            received['error'] = e

    thread = threading.Thread(target=receiver, daemon=True)
    thread.start()
    wait_bound(port, 'udp', timeout=10)
    proc = start(clip, url, '--fps', '50')
    status, err = finish(proc)
    thread.join(timeout=15)
    assert status == 0, err
    assert f'to {url}' in err
    assert 'error' not in received, received.get('error')
    # loopback UDP loses nothing while the receiver keeps up: every frame, as the file's
    assert_frames(received['frames'], file_frames(clip))


def connect(url, limit=10):
    """A PyAV container reading url, connected once the producer listens."""
    deadline = time.monotonic() + limit
    while True:
        try:
            return av.open(url, format='mpegts', timeout=10)
        except (av.FFmpegError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.mark.slow  # producer processes streaming in real time
def test_tcp(clip):
    url = f'tcp://127.0.0.1:{free_port(socket.SOCK_STREAM)}'
    proc = start(clip, url, '--fps', '100')
    try:
        with connect(url) as container:
            frames, _ = decode(container)
    finally:
        status, err = finish(proc)
    assert status == 0, err
    assert f'to {url} (listening, waiting for a client)' in err
    assert_frames(frames, file_frames(clip))


@pytest.mark.slow  # producer processes streaming in real time
def test_loop(tmp_path):
    """--loop: 35 frames of a 10-frame file, the file's again and again, their times
    increasing across the passes; the consumer stops reading and the producer ends."""
    path = write_video(tmp_path / 'short.mp4', n_frames=10, fps=25)
    proc = start(path, '-', '--loop', '--fps', '100')
    frames, times = decode_pipe(proc, limit=35)
    proc.stdout.close()
    status, err = finish(proc)
    assert status == 0, err
    assert 'looped' in err and 'Traceback' not in err
    reference = file_frames(path)
    assert_frames(frames, [reference[i % 10] for i in range(35)])
    assert all(b > a for a, b in zip(times, times[1:]))
    assert set(np.diff(times).tolist()) == {900}  # the passes continue each other at the frame rate


def tcp_client(port, limit=10):
    deadline = time.monotonic() + limit
    while True:
        try:
            return socket.create_connection(('127.0.0.1', port), timeout=5)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.mark.parametrize('kind', ['pipe', 'tcp'])
@pytest.mark.slow  # producer processes streaming in real time
def test_consumer_gone(tmp_path, kind):
    """The consumer goes away after the first bytes of a 2 s file: exit 0 at once,
    no traceback."""
    path = write_video(tmp_path / 'long.mp4', n_frames=50, fps=25)
    port = free_port(socket.SOCK_STREAM)
    began = time.monotonic()
    proc = start(path, '-' if kind == 'pipe' else f'tcp://127.0.0.1:{port}')
    if kind == 'pipe':
        assert proc.stdout.read(188)
        proc.stdout.close()
    else:
        with tcp_client(port) as client:
            assert client.recv(188)
    status, err = finish(proc)
    assert status == 0, err
    assert 'Traceback' not in err and 'Exception' not in err, err
    assert err.count('\n') == 1, err
    assert time.monotonic() - began < 10


@pytest.mark.parametrize('kind,signum', [('udp', signal.SIGINT), ('udp', signal.SIGTERM),
                                         ('tcp', signal.SIGINT)])
@pytest.mark.slow  # producer processes streaming in real time
def test_stopped_by_a_signal(tmp_path, kind, signum):
    """SIGINT or SIGTERM while streaming (--loop to a UDP port nobody reads) or while
    waiting for a TCP client: exit 0, quietly."""
    path = write_video(tmp_path / 'clip.mp4', n_frames=10, fps=25)
    port = free_port(socket.SOCK_DGRAM if kind == 'udp' else socket.SOCK_STREAM)
    proc = start(path, f'{kind}://127.0.0.1:{port}', '--loop')
    line = proc.stderr.readline().decode()
    assert line.startswith('streaming'), line
    time.sleep(0.5)
    proc.send_signal(signum)
    status, err = finish(proc)
    assert status == 0, line + err
    assert err == '', err


@pytest.mark.slow  # producer processes streaming in real time
def test_bad_input(tmp_path):
    missing = tmp_path / 'missing.mp4'
    status, err = run(missing, '-')
    assert status == 2 and err.count('\n') == 1 and err.startswith('error: ') and str(missing) in err, err

    audio = tmp_path / 'audio.wav'
    with av.open(str(audio), 'w') as container:
        stream = container.add_stream('pcm_s16le', rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 800), np.int16), format='s16', layout='mono')
        frame.sample_rate = 8000
        container.mux(stream.encode(frame))
        container.mux(stream.encode())
    status, err = run(audio, '-')
    assert status == 2 and err.count('\n') == 1 and f'error: {audio} has no video stream' in err, err

    clip = write_video(tmp_path / 'clip.mp4')
    for url in ('rtsp://admin:secret@camera/live', 'udp://127.0.0.1', 'tcp://127.0.0.1:5000?timeout=5',
                'out.ts', 'http://127.0.0.1:5000'):
        status, err = run(clip, url)
        assert status == 2 and err.count('\n') == 1 and err.startswith('error: unsupported URL'), (url, err)
        assert 'udp://HOST:PORT' in err and 'secret' not in err, err
    assert 'rtsp://admin:***@camera/live' in run(clip, 'rtsp://admin:secret@camera/live')[1]
    status, err = run(clip, '-', '--fps', '0')
    assert status == 2 and err.startswith('error: --fps'), err


@pytest.mark.parametrize('name,codec,options', [
    ('mjpeg.avi', 'mjpeg', {}),
    ('vp9.webm', 'libvpx-vp9', {'crf': '20', 'b': '0', 'deadline': 'realtime', 'cpu-used': '8'}),
])
@pytest.mark.slow  # producer processes streaming in real time
def test_reencoded(tmp_path, name, codec, options):
    """A codec MPEG-TS does not carry is re-encoded to H.264: every frame arrives, in order
    (each carries its index as a code that survives the lossy coding)."""
    path = write_coded_video(tmp_path / name, codec, 15, options)
    proc = start(path, '-', '--fps', '100')
    frames, times = decode_pipe(proc)
    status, err = finish(proc)
    assert status == 0, err
    assert err.count('\n') == 1 and 're-encoded to H.264' in err, err
    assert [read_code(f) for f in frames] == list(range(15))
    assert set(np.diff(times).tolist()) == {900}
