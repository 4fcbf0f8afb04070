"""A video cut short is found wherever it is read from (issue 37): a folder, local
shards, shards over HTTP (and their cache): the container-end checks read the bytes
the loader reads, so the loader's "cut short" line and --check_frames all's verdict
are the same from each.  The layouts: AVI, MP4 with its index first (faststart) and
last, Matroska, WebM with known Cluster sizes and with unknown ones (a browser's
MediaRecorder, OBS: FFmpeg writes sizes, so the test makes them unknown), each cut at
50, 90 and 99% of its bytes and exactly between two packets (no packet split: the
broken-packet check cannot see it; only the AVI chunk count, the MP4 sample table and
the Matroska structure can).  A live writer's WebM cut between two blocks cannot be
told from one that stopped there: a clip past its end fails instead of repeating
frames ("may be cut short")."""
import json
from fractions import Fraction

import av
import pytest

from datasets import container_ends
from datasets.annotation import VideoRecord
from datasets.frame_check import check_videos
from datasets.storage import ShardStore
from datasets.video import VideoClipLoader
from datasets.whole_videos import check_video_frames
from tests.servers import http_server
from tests.video_files import grid_clip_codes, write_timed_video
from util_scripts import make_shards
from utils.errors import DataError

N, KEPT = 41, 35  # frames written; packets kept by the cut between two packets
X264 = {'crf': '18', 'g': '12'}
VP9 = {'crf': '20', 'b': '0', 'g': '12', 'deadline': 'realtime', 'cpu-used': '8'}
LAYOUTS = {  # name -> (suffix, write_timed_video's arguments)
    'avi': ('.avi', dict(codec='mpeg4', options={'bf': '0'}, bit_rate=2_000_000, gop=12)),
    'mp4_faststart': ('.mp4', dict(codec='libx264', options=X264, mux_options={'movflags': 'faststart'})),
    'mp4_moov_last': ('.mp4', dict(codec='libx264', options=X264)),
    'mkv': ('.mkv', dict(codec='libx264', options=X264)),
    'webm': ('.webm', dict(codec='libvpx-vp9', options=VP9)),
    'webm_live': ('.webm', dict(codec='libvpx-vp9', options=VP9, mux_options={'live': '1'})),
}
CUTS = ('50', '90', '99', 'between')
CLUSTER = b'\x1f\x43\xb6\x75'


def unknown_sizes(data: bytes) -> bytes:
    """The Segment's and every Cluster's size made unknown (all ones, in the same
    number of bytes: nothing moves), as live writers leave them."""
    data = bytearray(data)

    def number(at):
        length = 9 - data[at].bit_length()
        return int.from_bytes(data[at:at + length], 'big') & ((1 << 7 * length) - 1), length

    def unknown(at, length):
        data[at:at + length] = ((1 << 7 * length + 1) - 1).to_bytes(length, 'big')

    at = 0
    _, n = number(at)
    size, m = number(at + n)
    at += n + m + size  # past the EBML header
    _, n = number(at)
    _, m = number(at + n)
    unknown(at + n, m)
    at += n + m
    while at < len(data):
        _, n = number(at)
        size, m = number(at + n)
        if data[at:at + 4] == CLUSTER:
            unknown(at + n, m)
        at += n + m + size
    return bytes(data)


def between_packets(path, suffix: str, kept: int = KEPT) -> int:
    """The byte where packet ``kept`` (decode order) starts: the file cut there holds
    ``kept`` whole packets and no part of another."""
    with av.open(str(path)) as container:
        last = [p for p in container.demux() if p.size][kept - 1]
    if suffix == '.avi':  # a chunk's data is padded to an even size
        return last.pos + last.size + last.size % 2
    if suffix in ('.mkv', '.webm'):  # a SimpleBlock's data: track number, timecode, flags, frame
        return last.pos + 4 + last.size
    return last.pos + last.size


def moov_lost(data: bytes, mdat_size_zero: bool) -> bytes:
    """An MP4 whose writer stopped before its moov box (a crashed recording): the mdat
    runs to the end of the file, its size stated or 0 ('to the end')."""
    moov = data.rfind(b'moov') - 4
    mdat = data.find(b'mdat') - 4
    assert 0 < mdat < moov
    out = bytearray(data[:moov])
    if mdat_size_zero:
        out[mdat:mdat + 4] = bytes(4)
    return bytes(out)


