"""The paper's models: output shapes at full and reduced width, sizes, BN buffers, causality."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from fedgmr.models import build_model

CASES = [
    ("conv2", 62, (1, 28, 28)),
    ("vgg11", 10, (3, 32, 32)),
    ("vgg11", 10, (1, 28, 28)),
    ("resnet18", 100, (3, 16, 16)),  # CIFAR-style stem (H <= 64)
    ("resnet18", 100, (3, 66, 66)),  # ImageNet stem (H > 64)
    ("transformer_lm", 50, (12,)),
    ("char_lstm", 97, (10,)),
]


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _input(shape: tuple[int, ...], vocab: int, batch: int = 2) -> torch.Tensor:
    if len(shape) == 1:
        return torch.randint(0, vocab, (batch, *shape))
    return torch.randn(batch, *shape)


@pytest.mark.parametrize("width", [1.0, 0.25])
@pytest.mark.parametrize("name, classes, shape", CASES)
def test_output_shapes_and_backward(name: str, classes: int, shape: tuple[int, ...], width: float) -> None:
    torch.manual_seed(0)
    model = build_model(name, classes, shape, width=width)
    out = model(_input(shape, classes))
    expected = (2, shape[0], classes) if len(shape) == 1 else (2, classes)
    assert out.shape == expected and torch.isfinite(out).all()
    out.float().pow(2).mean().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("name, classes, shape, low, high", [
    ("conv2", 62, (1, 28, 28), 6.5e6, 6.7e6),          # ~6.6M
    ("vgg11", 10, (3, 32, 32), 9_750_922, 9_750_922),  # 37.2 MiB of float32: the spec's model size
    ("resnet18", 100, (3, 64, 64), 11.1e6, 11.3e6),    # ~11.2M (43 MB)
    ("transformer_lm", 10_004, (127,), 2.0e6, 2.3e6),   # embeddings dominate
    ("char_lstm", 80, (80,), 0.8e6, 0.83e6),            # LEAF's Shakespeare LSTM
])
def test_parameter_counts_at_full_width(name: str, classes: int, shape: tuple[int, ...],
                                        low: float, high: float) -> None:
    assert low <= _params(build_model(name, classes, shape)) <= high


def test_width_scales_hidden_layers_only() -> None:
    vgg = build_model("vgg11", 10, (3, 32, 32), width=0.25)
    convs = [m for m in vgg.modules() if isinstance(m, nn.Conv2d)]
    assert convs[0].in_channels == 3 and convs[0].out_channels == 16 and convs[-1].out_channels == 128
    assert vgg.classifier[-1].out_features == 10 and vgg.classifier[0].in_features == 128
    resnet = build_model("resnet18", 100, (3, 32, 32), width=0.0625)
    assert resnet.classifier.in_features == 32 and resnet.classifier.out_features == 100
    lm = build_model("transformer_lm", 50, (12,), width=0.25)
    assert lm.embed.embedding_dim == 24 and lm.blocks[0].attn.heads == 4 and lm.blocks[0].attn.head_dim == 6
    assert lm.blocks[0].ff1.out_features == 96 and lm.head.out_features == 50
    tiny = build_model("transformer_lm", 50, (12,), width=0.0625)  # ceil(0.0625 * 96 / 4) = 2
    assert tiny.embed.embedding_dim == 8
    lstm = build_model("char_lstm", 97, (10,), width=0.25)
    assert lstm.lstm.hidden_size == 64 and lstm.embed.embedding_dim == 8
    with pytest.raises(ValueError):
        build_model("vgg11", 10, (3, 32, 32), width=0.0)


def test_resnet_batch_norm_and_stems() -> None:
    model = build_model("resnet18", 100, (3, 32, 32))
    buffers = dict(model.named_buffers())
    assert any(k.endswith("running_mean") for k in buffers) and any(k.endswith("running_var") for k in buffers)
    assert sum(isinstance(m, nn.BatchNorm2d) for m in model.modules()) == 20  # 17 + 3 shortcut BNs
    shortcuts = [m.shortcut for m in model.modules() if hasattr(m, "shortcut")]
    assert sum(isinstance(s, nn.Sequential) for s in shortcuts) == 3
    assert model.stem[0].kernel_size == (3, 3)
    assert build_model("resnet18", 100, (3, 168, 168)).stem[0].kernel_size == (7, 7)
    assert build_model("resnet18", 100, (3, 168, 168), small_input=True).stem[0].kernel_size == (3, 3)


def test_vgg_has_no_batch_norm() -> None:
    model = build_model("vgg11", 10, (3, 32, 32))
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert len(list(model.buffers())) == 0


@pytest.mark.parametrize("name", ["transformer_lm", "char_lstm"])
def test_language_models_are_causal(name: str) -> None:
    torch.manual_seed(1)
    model = build_model(name, 30, (16,), width=0.5).eval()
    tokens = torch.randint(0, 30, (1, 16))
    changed = tokens.clone()
    changed[0, 9] = (tokens[0, 9] + 1) % 30
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert torch.allclose(a[:, :9], b[:, :9], atol=1e-6)
    assert not torch.allclose(a[:, 9:], b[:, 9:])


def test_transformer_rejects_too_long_inputs_and_builders_do_not_reseed() -> None:
    model = build_model("transformer_lm", 30, (8,))
    with pytest.raises(ValueError, match="max_len"):
        model(torch.zeros(1, 9, dtype=torch.long))
    assert build_model("transformer_lm", 30, (8,), max_len=16)(torch.zeros(1, 9, dtype=torch.long)).shape == (1, 9, 30)
    first, second = build_model("vgg11", 10, (3, 32, 32)), build_model("vgg11", 10, (3, 32, 32))
    assert not torch.equal(first.features[0].weight, second.features[0].weight)


def test_conv2_batch_norm_option_adds_one_bn_per_conv_and_keeps_the_paper_model_by_default() -> None:
    plain = build_model("conv2", 10, (1, 28, 28), channels=(16, 32), hidden=512)
    normed = build_model("conv2", 10, (1, 28, 28), channels=(16, 32), hidden=512, batch_norm=True)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in plain.modules())
    bns = [m for m in normed.modules() if isinstance(m, nn.BatchNorm2d)]
    assert [bn.num_features for bn in bns] == [16, 32]
    # the paper's parameter names (and so masks and checkpoints) are unchanged without the option
    assert [n for n, _ in plain.named_parameters()][:4] == ["features.0.weight", "features.0.bias",
                                                           "features.3.weight", "features.3.bias"]
    assert _params(normed) - _params(plain) == 2 * (16 + 32)
    assert normed(torch.randn(3, 1, 28, 28)).shape == (3, 10)
