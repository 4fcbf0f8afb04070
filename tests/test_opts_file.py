"""--opts_file: a run re-made from its opts.json, the command line on top."""
import json
from pathlib import Path

import pytest
import torch

import main
from opts import parse_opts, save_opts
from tests.conftest import tiny_args


def _opts_json(tmp_path, argv, name='opts.json'):
    path = tmp_path / name
    save_opts(parse_opts(argv), path, run={'lr': 0.1})
    return path


def _weights(path):
    return torch.load(path, weights_only=True)['state_dict']


@pytest.mark.slow
def test_run_remade_from_its_opts_json_trains_the_same_weights(tiny_synthetic, tmp_path, capsys):
    video_path, annotation_path = tiny_synthetic
    first = tmp_path / 'x'
    main.main(tiny_args(video_path, annotation_path, first, '--n_epochs', '1', '--no_val',
                        '--manual_seed', '7', '--nesterov', '--weight_decay', '5e-4'))
    again = tmp_path / 'y'
    main.main(['--opts_file', str(first / 'opts.json'), '--result_path', str(again)])
    a, b = _weights(first / 'save_1.pth'), _weights(again / 'save_1.pth')
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    stored = json.loads((again / 'opts.json').read_text())
    assert stored['manual_seed'] == 7 and stored['nesterov'] and stored['weight_decay'] == 5e-4
    assert stored['opts_file'] == str(first / 'opts.json')
    # without a new --result_path the old run's folder is not trained into
    with pytest.raises(SystemExit) as e:
        main.main(['--opts_file', str(first / 'opts.json')])
    assert e.value.code == 2 and 'holds checkpoints of another run' in capsys.readouterr().err
    kept = _weights(first / 'save_1.pth')
    assert all(torch.equal(a[k], kept[k]) for k in a)
    # an option given on top wins: other weights
    other = tmp_path / 'z'
    main.main(['--opts_file', str(first / 'opts.json'), '--result_path', str(other),
               '--manual_seed', '8'])
    c = _weights(other / 'save_1.pth')
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_what_is_not_carried_over(tmp_path):
    base = ['--dataset', 'synthetic', '--result_path', str(tmp_path / 'old'),
            '--resume_path', str(tmp_path / 'old' / 'save_5.pth'), '--auto_resume',
            '--overwrite', '--batch_size', '8', '--n_epochs', '3', '--tensorboard']
    path = _opts_json(tmp_path, base)
    opt = parse_opts(['--opts_file', str(path), '--result_path', str(tmp_path / 'new')])
    assert opt.resume_path is None and not opt.auto_resume and not opt.overwrite
    assert opt.result_path == tmp_path / 'new'
    assert (opt.batch_size, opt.n_epochs, opt.tensorboard) == (8, 3, True)
    # the synthetic preset's values where the old run kept them, the old run's elsewhere
    assert opt.learning_rate == 0.1 and opt.model_depth == 10 and opt.sample_size == 32
    # given again, they count
    opt = parse_opts(['--opts_file', str(path), '--auto_resume', '--overwrite'])
    assert opt.auto_resume and opt.overwrite and opt.result_path == tmp_path / 'old'


def test_derived_values_are_recomputed(tmp_path):
    argv = ['--dataset', 'synthetic', '--result_path', 'r', '--root_path', str(tmp_path),
            '--video_path', 'v', '--annotation_path', 'a.json', '--batch_size', '8']
    path = _opts_json(tmp_path, argv)
    stored = json.loads(path.read_text())
    assert stored['video_path'] == str(tmp_path / 'v')  # joined when parsed
    opt = parse_opts(['--opts_file', str(path)])
    assert (opt.video_path, opt.annotation_path, opt.result_path) == (
        tmp_path / 'v', tmp_path / 'a.json', tmp_path / 'r')
    # a new root moves every path the old run gave relative to its root
    opt = parse_opts(['--opts_file', str(path), '--root_path', '/data'])
    assert (opt.video_path, opt.result_path) == (Path('/data/v'), Path('/data/r'))
    # the inference batch followed --batch_size in the old run: it still does
    assert stored['inference_batch_size'] == 8
    assert parse_opts(['--opts_file', str(path), '--batch_size', '4']).inference_batch_size == 4
    fixed = _opts_json(tmp_path, argv + ['--inference_batch_size', '32'], 'fixed.json')
    assert parse_opts(['--opts_file', str(fixed), '--batch_size', '4']).inference_batch_size == 32


def test_bad_opts_file(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        parse_opts(['--opts_file', str(tmp_path / 'nope.json')])
    assert e.value.code == 2
    assert '--opts_file' in capsys.readouterr().err
    (tmp_path / 'bad.json').write_text('{"batch_size": ')
    with pytest.raises(SystemExit):
        parse_opts(['--opts_file', str(tmp_path / 'bad.json')])
    assert 'is not valid JSON' in capsys.readouterr().err
    (tmp_path / 'old.json').write_text(json.dumps({
        'dataset': 'synthetic', 'result_path': str(tmp_path / 'r'), 'removed_option': 1,
        'arch': 'resnet-10'}))
    opt = parse_opts(['--opts_file', str(tmp_path / 'old.json')])
    assert opt.dataset == 'synthetic'
    err = capsys.readouterr().err
    assert 'removed_option ignored' in err and 'arch' not in err
