"""muP (model.mup) against Microsoft's mup package on the same nxd models: the widths it reads from base shapes, the
base-shape files either writes, the initialisation, MuAdam's and MuSGD's parameter groups, and the readout and
attention scaling worked by hand."""

from __future__ import annotations

import math
from dataclasses import replace

import mup
import pytest
import torch
import torch.nn.functional as F
import yaml
from mup.coord_check import get_coord_data
from nxd_models import (
    GPTConfig,
    GPTForCausalLM,
    ModelConfigError,
    MupSpec,
    gpt_base_shapes,
    initialise,
    model_family,
    read_base_shapes,
)
from nxd_models.base_shapes import widened
from nxd_models.coordinate_check import coordinate_sizes
from nxd_models.maximal_update import base_shapes_text, widths
from nxd_precision import build_optimizer

BASE = GPTConfig(
    vocab_size=64,
    num_layers=2,
    hidden_size=16,
    num_attention_heads=2,
    seq_length=8,
    ffn_hidden_size=24,
    make_vocab_size_divisible_by=1,
    hidden_dropout=0.0,
    attention_dropout=0.0,
    share_embeddings_and_output_weights=False,
)
WIDE = replace(BASE, hidden_size=64, ffn_hidden_size=96)


def _spec(**settings: float) -> MupSpec:
    return MupSpec(tuple((name, tuple(shape)) for name, shape in gpt_base_shapes(BASE, 2).items()), **settings)


def _mup_reference(target: GPTForCausalLM, base_file=None) -> GPTForCausalLM:
    """`target` with mup's infshapes: from BASE and a delta model twice as wide, or from a base-shape file."""
    if base_file is None:
        tied = replace(BASE, share_embeddings_and_output_weights=target.config.share_embeddings_and_output_weights)
        with torch.device("meta"):
            base, delta = GPTForCausalLM(tied), GPTForCausalLM(replace(tied, hidden_size=32, ffn_hidden_size=48))
        return mup.set_base_shapes(target, base, delta=delta, rescale_params=False, do_assert=False)
    return mup.set_base_shapes(target, str(base_file), rescale_params=False, do_assert=False)


@pytest.mark.parametrize("tied", [False, True])
def test_widths_are_mups_infshapes(tied):
    config = replace(WIDE, share_embeddings_and_output_weights=tied)
    base = replace(BASE, share_embeddings_and_output_weights=tied)
    spec = MupSpec(tuple((name, tuple(shape)) for name, shape in gpt_base_shapes(base, 2).items()))
    model = GPTForCausalLM(replace(config, mup=spec))
    reference = _mup_reference(GPTForCausalLM(config))
    seen = set()
    for name, parameter in reference.named_parameters():
        width = model.mup_widths[name]
        infshape = parameter.infshape
        assert (width.widths, width.multiplier) == (infshape.ninf(), infshape.width_mult()), name
        if infshape.ninf() == 2:
            assert width.fan_ratio == infshape.fanin_fanout_mult_ratio(), name
        seen.add((width.widths, width.multiplier))
    assert seen == {(1, 4.0), (2, 4.0)}  # vectors and matrices; every parameter has a width here
    names = [name for name, _ in model.named_parameters()]  # a tied output layer is the embedding's parameter
    assert len(model_family(model.config).optimizer_scales(names, "adamw")) == len(names)


def test_base_shape_files_are_mups(tmp_path):
    """The file nxd writes is the file mup's make_base_shapes writes, and each reads the other's."""
    with torch.device("meta"):
        base, delta = GPTForCausalLM(BASE), GPTForCausalLM(replace(BASE, hidden_size=32, ffn_hidden_size=48))
    theirs = tmp_path / "mup.bsh"
    mup.make_base_shapes(base, delta, savefile=str(theirs))
    ours = tmp_path / "nxd.bsh"
    ours.write_text(base_shapes_text(gpt_base_shapes(BASE, 2)))
    assert yaml.safe_load(ours.read_text()) == yaml.safe_load(theirs.read_text())
    assert read_base_shapes(theirs) == read_base_shapes(ours)
    model = GPTForCausalLM(replace(WIDE, mup=MupSpec(read_base_shapes(theirs))))
    for name, parameter in _mup_reference(GPTForCausalLM(WIDE), ours).named_parameters():
        assert model.mup_widths[name].multiplier == parameter.infshape.width_mult(), name


