"""datasets/storage.py: ShardStore reads shards made by util_scripts.make_shards
from a folder, an HTTP server and S3 (moto's server) on 127.0.0.1: the same bytes
everywhere, retries of a flaky server, one-line errors, fork safety, pickling,
the local cache (never serving a shard made again), storage_options without
credentials and never in a message, missing S3 credentials said in one line."""
import hashlib
import io
import json
import multiprocessing
import os
import pickle
import shutil
import time
from unittest import mock

import pytest

from datasets.shards import INDEX_JSON, INDEX_NPZ, ShardIndex, file_sha256
from datasets.storage import ShardStore, check_storage_options
from tests.servers import faulty_http_server, http_server, s3_server
from util_scripts import make_shards
from utils.errors import USER_ERRORS, DataError, OptionError, StorageError

FAST = {'retries': 4, 'backoff': 0.01}


@pytest.fixture(scope='module')
def shards(tiny_synthetic, tmp_path_factory):
    """(folder of shards, {REL: payload bytes} read with plain file reads)."""
    video_path, annotation = tiny_synthetic
    out = tmp_path_factory.mktemp('storage') / 'shards'
    argv = [str(annotation), str(video_path), str(out), '--dataset', 'ucf101', '--no_progress',
            '--file_type', 'jpg', '--shard_size', '100KB']
    make_shards.main(argv)
    index = ShardIndex.load(out)
    payloads = {}
    for rel in index.paths:
        shard, offset, size = index.lookup(str(rel))
        with open(out / shard, 'rb') as f:
            f.seek(offset)
            payloads[str(rel)] = f.read(size)
    assert len(index.shard_names) > 2
    return out, payloads


@pytest.fixture(scope='module')
def http_url(shards):
    with http_server(shards[0]) as url:
        yield url


def digests(store, rels):
    return {rel: hashlib.sha256(store.read_member(rel)).hexdigest() for rel in rels}


def test_local_and_http_reads_equal_the_files(shards, http_url):
    folder, payloads = shards
    for store in (ShardStore(folder), ShardStore(http_url + '/', **FAST)):
        assert len(store.index()) == len(payloads)
        assert store.index() is store.index()  # loaded once
        assert {rel: store.read_member(rel) for rel in payloads} == payloads
        assert store.read_file(INDEX_JSON) == (folder / INDEX_JSON).read_bytes()
        assert store.read_range(INDEX_NPZ, 3, 10) == (folder / INDEX_NPZ).read_bytes()[3:13]


def test_a_video_the_index_lacks(shards, http_url):
    with pytest.raises(DataError) as e:
        ShardStore(http_url).read_member('grow/no_such_video')
    message = str(e.value)
    assert '\n' not in message and 'grow/no_such_video' in message and 'make_shards' in message


