"""utils/urls.py's redact_url: one rule for every line, error, file and record
that shows a URL (its credentials hidden, the rest kept); --storage_options kept
by name only. End to end: a training run given a URL with a password and storage
options holding secrets writes and prints none of them (opts.json, checkpoints,
logs, TensorBoard's events), a run from its opts.json says in one line what to
give again, and predict's and live's error lines hide them."""
import contextlib
import io
import json
import re
from pathlib import Path
from unittest import mock

import pytest
import torch

import main
import predict
from datasets import storage
from tests.conftest import skip_curves, tiny_args
from tests.servers import free_port, http_server
from utils.urls import redact_argv, redact_url, redacted, storage_option_names


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


def test_storage_options_kept_by_name():
    options = {'endpoint_url': 'http://x', 'anon': True, 'client_kwargs': {'headers': {'X-Api-Key': 'S'}}}
    assert storage_option_names(options) == ['anon', 'client_kwargs.headers.X-Api-Key', 'endpoint_url']
    assert storage_option_names(json.dumps(options)) == storage_option_names(options)
    assert storage_option_names(['anon']) == ['anon'] and storage_option_names(None) is None
    assert redact_argv(['main.py', '--video_path', 'http://a:PW@h/', '--storage_options', '{"account_key": "K"}',
                        '--storage_options={"sas_token": "T"}', '--n_epochs', '2']) == \
        'main.py --video_path http://a:***@h/ --storage_options <account_key> --storage_options=<sas_token> ' \
        '--n_epochs 2'
    assert redacted('http://a:***@h/') and redacted('http://h/x?sig=***') and redacted('http://***@h/')
    assert not redacted('http://h/x') and not redacted('/data/***')


# ---------------------------------------------------------------- end to end

SECRETS = ('hunter2secret', 'APIKEYSECRET', 'COOKIESECRET', 'SIGSECRET')
STORAGE_OPTIONS = {'client_kwargs': {'headers': {'X-Api-Key': 'APIKEYSECRET', 'Cookie': 'session=COOKIESECRET'}}}


def assert_no_secret(text, where):
    text = text if isinstance(text, str) else text.decode('latin-1')
    for secret in SECRETS:
        assert secret not in text, f'{secret} in {where}'


@pytest.fixture(scope='module')
def run_with_secrets(tiny_synthetic, tiny_shards, tmp_path_factory, one_torch_thread):
    """(result folder, the run's stdout + stderr, its --video_path) of a run reading
    tiny_shards over HTTP with a password in the URL and secrets in its
    --storage_options, with TensorBoard."""
    result = tmp_path_factory.mktemp('secrets')
    with http_server(tiny_shards) as url, pytest.MonkeyPatch.context() as mp:
        skip_curves(mp)
        location = url.replace('http://', 'http://alice:hunter2secret@') + '/'
        args = tiny_args(location, tiny_synthetic[1], result, '--n_epochs', '1', '--tensorboard',
                         '--storage_options', json.dumps(STORAGE_OPTIONS))
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main.main(args)
    return result, out.getvalue() + err.getvalue(), location


def test_a_run_writes_and_prints_no_credential(run_with_secrets):
    result, printed, location = run_with_secrets
    assert_no_secret(printed, 'the output')
    files = [p for p in result.rglob('*') if p.is_file()]
    assert {'opts.json', 'train.log', 'val.log', 'save_1.pth'} <= {p.name for p in files}
    assert [p for p in files if p.name.startswith('events.out.tfevents')], 'no TensorBoard events'
    for path in files:
        assert_no_secret(path.read_bytes(), path)
    opts = json.loads((result / 'opts.json').read_text())
    assert opts['storage_options'] == ['client_kwargs.headers.Cookie', 'client_kwargs.headers.X-Api-Key']
    assert opts['video_path'] == redact_url(location) == opts['run']['video_path']
    assert opts['video_path'].startswith('http://alice:***@127.0.0.1:')
    stored = torch.load(result / 'save_1.pth', weights_only=True)['opts']
    assert stored['storage_options'] == opts['storage_options'] and stored['video_path'] == opts['video_path']
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    for events in result.rglob('events.out.tfevents*'):
        acc = EventAccumulator(str(events))
        acc.Reload()
        assert_no_secret(repr(acc.Tags()) + repr([acc.Tensors(t) for t in acc.Tags().get('tensors', [])]), events)


