import numpy as np
import pytest

from opdvfs import ValidationError, Workload
from opdvfs.workloads import BUILDERS, load_workload


@pytest.fixture(scope="module")
def built():
    return {name: build() for name, build in BUILDERS.items()}


def test_gpt3_matmul_flops_follow_6_params_tokens(built):
    w = built["gpt3"]
    ops = w.ops
    params = w.meta["weight_params_on_device"]
    tokens = w.meta["tokens_per_iteration"]
    matmul = ops.loc[ops["type"] == "MatMul", "flops"].sum()
    assert matmul == pytest.approx(6 * params * tokens, rel=1e-9)
    # attention score/context products and elementwise work come on top, by a few percent
    assert 1.0 < w.total_flops / (6 * params * tokens) < 1.25


def test_gpt3_has_paper_scale_and_tensor_parallel_comm(built):
    ops = built["gpt3"].ops
    assert 17_000 <= len(ops) <= 19_000  # paper: ~18k operators per iteration
    comm = ops[ops["stream"] == "comm"]
    assert {"AllReduce", "Send", "Recv"} <= set(comm["type"])
    assert set(ops["phase"]) == {"forward", "backward", "optimizer"}
    # 1F1B: backward work starts before the last forward
    phase = ops["phase"].to_numpy()
    assert np.flatnonzero(phase == "backward")[0] < np.flatnonzero(phase == "forward")[-1]


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_every_builder_is_a_valid_workload(built, name):
    w = built[name]
    assert isinstance(w, Workload)
    assert w.name == name
    ops = w.ops
    assert (ops["flops"] >= 0).all() and (ops["bytes_loaded"] > 0).all()
    assert ops["name"].is_unique


@pytest.mark.parametrize("name", ["resnet50", "resnet152", "vgg19", "shufflenetv2"])
def test_cnn_backward_doubles_forward_conv_flops(built, name):
    ops = built[name].ops
    fwd = ops.loc[ops["type"] == "Conv2D", "flops"].sum()
    bwd = ops.loc[ops["type"].str.startswith("Conv2DBackprop"), "flops"].sum()
    assert bwd == pytest.approx(2 * fwd)


def test_resnet50_forward_flops_match_the_published_count(built):
    ops = built["resnet50"].ops
    fwd = ops.loc[ops["phase"] == "forward", "flops"].sum() / 64
    assert fwd == pytest.approx(8.2e9, rel=0.05)  # 4.1 GMAC per 224x224 image


def test_llama2_is_host_bound_by_construction(built):
    w = built["llama2-infer"]
    assert (w.ops["host_us"] > 0).all()
    assert w.meta["host_bound"] is True


def test_load_workload_by_name_and_path(tmp_path, built):
    path = tmp_path / "captured.json"
    built["bert"].write(path)
    assert load_workload(path).equals(built["bert"])
    assert load_workload("bert").equals(built["bert"])
    with pytest.raises(ValidationError, match="unknown workload 'gpt5'"):
        load_workload("gpt5")
