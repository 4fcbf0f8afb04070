"""bench.deploy on a tiny network: every runtime measured, int8 really quantized."""
import onnx
import pytest

from bench import deploy

pytestmark = pytest.mark.slow


def test_deploy_measures_each_runtime_on_a_tiny_network(monkeypatch, capsys):
    quantized = []
    real_quantize = deploy.quantize_onnx_int8

    def quantize(fp32, int8, batches):
        real_quantize(fp32, int8, batches)
        quantized.append({node.op_type for node in onnx.load(str(int8)).graph.node})
    monkeypatch.setattr(deploy, 'quantize_onnx_int8', quantize)
    rows = deploy.main(['--models', 'resnet-10', '--runtimes', 'eager', 'onnx', 'int8', '--threads', '1',
                        '--sample_duration', '4', '--sample_size', '32', '--repeats', '1'])
    assert [r['runtime'] for r in rows] == ['eager', 'onnx', 'int8']
    for row in rows:
        assert row['model'] == 'resnet-10' and row['clip'] == '4x32' and row['threads'] == 1
        assert row['ms_per_clip_batch1'] > 0 and row['clips_per_s_batch8'] > 0
    assert rows[0]['setup_s'] is None and rows[1]['setup_s'] > 0 and rows[2]['setup_s'] > 0
    assert 'QuantizeLinear' in quantized[0] and 'DequantizeLinear' in quantized[0]
    table = capsys.readouterr().out.splitlines()
    assert table[-5].startswith('| model | clip | runtime | threads |')
    assert table[-3].startswith('| resnet-10 | 4x32 | eager | 1 |') and '1.00x, 1.00x' in table[-3]
    assert table[-1].startswith('| resnet-10 | 4x32 | int8 | 1 |')


def test_x3d_runs_at_its_own_clip_unless_told():
    assert deploy.clip_shape('x3d-xs') == (3, 4, 160, 160)
    assert deploy.clip_shape('x3d-s') == (3, 13, 160, 160)
    assert deploy.clip_shape('resnet-18') == (3, 16, 112, 112)
    assert deploy.clip_shape('x3d-s', 8, 64) == (3, 8, 64, 64)
