"""utils/urls.py's redact_url: one rule for every line, error, file and record
that shows a URL (its credentials hidden, the rest kept)."""
from pathlib import Path

import pytest

from utils.urls import redact_url


@pytest.mark.parametrize('url, shown', [
    ('rtsp://admin:secret@camera:554/live', 'rtsp://admin:***@camera:554/live'),
    ('rtsp://:secret@camera/live', 'rtsp://:***@camera/live'),
    ('RTMP://c:d@h/2', 'RTMP://c:***@h/2'),
    # a password holding '/', '?', '#' or '@': hidden to the URL's last '@'
    ('https://user:pa/ss@host/x', 'https://user:***@host/x'),
    ('https://user:pa?ss@host/x', 'https://user:***@host/x'),
    ('https://user:pa#ss@host/x', 'https://user:***@host/x'),
    ('rtsp://u:p@ss:w@cam/x', 'rtsp://u:***@cam/x'),
    ('rtsp://u:p@ss@cam/x?k=v@w', 'rtsp://u:***@w'),  # an '@' after it: hidden to there, never shown
    ('http://user:1234@host/x', 'http://user:***@host/x'),  # digits, then '@': a password
    # userinfo without a colon: a token, or a user name that cannot be told from one
    ('https://ghp_TOKEN123@github.com/a/b.git', 'https://***@github.com/a/b.git'),
    ('rtsp://admin@camera/live', 'rtsp://***@camera/live'),
    ('https://TO@KEN@host:443/x', 'https://***@host:443/x'),
    # credentials in query or fragment parameters, any case
    ('https://b.s3.amazonaws.com/k.tar?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAX%2F2024%2Fs3'
     '&X-Amz-Date=20240101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host&X-Amz-Security-Token=TOKSESS'
     '&X-Amz-Signature=abcdef0123',
     'https://b.s3.amazonaws.com/k.tar?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=***'
     '&X-Amz-Date=20240101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=***&X-Amz-Security-Token=***'
     '&X-Amz-Signature=***'),
    ('srt://127.0.0.1:9000?mode=caller&passphrase=longpassphrase1', 'srt://127.0.0.1:9000?mode=caller&passphrase=***'),
    ('http://h/live.m3u8?token=T0K&x=1', 'http://h/live.m3u8?token=***&x=1'),
    ('https://a.blob.core.windows.net/c/k?sv=2022-11-02&se=2030&sig=SIGVALUE%3D',
     'https://a.blob.core.windows.net/c/k?sv=2022-11-02&se=2030&sig=***'),
    ('http://h/x?ACCESS_TOKEN=a#b&c=d', 'http://h/x?ACCESS_TOKEN=***&c=d'),  # a '#' in the value too
    ('http://h/cb#access_token=abc&state=1', 'http://h/cb#access_token=***&state=1'),
    ('https://h/x?api_key=K1&Api-Key=K2&apikey=K3&key=K4&password=P&secret=S&auth=A&signature=G&pwd=W',
     'https://h/x?api_key=***&Api-Key=***&apikey=***&key=***&password=***&secret=***&auth=***&signature=***'
     '&pwd=***'),
    ('https://u:p@h/x?token=t', 'https://u:***@h/x?token=***'),
    # kept: nothing secret
    ('http://camera:8080/a@b', 'http://camera:8080/a@b'),  # a port, not a password
    ('http://camera:8080', 'http://camera:8080'),
    ('udp://@239.0.0.1:1234', 'udp://@239.0.0.1:1234'),
    ('tcp://127.0.0.1:5000?listen=1', 'tcp://127.0.0.1:5000?listen=1'),
    ('http://[::1]:8080/a@b', 'http://[::1]:8080/a@b'),
    ('http://host/x?a=b@c', 'http://host/x?a=b@c'),
    ('s3://bucket/prefix@x', 's3://bucket/prefix@x'),
    ('file:///data/a@b:c', 'file:///data/a@b:c'),
    ('https://h/x?page=2&size=10', 'https://h/x?page=2&size=10'),
])
def test_the_rule(url, shown):
    assert redact_url(url) == shown


def test_urls_in_messages():
    assert redact_url('cannot open rtsp://a:b@h/1 nor RTMP://c:d@h/2: refused') == \
        'cannot open rtsp://a:***@h/1 nor RTMP://c:***@h/2: refused'
    assert redact_url("ClientError: 'https://h/k?X-Amz-Signature=abc' failed, see token=1") == \
        "ClientError: 'https://h/k?X-Amz-Signature=***' failed, see token=1"  # only URLs are read
    assert redact_url('"http://t0k@h/x", <srt://h:1?passphrase=p>') == '"http://***@h/x", <srt://h:1?passphrase=***>'
    assert redact_url(Path('video.mp4')) == 'video.mp4'
    assert redact_url('a user:pass@host without a scheme') == 'a user:pass@host without a scheme'