@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
    """(folder of videos, local shards of them, {(layout, cut): REL}).  The shards are
    make_shards', packed without counting the frames (a packer that does not open the
    videos): make_shards itself leaves out the MP4 copies that lost their index."""
    root = tmp_path_factory.mktemp('cut_everywhere')
    rels = {}
    for name, (suffix, kwargs) in LAYOUTS.items():
        source = write_timed_video(root / 'sources' / f'{name}{suffix}', pts=list(range(N)),
                                   time_base=Fraction(1, 25), **kwargs)
        data = source.read_bytes()
        if name == 'webm_live':
            data = unknown_sizes(data)
        ends = {'whole': len(data), 'between': between_packets(source, suffix)}
        ends.update({cut: len(data) * int(cut) // 100 for cut in CUTS[:3]})
        copies = {cut: data[:end] for cut, end in ends.items()}
        if name == 'mp4_moov_last':
            copies['no_moov'] = moov_lost(data, False)
            copies['no_moov_mdat0'] = moov_lost(data, True)
        for cut, payload in copies.items():
            (root / 'videos' / 'v').mkdir(parents=True, exist_ok=True)
            (root / 'videos' / 'v' / f'{name}_{cut}{suffix}').write_bytes(payload)
            rels[name, cut] = f'v/{name}_{cut}'
    database = {rel[2:]: {'subset': 'training', 'annotations': {'label': 'v', 'segment': [0, N]}}
                for rel in rels.values()}
    (root / 'ann.json').write_text(json.dumps({'labels': ['v'], 'database': database}))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(make_shards, 'frame_count', lambda path, file_type: N)
        make_shards.main([str(root / 'ann.json'), str(root / 'videos'), str(root / 'shards'), '--dataset',
                          'ucf101', '--file_type', 'video', '--no_progress'])
    return root / 'videos', root / 'shards', rels


def expected(name: str, cut: str) -> str:
    """The verdict on reading every frame written."""
    if cut == 'whole':
        return 'whole'
    if cut.startswith('no_moov'):
        return 'cut short'
    if name == 'webm_live' and cut == 'between':
        return 'open end'
    return 'cut short'


def verdict(path: str, store=None) -> tuple[str, str]:
    """(what reading every frame gives: 'whole', 'cut short', 'open end' or the error;
    the line without the video's name)."""
    try:
        clip = VideoClipLoader(threads=1, store=store)(path, range(N))
    except DataError as e:
        line = str(e)
        if store is not None:
            line = line.replace(store.where(path), 'V').replace(', then util_scripts.make_shards again', '')
        line = line.replace(path, 'V')
        kind = 'cut short' if ' is cut short ' in line else 'open end' if ' may be cut short' in line else line
        return kind, line
    assert grid_clip_codes(clip) == list(range(N))
    return 'whole', ''


def check_says(path: str, store=None) -> str:
    """--check_frames all's verdict on the video (needing every frame)."""
    try:
        check_videos([VideoRecord(path.rsplit('/', 1)[-1], path, 0, N, 0, (0, N))], 'video', mode='all',
                     store=store)
    except DataError as e:
        return 'cut short' if ' is cut short ' in str(e) else 'open end' if ' may be cut short' in str(e) else str(e)
    return 'whole'


def folder_path(videos, rel: str, name: str) -> str:
    return str(videos / f'{rel}{LAYOUTS[name][0]}')


@pytest.mark.parametrize('name', list(LAYOUTS))
def test_a_cut_copy_says_the_same_from_a_folder_and_from_local_shards(corpus, name):
    """Each copy: the loader's verdict and line, and the frame check's verdict, are the
    same from the folder and from the shards, and the right one (before: a cut MKV or
    WebM in a shard read every frame, the missing ones loop-padded, and the check
    passed it; a WebM of unknown Cluster sizes did so from the folder too)."""
    videos, shards, rels = corpus
    store = ShardStore(shards)
    for (layout, cut), rel in rels.items():
        if layout != name:
            continue
        path = folder_path(videos, rel, name)
        from_folder, from_shards = verdict(path), verdict(rel, store)
        assert from_folder[0] == expected(name, cut), (rel, from_folder)
        assert from_shards == from_folder, rel
        assert check_says(path) == check_says(rel, store) == expected(name, cut), rel
        assert (check_video_frames(path, N) is None) == (check_video_frames(rel, N, store) is None), rel


@pytest.mark.parametrize('name', ['avi', 'mp4_faststart', 'mkv', 'webm'])
def test_a_copy_cut_between_two_packets_holds_its_whole_frames_and_no_more(corpus, name):
    """No packet is split, so only the container's own length tells the cut: the
    frames before the last keyframe are kept and read right, the rest are missing
    (before the AVI and MP4 rules were tested so, each could be dropped unnoticed)."""
    videos, shards, rels = corpus
    for path, store in ((folder_path(videos, rels[name, 'between'], name), None),
                        (rels[name, 'between'], ShardStore(shards))):
        loader = VideoClipLoader(threads=1, store=store)
        with pytest.raises(DataError, match='is cut short') as info:
            loader(path, range(N))
        kept = int(str(info.value).split('holds ')[1].split(' ')[0])
        assert 0 < kept < KEPT
        assert grid_clip_codes(loader(path, range(kept))) == list(range(kept))


def test_a_live_webm_ends_where_its_data_does_and_is_never_loop_padded(corpus):
    """Unknown Cluster sizes: a copy cut inside a block is cut short; the whole file and
    a copy cut between two blocks keep every frame (all read right), and a clip past
    their end fails in one line instead of repeating frames."""
    videos, shards, rels = corpus
    store = ShardStore(shards)
    for cut, frames in (('whole', N), ('between', KEPT)):
        for path, source in ((folder_path(videos, rels['webm_live', cut], 'webm_live'), None),
                             (rels['webm_live', cut], store)):
            loader = VideoClipLoader(threads=1, store=source)
            assert grid_clip_codes(loader(path, range(frames))) == list(range(frames))
            with pytest.raises(DataError, match=f'may be cut short: .* ends after {frames} frames; frames '
                                                f'{frames} \\(0-based\\) are past that end and are not loop-padded'):
                loader(path, [0, frames])


def test_unknown_cluster_sizes_are_walked_block_by_block(corpus):
    """container_ends.matroska_cut on bytes, a path and an open member alike: a live
    file cut in a block is cut, one ending between blocks cannot be told (None)."""
    videos, shards, rels = corpus
    whole = (videos / 'v' / 'webm_live_whole.webm').read_bytes()
    clusters = [i for i in range(len(whole)) if whole.startswith(CLUSTER, i)]
    assert len(clusters) >= 2 and all(container_ends._ebml_header(whole, i)[1] is None for i in clusters)
    assert container_ends.matroska_cut(whole) is None
    for cut in CUTS[:3]:
        path = videos / 'v' / f'webm_live_{cut}.webm'
        with ShardStore(shards).open_member(rels['webm_live', cut]) as member:
            member.seek(123)
            assert container_ends.matroska_cut(path) is container_ends.matroska_cut(member) is True
            assert member.tell() == 123  # the demuxer's position is kept
    assert container_ends.matroska_cut(whole[:-3]) is True


def test_a_stated_duration_decides_a_file_of_unknown_sizes(tmp_path):
    """A writer that left the sizes unknown but stated the Duration (and wrote Cues):
    whole as it is, cut short once cut between two blocks."""
    source = write_timed_video(tmp_path / 'src.webm', 'libvpx-vp9', list(range(N)), Fraction(1, 25), VP9)
    data = unknown_sizes(source.read_bytes())
    assert container_ends.matroska_duration(data) == pytest.approx(N / 25, abs=0.05)
    whole, cut = tmp_path / 'whole.webm', tmp_path / 'cut.webm'
    whole.write_bytes(data)
    cut.write_bytes(data[:between_packets(source, '.webm')])
    assert verdict(str(whole)) == ('whole', '')
    assert verdict(str(cut))[0] == 'cut short'


def test_an_mp4_that_lost_its_index_is_cut_short_wherever_it_is_read(corpus):
    """A recording stopped before its moov box (the mdat runs to the end of the file,
    its size stated or 0): "cut short", not "cannot be opened", from the folder and
    from the shards."""
    videos, shards, rels = corpus
    for cut in ('no_moov', 'no_moov_mdat0'):
        rel = rels['mp4_moov_last', cut]
        for path, store in ((folder_path(videos, rel, 'mp4_moov_last'), None), (rel, ShardStore(shards))):
            with pytest.raises(DataError, match='is cut short .*its index .* is missing, no frame can be read'):
                VideoClipLoader(threads=1, store=store)(path, [0])


@pytest.mark.parametrize('name', ['mkv', 'webm_live'])
def test_over_http_and_from_its_cache_the_verdict_is_the_same(corpus, name, tmp_path):
    """Shards over HTTP (a payload read whole) and from --shard_cache (its file)."""
    videos, shards, rels = corpus
    with http_server(shards) as url:
        for cut in ('whole', '50', 'between'):
            rel = rels[name, cut]
            local = verdict(rel, ShardStore(shards))
            assert verdict(rel, ShardStore(url)) == local, rel
            cached = ShardStore(url, cache_dir=tmp_path / 'cache')
            assert verdict(rel, cached) == verdict(rel, cached) == local, rel
            assert cached.cache_hits >= 1