def truncated_copy(folder, dest):
    """A copy of the shard folder whose second shard lost its second half; a
    video of that shard that is now cut short."""
    shutil.copytree(folder, dest)
    index = ShardIndex.load(dest)
    shard = index.shard_names[1]
    with open(dest / shard, 'r+b') as f:
        f.truncate(os.path.getsize(dest / shard) // 2)
    rel = [str(r) for r in index.paths if index.lookup(str(r))[0] == shard][-1]
    return shard, rel


def test_a_truncated_shard_is_a_one_line_data_error(shards, tmp_path):
    shard, rel = truncated_copy(shards[0], tmp_path / 'cut')
    with http_server(tmp_path / 'cut') as url:
        stores = (ShardStore(tmp_path / 'cut'), ShardStore(url, **FAST))
        for store, read in [(s, s.read_member) for s in stores] + [(s, s.open_member) for s in stores]:
            with pytest.raises(DataError) as e:
                read(rel)
            message = str(e.value)
            assert '\n' not in message and shard in message and rel in message
            assert 'truncated' in message and 're-upload' in message and 'make_shards' in message
            assert not isinstance(e.value, StorageError)


def test_a_local_member_file_reads_its_byte_range(shards):
    """open_member of a local shard: a file of its own over the member (seek, read,
    readinto), the same bytes as the payload; from a URL the payload in memory."""
    folder, payloads = shards
    store = ShardStore(folder)
    for rel in sorted(payloads)[:4]:
        payload = payloads[rel]
        with store.open_member(rel) as f:
            assert f.read() == payload and f.read(10) == b''
            assert f.seek(-5, os.SEEK_END) == len(payload) - 5 and f.read() == payload[-5:]
            f.seek(100)
            assert f.read(7) == payload[100:107] and f.tell() == 107
            buffer = bytearray(9)
            assert f.readinto(buffer) == 9 and bytes(buffer) == payload[107:116]
        assert f.closed
    with pytest.raises(DataError, match='no video'):
        store.open_member('no/such_video')


def test_a_cached_member_is_read_from_its_file(shards, http_url, tmp_path):
    folder, payloads = shards
    store = ShardStore(http_url, cache_dir=tmp_path / 'cache', **FAST)
    rel = sorted(payloads)[2]
    first = store.open_member(rel)
    assert isinstance(first, io.BytesIO) and first.read() == payloads[rel] and store.cache_misses == 1
    with store.open_member(rel) as again:  # the cache's file, read in part by the decoders
        assert again.fileno() >= 0 and again.read() == payloads[rel]
    assert (store.cache_hits, store.cache_misses) == (1, 1)


def test_a_flaky_server_is_retried(shards):
    folder, payloads = shards
    rel = sorted(payloads)[5]
    with faulty_http_server(folder, failures=2) as (url, faults):
        store = ShardStore(url, storage_options={}, **FAST)
        assert store.read_file(INDEX_JSON) == (folder / INDEX_JSON).read_bytes()
        assert faults['requests'] == 3
        assert store.read_member(rel) == payloads[rel]
    with faulty_http_server(folder, failures=5) as (url, faults):
        with pytest.raises(StorageError) as e:
            ShardStore(url, retries=1, backoff=0.01).read_file(INDEX_JSON)
        assert faults['requests'] == 2
        assert f'{url}/{INDEX_JSON}' in str(e.value) and '503' in str(e.value) and '2 tries' in str(e.value)


def test_not_found_is_not_retried(shards):
    with faulty_http_server(shards[0], failures=0) as (url, faults):
        start = time.monotonic()
        with pytest.raises(StorageError, match='not found: check --video_path'):
            ShardStore(url + '/elsewhere', retries=4, backoff=5).index()
        assert faults['requests'] == 1 and time.monotonic() - start < 4
    with pytest.raises(StorageError, match='not found'):
        ShardStore(shards[0]).read_range('shard-999999.tar', 0, 10)


def test_a_server_gone_is_a_storage_error_naming_the_url(shards):
    with http_server(shards[0]) as url:
        store = ShardStore(url.replace('http://', 'http://user:hunter2@'), **FAST)
        rel = str(store.index().paths[0])
    with pytest.raises(StorageError) as e:
        store.read_member(rel)
    message = str(e.value)
    assert '\n' not in message and f'{url[7:]}/shard-000000.tar' in message and 'after 5 tries' in message
    assert 'hunter2' not in message and 'user:***@' in message
    assert StorageError in USER_ERRORS and not isinstance(e.value, DataError)


def _child(store, rels, queue):
    inherited = store._fs
    try:
        found = digests(store, rels)
    except Exception as e:  # noqa: BLE001 - told to the parent, which fails at once
        found = f'{type(e).__name__}: {e}'
    fs = store._fs
    queue.put((os.getpid(), store._pid, getattr(fs, '_pid', None), fs is not inherited or fs is None, found))


def run_forked(target, arg_lists):
    """target(*args, queue) in a forked child per args; (what each put on the
    queue, in the order they came, the children's pids), each child exited 0."""
    ctx = multiprocessing.get_context('fork')
    queue = ctx.Queue()
    children = [ctx.Process(target=target, args=(*args, queue)) for args in arg_lists]
    for c in children:
        c.start()
    reports = [queue.get(timeout=30) for _ in children]
    for c in children:
        c.join(10)
        assert c.exitcode == 0
    return reports, {c.pid for c in children}


def read_in_forked_children(store, payloads, rels):
    """Read ``rels`` in two forked children of a store the parent used; their
    (pid, the store's pid, its filesystem's pid, a new filesystem) reports."""
    reports, pids = run_forked(_child, [(store, rels[i::2]) for i in range(2)])
    assert {r[0] for r in reports} == pids
    for *_, found in reports:
        assert isinstance(found, dict), found
        assert found == {rel: hashlib.sha256(payloads[rel]).hexdigest() for rel in found}
    assert sum(len(r[-1]) for r in reports) == len(rels)
    return [r[:4] for r in reports]


def check_forked_reads(store, payloads):
    rels = sorted(payloads)[:8]
    assert store.read_member(rels[0]) == payloads[rels[0]]  # the parent's session is live at the fork
    parent_fs = store.filesystem()
    for pid, store_pid, fs_pid, new_fs in read_in_forked_children(store, payloads, rels):
        assert store_pid == pid and fs_pid == pid and new_fs  # each child made its own filesystem
    assert store.filesystem() is parent_fs and store._pid == os.getpid()
    assert {rel: store.read_member(rel) for rel in rels} == {rel: payloads[rel] for rel in rels}


def test_forked_children_make_their_own_connections(shards, http_url):
    check_forked_reads(ShardStore(http_url, **FAST), shards[1])


def test_local_reads_in_forked_children(shards):
    store = ShardStore(shards[0])
    rels = sorted(shards[1])[:6]
    assert store.read_member(rels[0]) == shards[1][rels[0]]
    reports = read_in_forked_children(store, shards[1], rels)
    assert [(r[0], r[1], r[2]) for r in reports] == [(r[0], r[0], None) for r in reports]


def test_a_store_pickles(shards, http_url):
    store = ShardStore(http_url, storage_options={'headers': {'X-Test': '1'}}, **FAST)
    rel = sorted(shards[1])[3]
    assert store.read_member(rel) == shards[1][rel]
    copy = pickle.loads(pickle.dumps(store))
    assert copy._fs is None and copy.storage_options == store.storage_options
    assert copy._index is not None  # a spawned loader worker does not fetch the index again
    assert copy.read_member(rel) == shards[1][rel] and copy.retries == 4


def test_the_cache(shards, tmp_path):
    folder, payloads = shards
    rels = sorted(payloads)
    store = ShardStore(folder, cache_dir=tmp_path / 'cache')
    assert store.read_member(rels[0]) == payloads[rels[0]]
    assert (store.cache_hits, store.cache_misses) == (0, 1)
    assert store.read_member(rels[0]) == payloads[rels[0]]
    assert (store.cache_hits, store.cache_misses) == (1, 1)
    assert len(os.listdir(tmp_path / 'cache')) == 1
    bound = 3 * max(len(p) for p in payloads.values())
    small = ShardStore(folder, cache_dir=tmp_path / 'small', cache_bytes=bound)
    for rel in rels + rels[:5]:
        assert small.read_member(rel) == payloads[rel]
        used = sum(f.stat().st_size for f in (tmp_path / 'small').iterdir())
        assert used <= bound
    assert small.cache_misses == len(rels) + 5 and os.listdir(tmp_path / 'small')
    assert not [n for n in os.listdir(tmp_path / 'small') if n.endswith('.tmp')]


def _cache_child(folder, cache, bound, rels, queue):
    store = ShardStore(folder, cache_dir=cache, cache_bytes=bound)
    queue.put({rel: hashlib.sha256(store.read_member(rel)).hexdigest() for rel in rels})


def test_the_cache_shared_by_two_processes(shards, tmp_path):
    """Two processes filling one small cache with the same videos at once: the
    races (the same name renamed twice, a file evicted by the other) are harmless."""
    folder, payloads = shards
    rels = sorted(payloads)
    largest = max(len(p) for p in payloads.values())
    bound = 4 * largest
    found, _ = run_forked(_cache_child, [(folder, tmp_path / 'c', bound, rels * 2)] * 2)
    assert found == [{rel: hashlib.sha256(payloads[rel]).hexdigest() for rel in rels}] * 2
    used = sum(f.stat().st_size for f in (tmp_path / 'c').iterdir())
    assert 0 < used <= bound + largest  # at most the other's last write since a scan
    assert not [n for n in os.listdir(tmp_path / 'c') if n.endswith('.tmp')]


@pytest.mark.parametrize('options, secret', [
    ({'key': 'AKIAVALUE'}, 'AKIAVALUE'),
    ({'client_kwargs': {'aws_secret_access_key': 'SECRETVALUE'}}, 'SECRETVALUE'),
    ({'config_kwargs': {'retries': [{'Token': 'TOKENVALUE'}]}}, 'TOKENVALUE'),
    ('{"headers": {"Authorization": "Bearer BEARERVALUE"}}', 'BEARERVALUE'),
])
def test_storage_options_refuse_credentials(options, secret):
    with pytest.raises(OptionError) as e:
        check_storage_options(options)
    message = str(e.value)
    assert secret not in message and 'AWS_ACCESS_KEY_ID' in message and 'AWS_PROFILE' in message
    assert '~/.aws/credentials' in message and '\n' not in message
    with pytest.raises(OptionError):
        ShardStore('s3://bucket/prefix', storage_options=options)


def test_storage_options_accepted():
    options = {'endpoint_url': 'http://127.0.0.1:1', 'client_kwargs': {'region_name': 'us-east-1'}}
    assert check_storage_options(options) == options
    assert check_storage_options('{"anon": true}') == {'anon': True}
    assert check_storage_options(None) == {}
    with pytest.raises(OptionError, match='JSON'):
        check_storage_options('{"anon": ')


# ---------------------------------------------------------------- S3 (moto's server)

@pytest.fixture(scope='module')
def s3(shards):
    """(s3://bucket-PORT/prefix, storage_options) of the shards uploaded to moto's S3 server."""
    pytest.importorskip('moto.server')
    pytest.importorskip('s3fs')
    with s3_server(shards[0]) as (url, options):
        yield url, options


def test_s3_reads_equal_the_files(shards, s3):
    folder, payloads = shards
    store = ShardStore(s3[0], storage_options=s3[1], **FAST)
    assert {rel: store.read_member(rel) for rel in payloads} == payloads
    assert store.read_file(INDEX_JSON) == (folder / INDEX_JSON).read_bytes()
    client_kwargs = ShardStore(s3[0], storage_options={'client_kwargs': {'endpoint_url': s3[1]['endpoint_url']}})
    assert client_kwargs.read_member(sorted(payloads)[0]) == payloads[sorted(payloads)[0]]
    with pytest.raises(StorageError, match='not found'):
        ShardStore(s3[0].replace('/prefix', '/elsewhere'), storage_options=s3[1], **FAST).index()


def test_s3_truncated_shard(shards, s3, tmp_path):
    shard, rel = truncated_copy(shards[0], tmp_path / 'cut')
    import s3fs
    cut = s3[0].replace('/prefix', '/cut')
    s3fs.S3FileSystem(skip_instance_cache=True, **s3[1]).put(str(tmp_path / 'cut' / shard), f'{cut[5:]}/{shard}')
    store = ShardStore(cut, storage_options=s3[1], **FAST)
    store._index = ShardIndex.load(tmp_path / 'cut')
    with pytest.raises(DataError, match=f'truncated.*re-upload {shard}'):
        store.read_member(rel)


def test_s3_forked_children(shards, s3):
    check_forked_reads(ShardStore(s3[0], storage_options=s3[1], **FAST), shards[1])


def test_a_cached_payload_of_a_shard_since_made_again_is_not_served(shards, tmp_path):
    """Shards made again with the same layout (each video's member at the same place
    and size, other bytes) and uploaded with their new index: the cache, keyed on the
    shard's sha256 in the index, serves the new payload, not the one cached before."""
    folder = tmp_path / 'shards'
    shutil.copytree(shards[0], folder)
    rel = sorted(shards[1])[0]
    index = ShardIndex.load(folder)
    shard, offset, size = index.lookup(rel)
    with http_server(folder) as url:
        assert ShardStore(url, cache_dir=tmp_path / 'cache', **FAST).read_member(rel) == shards[1][rel]
        new = bytes(b ^ 0xFF for b in shards[1][rel])
        with open(folder / shard, 'r+b') as f:
            f.seek(offset)
            f.write(new)
        info = json.loads((folder / INDEX_JSON).read_text())
        for s in info['shards']:
            if s['name'] == shard:
                s['sha256'] = file_sha256(folder / shard)
        (folder / INDEX_JSON).write_text(json.dumps(info))
        store = ShardStore(url, cache_dir=tmp_path / 'cache', **FAST)
        assert store.read_member(rel) == new
        assert store.open_member(rel).read() == new
        assert ShardStore(url, cache_dir=tmp_path / 'cache', **FAST).open_member(rel).read() == new  # cached


def test_storage_option_values_are_not_in_its_messages(monkeypatch):
    options = {'client_kwargs': {'headers': {'X-Api-Key': 'APIKEYVALUE'}}, 'endpoint_url': 'http://127.0.0.1:1'}
    store = ShardStore('https://u:PASSWORD@127.0.0.1:1/x?sig=SIGVALUE', storage_options=options, retries=0)

    def fails(*args, **kwargs):
        raise OSError('request with X-Api-Key APIKEYVALUE to https://u:PASSWORD@127.0.0.1:1/x?sig=SIGVALUE failed')
    monkeypatch.setattr(store, 'filesystem', lambda: mock.Mock(cat_file=fails))
    with pytest.raises(StorageError) as e:
        store.index()
    message = str(e.value)
    assert 'X-Api-Key ***' in message and 'u:***@127.0.0.1:1' in message
    for secret in ('APIKEYVALUE', 'PASSWORD', 'SIGVALUE'):
        assert secret not in message


def test_storage_options_kept_by_name_are_refused_in_one_line():
    with pytest.raises(OptionError) as e:
        check_storage_options(['client_kwargs.region_name', 'endpoint_url'])
    assert str(e.value) == ('storage_options: only their names (client_kwargs.region_name, endpoint_url) are kept '
                            'in opts.json and checkpoints, not their values: give --storage_options again')


def test_s3_without_credentials_is_one_line_saying_where_they_are_looked_for(shards, s3, monkeypatch):
    for name in ('AWS_ACCESS_KEY_ID', 'AWS_SECRET_ACCESS_KEY', 'AWS_SESSION_TOKEN', 'AWS_PROFILE'):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv('AWS_EC2_METADATA_DISABLED', 'true')  # no instance role to ask for
    reads = []
    store = ShardStore(s3[0], storage_options=s3[1], **FAST)
    real = store._retrying
    counted = lambda name, what, read: real(name, what, lambda: reads.append(1) or read())  # noqa: E731
    monkeypatch.setattr(store, '_retrying', counted)
    with pytest.raises(StorageError) as e:
        store.index()
    message = str(e.value)
    assert len(reads) == 1, f'{len(reads)} tries'
    assert message.startswith(f'{s3[0]}/index.json: no S3 credentials found') and '\n' not in message
    for where in ('AWS_ACCESS_KEY_ID', 'AWS_SECRET_ACCESS_KEY', '~/.aws/credentials', 'AWS_PROFILE', 'role'):
        assert where in message
    assert 'network' not in message