def test_base_shapes_of_another_model_are_refused(tmp_path):
    path = tmp_path / "other.bsh"
    path.write_text(base_shapes_text(gpt_base_shapes(replace(BASE, num_layers=3), 2)))
    with pytest.raises(ModelConfigError, match="not in the model: model.layers.2"):
        GPTForCausalLM(replace(WIDE, mup=MupSpec(read_base_shapes(path))))
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ModelConfigError, match="expected a mapping of parameter names to lists"):
        read_base_shapes(path)
    with pytest.raises(ModelConfigError, match="no such file"):
        read_base_shapes(tmp_path / "absent.bsh")


@pytest.mark.parametrize(("optimizer", "reference"), [("adamw", mup.MuAdamW), ("sgd", mup.MuSGD)])
def test_optimizer_groups_are_mups(optimizer, reference):
    """Every parameter's learning rate and weight decay equal those MuAdamW / MuSGD give it (weight decay on every
    parameter, as mup's groups know no exemptions)."""
    model = GPTForCausalLM(replace(WIDE, mup=_spec()))
    names = [name for name, _ in model.named_parameters()]
    scales = model_family(model.config).optimizer_scales(names, optimizer)
    ours = build_optimizer(
        optimizer, model.parameters(), {"lr": 0.01, "weight_decay": 0.1}, decay_norms_and_biases=True, scales=scales
    )
    references = list(_mup_reference(GPTForCausalLM(WIDE)).parameters())
    theirs = reference(references, lr=0.01, weight_decay=0.1)
    mine = {id(p): (group["lr"], group["weight_decay"]) for group in ours.param_groups for p in group["params"]}
    wanted = {id(p): (group["lr"], group["weight_decay"]) for group in theirs.param_groups for p in group["params"]}
    for name, parameter, twin in zip(names, model.parameters(), references, strict=True):
        assert mine[id(parameter)] == pytest.approx(wanted[id(twin)], rel=1e-12), name
    rates = {lr for lr, _ in mine.values()}
    assert rates == ({0.01, 0.01 / 4} if optimizer == "adamw" else {0.01 * 4, 0.01})


def test_initialisation_is_mups_normal_times_init_scale():
    """Each weight is the standard draw times mup's normal_ factor (1 / sqrt(multiplier) for matrices) and
    mup_init_scale; mup's normal_ on the same generator state draws the same matrix."""
    with torch.device("meta"):
        plain, scaled = GPTForCausalLM(WIDE), GPTForCausalLM(replace(WIDE, mup=_spec(init_scale=0.5)))
    initialise(plain, seed=3, device=torch.device("cpu"))
    initialise(scaled, seed=3, device=torch.device("cpu"))
    reference = _mup_reference(GPTForCausalLM(WIDE))
    infshapes = {name: p.infshape for name, p in reference.named_parameters()}
    for name, parameter in scaled.named_parameters():
        expected = dict(plain.named_parameters())[name].detach()
        if parameter.dim() > 1:
            factor = 0.5 / math.sqrt(4.0) if infshapes[name].ninf() == 2 else 0.5
            expected = expected * factor
        torch.testing.assert_close(parameter.detach(), expected, rtol=0, atol=0, msg=name)
    weight = torch.empty(64, 64)
    weight.infshape = infshapes["model.layers.0.self_attn.q_proj.weight"]
    torch.manual_seed(0)
    mup.init.normal_(weight, std=0.02)
    torch.manual_seed(0)
    torch.testing.assert_close(weight, torch.empty(64, 64).normal_(0, 0.02) / 2, rtol=1e-6, atol=0)


