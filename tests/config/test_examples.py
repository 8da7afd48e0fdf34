"""Every shipped config passes validation; the NxDT-shaped ones keep NxDT's layout."""

from pathlib import Path

import pytest
from nxd_config import load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def test_the_shipped_examples_are_all_there() -> None:
    names = {path.stem for path in CONFIGS}
    assert {
        "tiny",
        "megatron_llama_7B",
        "megatron_gpt",
        "megatron_mistral",
        "hf_llama3_8B",
        "hf_llama3_8B_SFT",
        "hf_llama3_8B_SFT_lora",
        "hf_llama3_8B_DPO",
        "hf_llama3_8B_ORPO",
    } <= names


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_example_is_valid(path: Path) -> None:
    load_config(path)


def test_the_neox_example_loads_as_neox_users_pass_it() -> None:
    config = load_config([ROOT / "configs" / "neox" / "pythia_tiny.yml", ROOT / "configs" / "neox" / "local_setup.yml"])
    assert config.model.transformer_block_type == "gpt_neox" and config.model.rotary_percentage == 0.25
    assert config.exp_manager.explicit_log_dir == "runs/pythia_tiny" and config.exp_manager.resume_if_exists


def test_examples_say_what_they_are() -> None:
    by_name = {path.stem: load_config(path) for path in CONFIGS}
    assert by_name["megatron_llama_7B"].distributed_strategy.tensor_model_parallel_size == 8
    assert by_name["megatron_gpt"].data.tokenizer.library == "megatron"
    assert by_name["megatron_mistral"].model.sliding_window_size == 4096
    assert by_name["hf_llama3_8B"].model_source == "hf"
    assert by_name["hf_llama3_8B_SFT"].model_alignment_strategy.method == "sft"
    lora = by_name["hf_llama3_8B_SFT_lora"].model_alignment_strategy
    assert lora.method == "sft" and lora.peft.target_modules == ("qkv_proj",)
    assert by_name["hf_llama3_8B_DPO"].model_alignment_strategy.method == "dpo"
    assert by_name["hf_llama3_8B_ORPO"].model_alignment_strategy.method == "orpo"
    assert by_name["tiny_sft"].model_alignment_strategy.sft.packing
    for name, config in by_name.items():
        # shipped examples point at a config.json that ships too; tiny_sft fine-tunes the export the README makes
        if config.model_source == "hf" and name != "tiny_sft":
            assert (ROOT / config.model.hf_model_config).is_file(), config.model.hf_model_config
