"""bench.data_loading, the runner of the loading benchmark's sections
(bench/loading_*.py), on its one section that needs no videos: the index table
is printed with its three rows, and --clock reaches the sections' timer.
Correctness only: no timing is asserted."""
import time

import pytest

from bench import data_loading
from bench import loading_timing as timing

pytestmark = pytest.mark.slow


@pytest.fixture
def restore_clock():
    yield
    timing.clock = timing.CLOCKS['wall']


def test_index_section_and_clock(tmp_path, capsys, restore_clock):
    data_loading.main(['--sections', 'index', '--index_entries', '300', '--clock', 'cpu'])
    assert timing.clock is time.process_time  # what best_of_rounds and the layout section read
    printed = capsys.readouterr().out
    assert 'annotation index: 300 entries' in printed
    rows = [line for line in printed.splitlines() if line.startswith('| ') and '| 270 |' in line]
    assert [r.split('|')[1].strip() for r in rows] == [
        'list of VideoRecord (load_annotations)', 'RecordTable, first start (builds the cache)',
        'RecordTable, cached start']
