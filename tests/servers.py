"""Servers on 127.0.0.1 that tests start: an HTTP file server that answers
byte ranges (FFmpeg reads an .mp4's index, written last, with a range request),
and the same server answering its first requests with an error status (a
flaky server, for the retries of datasets/storage.py); a free port, and a wait
for another process's socket on one."""
import contextlib
import http.server
import os
import re
import socket
import threading
import time
from functools import partial
from pathlib import Path

_RANGE = re.compile(r'bytes=(\d*)-(\d*)$')


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """SimpleHTTPRequestHandler plus 'Range: bytes=a-b' (206 Partial Content)."""

    def log_message(self, *args):  # quiet: pytest shows stderr of failures only
        pass

    def send_head(self):
        faults = getattr(self, 'faults', None)
        if faults is not None and faults['match'] in self.path:
            time.sleep(faults['delay'])
            with faults['lock']:
                faults['requests'] += 1
                fail = faults['requests'] <= faults['failures']
            if fail and faults['status'] == 'drop':  # the connection closed, no answer
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return None
            if fail:
                self.send_error(faults['status'], 'injected fault')
                return None
        match = _RANGE.match(self.headers.get('Range', ''))
        path = self.translate_path(self.path)
        if match is None or not os.path.isfile(path):
            return super().send_head()
        size = os.path.getsize(path)
        first = int(match[1]) if match[1] else max(0, size - int(match[2] or 0))
        last = min(int(match[2]), size - 1) if match[1] and match[2] else size - 1
        if first >= size:
            self.send_error(416, 'range not satisfiable')
            return None
        f = open(path, 'rb')
        f.seek(first)
        self.send_response(206)
        self.send_header('Content-Type', self.guess_type(path))
        self.send_header('Accept-Ranges', 'bytes')
        self.send_header('Content-Range', f'bytes {first}-{last}/{size}')
        self.send_header('Content-Length', str(last - first + 1))
        self.end_headers()
        self._remaining = last - first + 1
        return f

    def copyfile(self, source, outputfile):
        remaining = getattr(self, '_remaining', None)
        if remaining is None:
            return super().copyfile(source, outputfile)
        while remaining > 0:
            chunk = source.read(min(65536, remaining))
            if not chunk:
                break
            outputfile.write(chunk)
            remaining -= len(chunk)


@contextlib.contextmanager
def http_server(folder):
    """http://127.0.0.1:PORT serving ``folder`` (with byte ranges) in a thread."""
    with _serve(partial(RangeHandler, directory=str(folder))) as url:
        yield url


class FaultyHandler(RangeHandler):
    def __init__(self, *args, faults, **kwargs):
        self.faults = faults
        super().__init__(*args, **kwargs)


@contextlib.contextmanager
def faulty_http_server(folder, failures, status=503, match='', delay=0.0):
    """(URL, faults) of a server of ``folder`` whose first ``failures`` requests
    for a path holding ``match`` get ``status`` (``'drop'``: the connection is
    closed unanswered), each such request answered after ``delay`` seconds;
    faults['requests'] counts those requests."""
    faults = {'lock': threading.Lock(), 'requests': 0, 'failures': failures, 'status': status, 'match': match,
              'delay': delay}
    with _serve(partial(FaultyHandler, directory=str(folder), faults=faults)) as url:
        yield url, faults


@contextlib.contextmanager
def _serve(handler):
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={'poll_interval': 0.05}, daemon=True)
    thread.start()
    try:
        yield f'http://127.0.0.1:{server.server_address[1]}'
    finally:
        server.shutdown()
        server.server_close()


S3_ENV = {'AWS_ACCESS_KEY_ID': 'testing', 'AWS_SECRET_ACCESS_KEY': 'testing', 'AWS_DEFAULT_REGION': 'us-east-1',
          'AWS_CONFIG_FILE': os.devnull, 'AWS_SHARED_CREDENTIALS_FILE': os.devnull}


@contextlib.contextmanager
def s3_server(folder):
    """(s3://bucket-PORT/prefix, storage_options) of ``folder`` uploaded to moto's S3
    server on 127.0.0.1 (the way s3fs's own tests reach S3), with S3_ENV's fake
    credentials in os.environ meanwhile (and AWS_PROFILE, AWS_SESSION_TOKEN unset).
    The bucket is named by the port: moto's servers in one process share their buckets.
    ``s3_server.last_server``: the server, for a test that stops it early."""
    import logging

    from moto.server import ThreadedMotoServer
    from s3fs import S3FileSystem
    logging.getLogger('werkzeug').setLevel(logging.ERROR)
    port = free_port()
    prefix = f'bucket-{port}/prefix'
    server = s3_server.last_server = ThreadedMotoServer(ip_address='127.0.0.1', port=port, verbose=False)
    server.start()
    saved = {name: os.environ.get(name) for name in (*S3_ENV, 'AWS_PROFILE', 'AWS_SESSION_TOKEN')}
    os.environ.update(S3_ENV)
    for name in ('AWS_PROFILE', 'AWS_SESSION_TOKEN'):
        os.environ.pop(name, None)
    try:
        options = {'endpoint_url': f'http://127.0.0.1:{port}'}
        fs = S3FileSystem(skip_instance_cache=True, **options)
        fs.mkdir(prefix.split('/')[0])
        fs.put(str(folder) + '/', prefix + '/', recursive=True)
        yield f's3://{prefix}', options
    finally:
        with contextlib.suppress(Exception):  # a test may have stopped it already
            server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def free_port(kind=socket.SOCK_STREAM):
    """A port of 127.0.0.1 free now (SOCK_DGRAM: for UDP)."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def wait_bound(port, proto, timeout=30):
    """Until a socket of this machine is bound to port (tcp: listening), read from
    Linux's /proc/net: probing with a bind of our own could take the port from
    under the process that is about to bind it."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            lines = Path(f'/proc/net/{proto}').read_text().splitlines()[1:]
        except OSError:  # not Linux: give the other process a moment
            time.sleep(0.5)
            return
        for line in lines:
            fields = line.split()
            if int(fields[1].split(':')[1], 16) == port and (proto == 'udp' or fields[3] == '0A'):
                return
        time.sleep(0.02)
    raise AssertionError(f'nothing bound to {proto} port {port} after {timeout} s')
