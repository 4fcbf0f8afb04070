"""URLs made safe to print: a stream or camera URL may carry a password
(rtsp://user:secret@camera/...), and messages, logs and result files must not
repeat it. Standard library only."""
import re
from pathlib import Path

# scheme://user:password@ -- the password runs to the last '@' before the path, query,
# fragment or a blank, so that an unescaped '@' in it is hidden as well.
_CREDENTIALS = re.compile(r'(?i)\b([a-z][a-z0-9+.-]*://[^\s/?#@:]*):[^\s/?#]*@')


def redact_url(text) -> str:
    """text (a URL, or a message holding URLs) with the password of every
    scheme://user:password@ in it replaced by ***; the user name and the
    rest are kept, so that the message still says which stream it means."""
    return _CREDENTIALS.sub(r'\1:***@', str(text))


def video_location(text):
    """A command line's video root: a Path, or a URL kept as written (a Path would
    fold its '//' into '/')."""
    return text if '://' in text else Path(text)
