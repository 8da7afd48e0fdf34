"""The key tables of docs/config-reference.md are the schema's and the GPT-NeoX key list's, and every key says what
it does and who acts on it."""

from pathlib import Path

from nxd_config.neox import table as neox_table
from nxd_config.reference import END, START, key_table
from nxd_config.validation import iter_keys

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "config-reference.md"


def test_readme_table_is_current() -> None:
    text = REFERENCE.read_text()
    table = text.split(START, 1)[1].split(END, 1)[0].strip()
    assert table == key_table().strip(), "run: uv run python -m nxd_config.reference --update docs/config-reference.md"


def test_neox_table_is_current() -> None:
    table = REFERENCE.read_text().split(neox_table.START, 1)[1].split(neox_table.END, 1)[0].strip()
    assert table == neox_table.key_table().strip(), (
        "run: uv run python -m nxd_config.neox.table --update docs/config-reference.md"
    )


def test_every_key_is_documented_with_a_status() -> None:
    for path, field, owners in iter_keys():
        if path.endswith(".name") and len(owners) > 1:
            continue  # the optimizer / scheduler choice itself
        extra = field.json_schema_extra or {}
        assert field.description, f"{path} has no description"
        if extra.get("status") != "honoured":
            assert extra.get("note"), f"{path} is {extra.get('status')} without saying why"


def test_reference_covers_nxdt_keys() -> None:
    keys = {path for path, _, _ in iter_keys()}
    documented = [
        "trainer.lnc",
        "trainer.sequential_move_factor",
        "exp_manager.ckpt_ptl_version",
        "exp_manager.checkpoint_callback_params.use_master_weights_in_ckpt",
        "exp_manager.checkpoint_callback_params.train_time_interval",
        "exp_manager.checkpoint_callback_params.enable_version_counter",
        "exp_manager.save_bf16",
        "exp_manager.log_step_timing",
        "distributed_strategy.context_parallel_size",
        "distributed_strategy.kv_replicator",
        "model.fusions.ring_attention",
        "model.transpose_nki_inputs",
        "model.pipeline_cuts",
        "precision.parallel_layers_reduce_dtype",
        "model.moe.router_aux_loss_coef",
        "data.tokenizer.sentencepiece_legacy",
        "data.no_seqlen_plus_one_input_tokens",
        "model_alignment_strategy.peft.merge_sharded_lora",
        "model_alignment_strategy.orpo.beta",
        "aync_exec_max_inflight_requests",
        "neuron_experimental_compress_rg",
    ]
    assert [key for key in documented if key not in keys] == []