def test_readout_attention_and_embeddings_scale_as_written():
    """The logits of a one-layer muP model equal the forward pass written out by hand: embeddings x
    embedding_multiplier (positions x their multiplier), softmax(q.k / (d x attention_temperature)), and the output
    layer reading its input / (width multiplier x output_temperature) as mup's MuReadout."""
    config = replace(WIDE, num_layers=1, position_embedding_multiplier=0.5)
    spec = MupSpec(
        tuple((name, tuple(shape)) for name, shape in gpt_base_shapes(replace(BASE, num_layers=1), 2).items()),
        attention_temperature=2.0,
        output_temperature=1.5,
        embedding_multiplier=3.0,
    )
    model = GPTForCausalLM(replace(config, mup=spec)).eval()
    torch.manual_seed(0)
    for parameter in model.parameters():
        parameter.data.normal_(0, 0.1)
    ids = torch.randint(0, 64, (2, 8))
    logits = model(ids)
    decoder, layer = model.model, model.model.layers[0]
    positions = torch.arange(8)
    hidden = (decoder.embed_tokens(ids) + 0.5 * decoder.position_embeddings(positions)) * 3.0
    normed = layer.input_layernorm(hidden)
    attention = layer.self_attn
    heads, d = 2, 32
    q, k, v = (
        proj(normed).view(2, 8, heads, d).transpose(1, 2)
        for proj in (attention.q_proj, attention.k_proj, attention.v_proj)
    )
    scores = q @ k.transpose(-1, -2) / (d * 2.0)
    scores = scores.masked_fill(~torch.ones(8, 8, dtype=torch.bool).tril(), float("-inf"))
    context = (F.softmax(scores, -1) @ v).transpose(1, 2).reshape(2, 8, -1)
    hidden = hidden + attention.o_proj(context)
    hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    expected = model.lm_head(decoder.norm(hidden) / (4.0 * 1.5))
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-6)


def test_widths_check_their_shapes():
    base = {"w": [None, 8]}
    with pytest.raises(ModelConfigError, match="w: expected 3 dimensions, found 2"):
        widths(base, {"w": (2, 16, 4)})


def test_coordinate_sizes_are_mups_coord_data(tmp_path):
    """nxd's coordinate check records what mup's get_coord_data records for the same muP models stepped by MuAdam
    (nxd's own Adam groups on one side, mup's on the other), on the same fixed batch."""
    path = tmp_path / "base.bsh"
    path.write_text(base_shapes_text(gpt_base_shapes(BASE, 2)))
    spec = MupSpec(read_base_shapes(path), attention_temperature=2.0)

    def build(width: int) -> GPTForCausalLM:
        with torch.device("meta"):
            model = GPTForCausalLM(widened(replace(BASE, mup=spec), width))
        return initialise(model, seed=5, device=torch.device("cpu"))

    def adam(model: GPTForCausalLM) -> torch.optim.Optimizer:
        names = [name for name, _ in model.named_parameters()]
        return build_optimizer(
            "adam",
            model.parameters(),
            {"lr": 0.01},
            decay_norms_and_biases=True,
            scales=model_family(model.config).optimizer_scales(names, "adam"),
        )

    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}
    widths = [16, 32, 64]
    ours = coordinate_sizes(
        build,
        widths,
        [batch] * 3,
        lambda model, b: F.cross_entropy(model(b["input_ids"]).flatten(0, 1), b["labels"].flatten()),
        adam,
    )
    models = {
        width: (lambda width=width: mup.set_base_shapes(build(width), str(path), rescale_params=False, do_assert=False))
        for width in widths
    }
    theirs = get_coord_data(
        models,
        [(batch["input_ids"], batch["labels"].flatten())],
        optimizer="adam",
        lr=0.01,
        mup=True,
        nsteps=3,
        cuda=False,
        flatten_output=True,
        show_progress=False,
    )
    assert [(row["width"], row["module"], row["t"]) for row in ours] == list(
        zip(theirs["width"], theirs["module"], theirs["t"], strict=True)
    )
    assert [row["l1"] for row in ours] == pytest.approx(list(theirs["l1"]), rel=1e-5)
    assert {row["module"] for row in ours} >= {"", "lm_head", "model.layers.1.mlp.down_proj"}
