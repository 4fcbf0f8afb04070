"""Build the UCF-101 annotation JSONs (ucf101_01.json ... ucf101_03.json).

python -m util_scripts.ucf101_json dir_path video_path dst_path

dir_path holds the official classInd.txt, trainlist0{1,2,3}.txt and
testlist0{1,2,3}.txt; video_path the frames (<label>/<video_id>/image_*.jpg,
<label>/<video_id>.hdf5) or the videos themselves (<label>/<video_id>.avi,
for --file_type video). testlist videos become the 'validation' subset.
"""
from pathlib import Path

from .utils import (
    add_segments,
    fail,
    parse_builder_args,
    read_lines,
    require_file,
    require_known_labels,
    write_annotation,
)


def load_labels(class_ind_path):
    """Class names ordered by their index in classInd.txt ("1 ApplyEyeMakeup")."""
    indexed = []
    for line in read_lines(class_ind_path):
        parts = line.split()
        if len(parts) != 2 or not parts[0].isdigit():
            fail(f'{class_ind_path}: expected "<index> <class>" lines, '
                 f'got {line!r}')
        indexed.append((int(parts[0]), parts[1]))
    return [name for _, name in sorted(indexed)]


def load_split(list_path, subset):
    """Entries of one list file ("ApplyEyeMakeup/v_..._g08_c01.avi [1]")."""
    database = {}
    for line in read_lines(list_path):
        parts = line.split()[0].split('/')
        if len(parts) != 2:
            fail(f'{list_path}: expected "<class>/<video>.avi" lines, '
                 f'got {line!r}')
        label, file_name = parts
        database[Path(file_name).stem] = {'subset': subset,
                                          'annotations': {'label': label}}
    return database


def convert_split(dir_path, split_index, video_path):
    dir_path = Path(dir_path)
    labels = load_labels(dir_path / 'classInd.txt')
    database = load_split(dir_path / f'trainlist0{split_index}.txt',
                          'training')
    database.update(load_split(dir_path / f'testlist0{split_index}.txt',
                               'validation'))
    require_known_labels(database, labels,
                         f'split {split_index} lists classes missing from classInd.txt')
    add_segments(database, video_path)
    return labels, database


def main(argv=None):
    args = parse_builder_args(argv, __doc__, 'directory with classInd.txt, trainlist0N.txt, '
                              'testlist0N.txt (ucfTrainTestlist)', 'directory for ucf101_0N.json (created)',
                              ('UCF-101 split directory', 'it should hold classInd.txt, trainlist01.txt, ...'))
    require_file(args.dir_path / 'classInd.txt', 'classInd.txt',
                 'give the ucfTrainTestlist directory as dir_path')

    done = 0
    for split_index in (1, 2, 3):
        lists = [args.dir_path / f'trainlist0{split_index}.txt',
                 args.dir_path / f'testlist0{split_index}.txt']
        present = [p.is_file() for p in lists]
        if not any(present):
            continue
        for path, ok in zip(lists, present):
            if not ok:
                fail(f'{path} not found (its companion split file exists)')
        labels, database = convert_split(args.dir_path, split_index,
                                         args.video_path)
        write_annotation(args.dst_path / f'ucf101_0{split_index}.json',
                         labels, database)
        done += 1
    if done == 0:
        fail(f'no split file in {args.dir_path}: expected trainlist01.txt '
             'and testlist01.txt (and 02, 03)')


if __name__ == '__main__':
    main()
