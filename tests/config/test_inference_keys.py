"""The generate and eval sections: GPT-NeoX's text generation keys map onto them, QEfficient and NxDT files
carry them as nxd sections, and bad values are named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from nxd_config import ConfigError, load_config
from nxd_train.cli import default_config_path

from tests.config.test_neox_dialect import MODEL, errors, load

TEXT_GENERATION = {
    "text_gen_type": "input-file",
    "maximum_tokens": 102,
    "prompt_end": "\n",
    "temperature": 1.0,
    "top_p": 0.0,
    "top_k": 0,
    "recompute": False,
    "num_samples": 10,
    "sample_input_file": "sample_input.txt",
    "sample_output_file": "sample_output.txt",
}
"""GPT-NeoX's configs/text_generation.yml (text_gen_type changed from unconditional)."""


def test_neox_text_generation_keys_become_the_generate_and_eval_sections(tmp_path):
    config = load(
        tmp_path,
        MODEL,
        TEXT_GENERATION,
        {"eval_tasks": ["lambada_openai", "hellaswag"], "eval_results_prefix": "runs/pythia", "return_logits": True},
    )
    g = config.generate
    assert (g.text_gen_type, g.maximum_tokens, g.temperature, g.top_p, g.top_k, g.recompute, g.num_samples) == (
        "input-file",
        102,
        1.0,
        0.0,
        0,
        False,
        10,
    )
    assert (g.sample_input_file, g.sample_output_file, g.prompt_end, g.return_logits) == (
        "sample_input.txt",
        "sample_output.txt",
        "\n",
        True,
    )
    assert config.eval.tasks == ("lambada_openai", "hellaswag") and config.eval.results_prefix == "runs/pythia"
    assert load(tmp_path, MODEL, overrides=("+temperature=0.7",)).generate.temperature == 0.7
    silent = load(tmp_path, MODEL)
    assert silent.generate.maximum_tokens == 64 and silent.generate.text_gen_type == "unconditional"  # NeoX's


def test_neox_generation_values_nxd_cannot_honour_are_named(tmp_path):
    found = errors(tmp_path, MODEL, {"text_gen_type": "precompute", "top_k": "ten", "eval_tasks": [1]})
    assert any(
        "text_gen_type: expected unconditional, input-file or interactive: nxd computes a DPO or KTO run's "
        "reference log-probs itself" in line
        for line in found
    ), found
    assert any("top_k: expected a value of type int, found 'ten'" in line for line in found), found
    assert any(
        "eval_tasks: expected a list of lm-evaluation-harness task names, found [1]" in line for line in found
    ), found
    found = errors(tmp_path, MODEL, {"top_p": 1.5})
    assert any("generate.top_p" in line and "1" in line for line in found), found


def test_qeff_and_nxdt_files_carry_the_sections(tmp_path):
    qeff = yaml.safe_load(Path("configs/qeff/sft_single_device_gsm8k_config.yaml").read_text())
    qeff["generate"] = {"temperature": 0.5, "maximum_tokens": 20}
    qeff["eval"] = {"tasks": ["arc_easy"]}
    path = tmp_path / "qeff.yaml"
    path.write_text(yaml.safe_dump(qeff))
    from nxd_config.qeff.translate import translate

    tree = translate(qeff, "run").tree
    assert tree["generate"] == {"temperature": 0.5, "maximum_tokens": 20} and tree["eval"] == {"tasks": ["arc_easy"]}
    nxdt = tmp_path / "nxdt.yaml"
    nxdt.write_text("name: x\ngenerate:\n  top_k: 5\n  temprature: 0.3\n")
    with pytest.raises(ConfigError) as caught:
        load_config([nxdt])
    assert "generate.temprature" in str(caught.value)
    config = load_config([default_config_path()], ["+generate.top_k=7", "+eval.tasks=[arc_easy]", "+eval.limit=10"])
    assert config.generate.top_k == 7 and config.eval.tasks == ("arc_easy",) and config.eval.limit == 10
