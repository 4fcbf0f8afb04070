"""URLs made safe to print: a stream, camera or storage URL may carry a
credential (rtsp://user:secret@camera/..., https://TOKEN@host/..., a presigned
URL's ?X-Amz-Signature=..., srt://...?passphrase=...), and messages, logs and
result files must not repeat it.  Standard library only.

The rule (:func:`redact_url`), applied to every scheme://... in a text, a URL
ending at a blank, a quote or '<' '>':

* ``user:password@``: the password becomes ***, whatever it holds ('/', '?',
  '#', '@' included): it runs to the last '@' of the URL.  ``host:8080/...`` is a
  port, not a password (digits, then '/', '?', '#' or the URL's end).
* userinfo without a colon (``https://TOKEN@host/``, ``rtsp://admin@cam/``) is
  hidden whole, ``***@``: a user name cannot be told from a token.  An empty one
  (``udp://@239.0.0.1:1234``, FFmpeg's multicast form) is kept.
* the value of a query or fragment parameter whose name holds sig, token,
  secret, pass, pwd, key, auth, credential, session or cookie (any case:
  X-Amz-Signature, X-Amz-Credential, X-Amz-Security-Token, sig, access_token,
  passphrase, api_key, ...) becomes ***, up to the next '&'.

The scheme, host, port and path are kept, so that a message still says which
stream or bucket it means.  --storage_options are kept by name only
(:func:`storage_option_names`): opts.json, checkpoints and logs never hold their
values."""
import json
import re
from pathlib import Path

_URL = re.compile(r'''(?i)\b[a-z][a-z0-9+.-]*://[^\s'"<>]*''')
# user:password@ (not host:port), or userinfo without a colon
_USERINFO = re.compile(r'(?is)^([a-z][a-z0-9+.-]*://)(?:([^/?#@:\[\]]*):(?!\d*(?:[/?#]|$)).*@|[^/?#:]+@)')
_PARAM = re.compile(r'[?&#;]([^=&#;?/]*)=')
_SECRET_NAMES = ('sig', 'token', 'secret', 'pass', 'pwd', 'key', 'auth', 'credential', 'session', 'cookie')
MASK = '***'


def redact_url(text) -> str:
    """text (a URL, a path, or a message holding URLs) with every credential of
    its URLs replaced by *** (the module's rule)."""
    return _URL.sub(lambda m: _redact_one(m[0]), str(text))


def _redact_one(url):
    m = _USERINFO.match(url)
    if m is not None:
        user = '' if m[2] is None else f'{m[2]}:'
        url = f'{m[1]}{user}{MASK}@{url[m.end():]}'
    out, pos = [], 0
    for p in _PARAM.finditer(url):
        if p.start() < pos or not secret_name(p[1]):
            continue
        end = url.find('&', p.end())
        end = len(url) if end < 0 else end
        out += [url[pos:p.end()], MASK]
        pos = end
    return ''.join(out) + url[pos:]


def secret_name(name) -> bool:
    """A query parameter's (or an option's) name that may carry a credential."""
    name = str(name).lower()
    return any(part in name for part in _SECRET_NAMES)


def redacted(text) -> bool:
    """A URL that redact_url hid something of (one stored by a run, not usable)."""
    text = str(text)
    return '://' in text and any(f'{c}{MASK}' in text for c in (':', '/', '='))


def storage_option_names(options):
    """What opts.json and checkpoints keep of --storage_options: the sorted names of
    the options given (nested ones dotted: client_kwargs.region_name), never their
    values, which may be keys or tokens; None when none were given."""
    if options is None:
        return None
    if isinstance(options, list):  # already names (an opts.json read back)
        return [str(name) for name in options]
    if isinstance(options, str):
        try:
            options = json.loads(options)
        except ValueError:
            return []
    names = []

    def walk(value, path):
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(v, f'{path}.{k}' if path else str(k))
        elif path:
            names.append(path)
    walk(options, '')
    return sorted(names)


def redact_argv(argv) -> str:
    """A command line to show: its URLs redacted, --storage_options' value by name only."""
    shown, after_option = [], False
    for arg in map(str, argv):
        if after_option:
            arg = _names_text(arg)
        elif arg.startswith('--storage_options='):
            arg = '--storage_options=' + _names_text(arg.split('=', 1)[1])
        else:
            arg = redact_url(arg)
        after_option = arg == '--storage_options'
        shown.append(arg)
    return ' '.join(shown)


def _names_text(value):
    return f'<{",".join(storage_option_names(value) or [])}>'


def video_location(text):
    """A command line's video root: a Path, or a URL kept as written (a Path would
    fold its '//' into '/')."""
    return text if '://' in text else Path(text)
