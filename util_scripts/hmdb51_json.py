"""Build the HMDB-51 annotation JSONs (hmdb51_1.json ... hmdb51_3.json).

python -m util_scripts.hmdb51_json dir_path video_path dst_path

dir_path holds the official <class>_test_split{1,2,3}.txt files, whose
lines read "<video>.avi <0|1|2>": 1 training, 2 testing (written as the
'validation' subset), 0 unused in that split.
"""
import re
from pathlib import Path

from .utils import (
    add_segments,
    fail,
    parse_builder_args,
    read_lines,
    write_annotation,
)

SPLIT_FILE = re.compile(r'^(?P<label>.+)_test_split(?P<split>[123])\.txt$')
SPLIT_CODES = {'1': 'training', '2': 'validation'}  # the split files' column


def find_split_files(dir_path):
    """{split index: [(label, path), ...]} of the split files in dir_path."""
    splits = {}
    for path in sorted(Path(dir_path).iterdir()):
        match = SPLIT_FILE.match(path.name)
        if match and path.is_file():
            splits.setdefault(int(match['split']), []).append(
                (match['label'], path))
    return splits


def load_split(files):
    database = {}
    for label, path in files:
        for line in read_lines(path):
            parts = line.split()
            if len(parts) != 2 or parts[1] not in ('0', '1', '2'):
                fail(f'{path}: expected "<video>.avi <0|1|2>" lines, '
                     f'got {line!r}')
            if parts[1] == '0':
                continue
            # Video ids are the file name up to its extension, as the
            # frame folders written by generate_video_jpgs.
            database[Path(parts[0]).stem] = {
                'subset': SPLIT_CODES[parts[1]],
                'annotations': {'label': label}}
    return database


def main(argv=None):
    args = parse_builder_args(argv, __doc__, 'directory with <class>_test_split{1,2,3}.txt '
                              '(testTrainMulti_7030_splits)', 'directory for hmdb51_N.json (created)',
                              ('HMDB-51 split directory', 'it should hold brush_hair_test_split1.txt, ...'))
    splits = find_split_files(args.dir_path)
    if not splits:
        fail(f'no <class>_test_split{{1,2,3}}.txt file in {args.dir_path}; '
             'unpack test_train_splits.rar and give that directory')
    # Labels come from every split file, sorted, as the predecessor did.
    labels = sorted({label for files in splits.values()
                     for label, _ in files})

    for split_index in sorted(splits):
        database = load_split(splits[split_index])
        add_segments(database, args.video_path)
        write_annotation(args.dst_path / f'hmdb51_{split_index}.json',
                         labels, database)


if __name__ == '__main__':
    main()
