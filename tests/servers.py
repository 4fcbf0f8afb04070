"""Servers on 127.0.0.1 that tests start: an HTTP file server that answers
byte ranges (FFmpeg reads an .mp4's index, written last, with a range request)."""
import contextlib
import http.server
import os
import re
import threading
from functools import partial

_RANGE = re.compile(r'bytes=(\d*)-(\d*)$')


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """SimpleHTTPRequestHandler plus 'Range: bytes=a-b' (206 Partial Content)."""

    def log_message(self, *args):  # quiet: pytest shows stderr of failures only
        pass

    def send_head(self):
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
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0),
                                             partial(RangeHandler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f'http://127.0.0.1:{server.server_address[1]}'
    finally:
        server.shutdown()
        server.server_close()