def test_a_run_from_its_opts_json_says_what_to_give_again(run_with_secrets, tmp_path, capsys):
    result = run_with_secrets[0]
    with pytest.raises(SystemExit) as e:
        main.main(['--opts_file', str(result / 'opts.json'), '--result_path', str(tmp_path / 'again')])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count('\n') == 1, err
    assert re.match(r'error: --opts_file .*opts\.json: .*--video_path .*--storage_options '
                    r'\(client_kwargs\.headers\.Cookie, client_kwargs\.headers\.X-Api-Key\)', err), err
    assert_no_secret(err, 'the error')


def test_error_lines_hide_credentials(run_with_secrets, tiny_synthetic, tmp_path, capsys):
    checkpoint = run_with_secrets[0] / 'save_1.pth'
    closed = f'127.0.0.1:{free_port()}'
    # a live stream at a presigned URL nobody answers
    stream = f'http://{closed}/live.m3u8?X-Amz-Credential=AK%2FSIGSECRET&X-Amz-Signature=SIGSECRET'
    assert predict.main([str(checkpoint), '--stream', stream, '--reconnect', '0']) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith('error: stream ') and 'X-Amz-Signature=***' in captured.err, captured.err
    assert_no_secret(captured.out + captured.err, 'predict --stream')
    # shards at a URL with a password nobody answers
    shards = f'http://alice:hunter2secret@{closed}/shards'
    status = predict.main([str(checkpoint), shards, '--storage_options', json.dumps(STORAGE_OPTIONS)])
    captured = capsys.readouterr()
    assert status == 2 and 'alice:***@' in captured.err, captured.err
    assert_no_secret(captured.out + captured.err, 'predict on shards')
    # training from S3 at an endpoint with a password nobody answers
    args = tiny_args('s3://bucket/prefix', tiny_synthetic[1], tmp_path / 'r', '--storage_options',
                     json.dumps({'endpoint_url': f'http://bob:hunter2secret@{closed}/?sig=SIGSECRET'}))
    with mock.patch.object(storage, 'BACKOFF_S', 0.01), pytest.raises(SystemExit):
        main.main(args)
    captured = capsys.readouterr()
    assert 'error: ' in captured.err, captured.err
    assert_no_secret(captured.out + captured.err, 'main on S3')


def test_the_result_folder_lock_shows_the_command_without_credentials(monkeypatch):
    """The lock's owner line, which a second run on the folder prints, holds the command line."""
    from utils import result_folder
    monkeypatch.setattr('sys.argv', ['main.py', '--video_path', 'https://alice:hunter2secret@h/x?sig=SIGSECRET',
                                     '--storage_options', json.dumps(STORAGE_OPTIONS)])
    text = result_folder._owner_text()
    assert 'main.py --video_path https://alice:***@h/x?sig=*** --storage_options <client_kwargs.headers' in text
    assert_no_secret(text, 'the lock')


def test_export_says_what_a_checkpoint_does_not_keep():
    """export --calibration reads the checkpoint's video_path and storage options when not given."""
    from argparse import Namespace

    from util_scripts.export_clips import video_root
    from utils.errors import OptionError
    options = Namespace(video_path='https://alice:***@h/shards', dataset='ucf101', storage_options=None,
                        file_type='hdf5')
    with pytest.raises(OptionError, match=r'^c\.pth keeps its run\'s video_path without its credentials '
                                          r'\(https://alice:\*\*\*@h/shards\): give --video_path$'):
        video_root(None, options, 'c.pth')
    options = Namespace(video_path='s3://bucket/shards', dataset='ucf101', storage_options=['endpoint_url'],
                        file_type='hdf5')
    with pytest.raises(OptionError, match=r'only their names \(endpoint_url\) .* give --storage_options again '
                                          r'\(the video_path of c\.pth\)$'):
        video_root(None, options, 'c.pth')
