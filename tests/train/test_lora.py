"""LoRA fine-tuning through nxd-train in one process, on a Hugging Face model directory: the adapter
checkpoints (small, with peft's adapter files), peft and transformers loading the exports with nxd's
logits, exact resume on the base, starting from a saved adapter, and one clear error per bad input."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from nxd_ckpt import MODEL_KEY, list_checkpoints, load_checkpoint
from nxd_config import load_config
from nxd_train.checks.preflight import plan_run
from nxd_train.cli import main
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from tests.qeff_fixtures import tiny_model
from tests.training_runs import FAST, losses, read_metrics, saved_state

ROOT = Path(__file__).resolve().parents[2]
PEFT = "+model_alignment_strategy.peft"
LORA = [
    f"{PEFT}.lora_rank=4",
    f"{PEFT}.lora_alpha=8",
    f"{PEFT}.lora_dropout=0.0",
    f"{PEFT}.target_modules=[qkv_proj,o_proj,gate_up_proj,down_proj]",
]
SAVE = [
    "exp_manager.create_checkpoint_callback=True",
    "exp_manager.checkpoint_callback_params.save_top_k=-1",
    "+exp_manager.checkpoint_callback_params.every_n_train_steps=3",
]


@pytest.fixture
def hf_base(tmp_path, chat_tokenizer_dir) -> Path:
    """A tiny Llama directory (weights, config.json, the chat tokenizer), as `ckpt export-hf` writes one."""
    return tiny_model(tmp_path / "tiny_hf", chat_tokenizer_dir)


def _job(base: Path, log_dir: Path, *overrides: str) -> list[str]:
    """configs/tiny_sft.yaml on `base`, logging to `log_dir`."""
    return [
        "-c",
        str(ROOT / "configs" / "tiny_sft.yaml"),
        *FAST,
        "trainer.max_steps=6",
        "precision.type=fp32",
        f"data.train_dir={ROOT / 'configs/data/sft_train.jsonl'}",
        f"data.val_dir={ROOT / 'configs/data/sft_validation.jsonl'}",
        f"data.tokenizer.type={base}",
        f"model.model_config={base}",
        f"exp_manager.resume_from_checkpoint={base}",
        f"+exp_manager.explicit_log_dir={log_dir}",
        *overrides,
    ]


def _checkpoints(log_dir: Path) -> dict[int, Path]:
    return {info.step: info.path for info in list_checkpoints(log_dir / "checkpoints")}


def _model_bytes(checkpoint: Path) -> int:
    return sum(t.nbytes for t in saved_state(checkpoint, MODEL_KEY)[MODEL_KEY].values())


def _optimizer_bytes(checkpoint: Path) -> int:
    state = saved_state(checkpoint, "optimizer")["optimizer"]
    tensors = [v for s in state["state"].values() for v in s.values() if torch.is_tensor(v) and v.ndim]
    return sum(t.nbytes for t in tensors)


@torch.no_grad()
def _nxd_logits(base: Path, checkpoint: Path, ids: torch.Tensor) -> torch.Tensor:
    """The logits of nxd's own adapted model with the checkpoint's adapters and base."""
    plan = plan_run(
        load_config(ROOT / "configs" / "tiny_sft.yaml", _job(base, checkpoint.parent / "x", *LORA)[2:]),
        checkpoint.parent / "cache",
    )
    model = plan.family.build(torch.device("cpu"))
    load_checkpoint(checkpoint, {MODEL_KEY: plan.family.checkpoint_weights(model, base="frozen")})
    return plan.family.logits(model, {"input_ids": ids, "position_ids": torch.arange(ids.shape[1]).expand_as(ids)})


def test_lora_checkpoints_are_small_and_their_exports_load_in_peft_and_transformers(tmp_path, hf_base, capsys):
    from peft import PeftModel

    assert (
        main(
            _job(
                hf_base,
                tmp_path / "lora",
                *LORA,
                *SAVE,
                f"{PEFT}.save_lora_base=True",
                f"{PEFT}.merge_sharded_lora=True",
                "model.optim.lr=1e-2",
            )
        )
        == 0
    )
    assert main(_job(hf_base, tmp_path / "small", *LORA, *SAVE)) == 0
    assert main(_job(hf_base, tmp_path / "full", *SAVE)) == 0
    log = (tmp_path / "lora" / "nxd_log_globalrank-0_localrank-0.txt").read_text()
    assert "LoRA r=4 alpha=8 on 14 layers: 4,096 adapter parameters" in log
    lora, small, full = (_checkpoints(tmp_path / name)[6] for name in ("lora", "small", "full"))
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in lora.iterdir()}
    assert "adapter_config.json" in {p.name for p in small.iterdir()}
    adapter_bytes, full_bytes = (_model_bytes(path) + _optimizer_bytes(path) for path in (small, full))
    assert adapter_bytes < 0.15 * full_bytes, (adapter_bytes, full_bytes)
    # Adam's two moments: 2 x 4 bytes x 4,096 adapter values, against every one of the model's values
    assert _optimizer_bytes(small) == 2 * 4 * 4096
    assert _optimizer_bytes(full) == 2 * 4 * sum(
        p.numel() for p in LlamaForCausalLM(LlamaConfig.from_pretrained(hf_base)).parameters()
    )

    assert main(["ckpt", "export-hf", str(lora), str(tmp_path / "adapter")]) == 0
    assert main(["ckpt", "export-hf", str(lora), str(tmp_path / "merged"), "--merged"]) == 0
    assert main(["ckpt", "export-hf", str(small), str(tmp_path / "no_base"), "--merged"]) == 1
    assert "holds the adapters without their base model" in capsys.readouterr().err
    ids = torch.randint(0, 320, (2, 24), generator=torch.Generator().manual_seed(1))
    ours = _nxd_logits(hf_base, lora, ids)
    with torch.no_grad():
        peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(hf_base), tmp_path / "adapter")(ids)
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")(ids)
        plain = AutoModelForCausalLM.from_pretrained(hf_base)(ids)
    assert (peft.logits - plain.logits).abs().max() > 1e-2  # the adapters trained
    torch.testing.assert_close(peft.logits, ours, rtol=0, atol=1e-5)
    torch.testing.assert_close(merged.logits, ours, rtol=0, atol=1e-5)
    # merge_lora: the checkpoint's merged weights are the same model
    assert (
        main(_job(hf_base, tmp_path / "merging", *LORA, *SAVE, f"{PEFT}.merge_lora=True", "model.optim.lr=1e-2")) == 0
    )
    assert (
        main(["ckpt", "export-hf", str(_checkpoints(tmp_path / "merging")[6]), str(tmp_path / "m2"), "--merged"]) == 0
    )
    with torch.no_grad():
        torch.testing.assert_close(
            AutoModelForCausalLM.from_pretrained(tmp_path / "m2")(ids).logits, ours, rtol=0, atol=1e-5
        )
    # the adapter folder a checkpoint holds (merge_sharded_lora) is the same adapter
    with torch.no_grad():
        inside = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(hf_base), lora)(ids)
    assert torch.equal(inside.logits, peft.logits)


@pytest.mark.parametrize("base", [None, "save_lora_base", "merge_lora", "full fine-tuning"])
def test_a_restarted_run_continues_exactly_on_its_base(tmp_path, hf_base, base):
    """A run started from resume_from_checkpoint (weight_init_only) and restarted with resume_if_exists
    continues from its own newest checkpoint. LoRA with adapters only or with the merged weights: the
    base comes from resume_from_checkpoint; with save_lora_base, from the checkpoint itself."""
    job = [*SAVE] if base == "full fine-tuning" else [*LORA, *SAVE, *([f"{PEFT}.{base}=True"] if base else [])]
    assert main(_job(hf_base, tmp_path / "whole", *job)) == 0
    whole = read_metrics(tmp_path / "whole")
    step_3 = _checkpoints(tmp_path / "whole")[3]
    (tmp_path / "resumed" / "checkpoints").mkdir(parents=True)
    shutil.copytree(step_3, tmp_path / "resumed" / "checkpoints" / step_3.name)
    assert main(_job(hf_base, tmp_path / "resumed", *job, "exp_manager.resume_if_exists=True")) == 0
    resumed = read_metrics(tmp_path / "resumed")
    assert [row["loss"] for row in resumed if "loss" in row and row["step"] > 3] == losses(whole)[3:]
    log = (tmp_path / "resumed" / "nxd_log_globalrank-0_localrank-0.txt").read_text()
    assert f"initial weights from {hf_base}" not in log and "resumed from" in log


def test_load_lora_from_ckpt_starts_a_new_run_from_saved_adapters(tmp_path, hf_base):
    assert main(_job(hf_base, tmp_path / "first", *LORA, *SAVE, "model.optim.lr=1e-2")) == 0
    saved = _checkpoints(tmp_path / "first")[6]
    assert (
        main(
            _job(
                hf_base,
                tmp_path / "second",
                *LORA,
                *SAVE,
                "trainer.max_steps=3",
                "model.optim.lr=0.0",
                f"exp_manager.resume_from_checkpoint={saved}",
                f"{PEFT}.load_lora_from_ckpt=True",
            )
        )
        == 0
    )
    before = saved_state(saved, MODEL_KEY)[MODEL_KEY]
    after = saved_state(_checkpoints(tmp_path / "second")[3], MODEL_KEY)[MODEL_KEY]
    assert set(before) == set(after) and all(torch.equal(before[key], after[key]) for key in before)


def _error(capsys, *arguments: str) -> str:
    assert main(list(arguments)) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


SET = PEFT.removeprefix("+")


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ([f"{SET}.lora_rank=0"], "model_alignment_strategy.peft.lora_rank"),
        ([f"{SET}.lora_alpha=0"], "model_alignment_strategy.peft.lora_alpha"),
        (
            [f"{SET}.target_modules=[attn]"],
            "model_alignment_strategy.peft.target_modules: 'attn' names no linear layer "
            "of this model; expected some of down_proj, gate_proj",
        ),
        ([f"{SET}.target_modules=[mlp]"], "'mlp' is a LlamaMLP, not a linear layer"),
        ([f"{PEFT}.save_lora_base=True", f"{PEFT}.merge_lora=True"], "save_lora_base and merge_lora both write"),
        (
            [f"{PEFT}.load_lora_from_ckpt=True", "~exp_manager.resume_from_checkpoint"],
            "load_lora_from_ckpt: expected the LoRA checkpoint in exp_manager",
        ),
    ],
)
def test_bad_lora_settings_are_one_clear_error(tmp_path, hf_base, capsys, overrides, expected):
    assert expected in _error(capsys, *_job(hf_base, tmp_path / "bad", *LORA, *overrides))


def test_an_adapter_checkpoint_for_another_shape_is_refused_by_name(tmp_path, hf_base, capsys):
    assert main(_job(hf_base, tmp_path / "first", *LORA, *SAVE, "trainer.max_steps=3")) == 0
    saved = _checkpoints(tmp_path / "first")[3]
    err = _error(
        capsys,
        *_job(
            hf_base,
            tmp_path / "second",
            *LORA,
            f"{SET}.lora_rank=8",
            f"exp_manager.resume_from_checkpoint={saved}",
            f"{PEFT}.load_lora_from_ckpt=True",
        ),
    )
    assert str(saved) in err and "lora_A" in err


def test_continued_pretraining_with_lora_trains_only_the_adapters(tmp_path, train_here):
    """The default job (Megatron data, the Megatron-style model) with adapters: the checkpoint holds
    the adapters, every one of them moved, and lora_verbose names each adapted layer."""
    rows = train_here(
        *LORA, f"{PEFT}.lora_verbose=True", "trainer.max_steps=3", "exp_manager.create_checkpoint_callback=True"
    )
    assert len(losses(rows)) == 3
    log = (tmp_path / "run0" / "nxd_log_globalrank-0_localrank-0.txt").read_text()
    assert "pretraining" in log and "  LoRA model.layers.0.self_attn.q_proj" in log
    saved = saved_state(_checkpoints(tmp_path / "run0")[3], MODEL_KEY)[MODEL_KEY]
    assert saved and all(".lora_A." in key or ".lora_B." in key for key in saved)
    assert all(saved[key].abs().max() > 0 for key in saved if ".lora_B." in key)  # B left zero
