"""Fine-tuning records from a Hugging Face dataset's columns (nxd_data.hub_records): templates and functions,
the built-in Alpaca prompt against the reference's function text, splits and filters, and one clear error
per bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from nxd_data import DataError, HubDataset, RecordForm, formatted_splits
from nxd_data.formatters import alpaca_prompt

from tests.qeff_fixtures import hub_datasets


def _reference_alpaca(row):
    """The reference's alpaca_func.py (QEfficient's configuration reference, "Prompt Function Example")."""
    if row["input"] == "":
        return (
            "Below is an instruction that describes a task. "
            "Write a response that appropriately completes the request.\n\n"
            "### Instruction:\n{instruction}\n\n### Response:\n"
        ).format_map(row)
    return (
        "Below is an instruction that describes a task, paired with an input that provides further context. "
        "Write a response that appropriately completes the request.\n\n"
        "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
    ).format_map(row)


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> dict[str, Path]:
    return hub_datasets(tmp_path_factory.mktemp("hub"))


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _made(tmp_path, source: HubDataset, form: RecordForm) -> dict[str, list[dict]]:
    return {name: _records(path) for name, path in formatted_splits(source, form, tmp_path, "data.dataset").items()}


def test_the_builtin_alpaca_prompt_is_the_references_text(hub, tmp_path):
    rows = [json.loads(line) for line in (hub["yahma/alpaca-cleaned"] / "train.jsonl").read_text().splitlines()]
    assert any(row["input"] == "" for row in rows) and any(row["input"] for row in rows)
    for row in rows:
        assert alpaca_prompt(row) == _reference_alpaca(row)
    made = _made(
        tmp_path,
        HubDataset(str(hub["yahma/alpaca-cleaned"])),
        RecordForm(prompt_func="nxd_data.formatters:alpaca_prompt", completion_template="{output}"),
    )
    assert made["train"] == [{"input": _reference_alpaca(row), "output": row["output"]} for row in rows]


def test_templates_splits_and_the_loss_on_the_prompt(hub, tmp_path):
    form = RecordForm(prompt_template="Summarize:\n{dialogue}\nSummary:\n", completion_template="{summary}")
    made = _made(tmp_path, HubDataset(str(hub["knkarthick/samsum"]), validation_split="test"), form)
    assert len(made["train"]) == 24 and len(made["validation"]) == 6
    first = json.loads((hub["knkarthick/samsum"] / "train.jsonl").read_text().splitlines()[0])
    assert made["train"][0] == {"input": f"Summarize:\n{first['dialogue']}\nSummary:\n", "output": first["summary"]}
    whole = _made(
        tmp_path,
        HubDataset(str(hub["knkarthick/samsum"])),
        RecordForm(prompt_template=form.prompt_template, completion_template="{summary}", loss_on_prompt=True),
    )
    assert whole["train"][0] == {"input": "", "output": made["train"][0]["input"] + made["train"][0]["output"]}
    assert "validation" not in whole


def test_a_configuration_split_ratio_shuffle_category_and_sample_count(hub, tmp_path):
    gsm = _made(
        tmp_path,
        HubDataset(str(hub["openai/gsm8k"]), name="main", validation_split="test"),
        RecordForm(prompt_template="{question}", completion_template="{answer}"),
    )
    assert len(gsm["train"]) == 24 and len(gsm["validation"]) == 6
    split = _made(
        tmp_path,
        HubDataset(str(hub["grammar"]), validation_split="test", split_ratio=0.8, seed=42),
        RecordForm(prompt_template="{input}", completion_template="{target}"),
    )
    assert (len(split["train"]), len(split["validation"])) == (24, 6)
    assert not {r["input"] for r in split["train"]} & {r["input"] for r in split["validation"]}
    rows = [json.loads(line) for line in (hub["hallisky/DiSC"] / "train.jsonl").read_text().splitlines()]
    disc = _made(
        tmp_path,
        HubDataset(str(hub["hallisky/DiSC"]), category="sarcasm_more", num_samples=5, seed=1),
        RecordForm(prompt_template="{original}", completion_template="{generation}"),
    )
    sarcastic = {row["original"] for row in rows if row["category"] == "sarcasm_more"}
    assert len(disc["train"]) == 5 and {r["input"] for r in disc["train"]} <= sarcastic


def test_text_records_and_empty_rows(hub, tmp_path):
    source = HubDataset(str(hub["Salesforce/wikitext"]), name="wikitext-103-raw-v1", validation_split="test")
    kept = _made(tmp_path, source, RecordForm(kind="text", prompt_template="{text}"))
    dropped = _made(
        tmp_path,
        HubDataset(**{**source.__dict__, "drop_empty": True}),
        RecordForm(kind="text", prompt_template="{text}"),
    )
    assert len(kept["validation"]) == 9 and len(dropped["validation"]) == 8
    assert dropped["train"][0] == {"input": "", "output": kept["train"][0]["output"]}


def test_bad_input_gets_one_message_each(hub, tmp_path):
    samsum = HubDataset(str(hub["knkarthick/samsum"]))

    def error(source: HubDataset, form: RecordForm) -> str:
        with pytest.raises(DataError) as raised:
            formatted_splits(source, form, tmp_path, "data.dataset")
        return str(raised.value)

    message = error(samsum, RecordForm(prompt_template="{dialog}", completion_template="{summary}"))
    assert (
        "dialog" in message
        and "dialogue, id, summary" in message.replace("id, dialogue", "dialogue, id")
        or ("columns are" in message and "dialogue" in message)
    )
    message = error(samsum, RecordForm(prompt_template="{dialogue}", prompt_func="x:y", completion_template="{id}"))
    assert "found both" in message
    message = error(samsum, RecordForm(kind="text", prompt_template="{dialogue}", completion_template="{id}"))
    assert "text records take no completion" in message
    message = error(samsum, RecordForm(prompt_func="no_such_module_here:f", completion_template="{id}"))
    assert "cannot be imported" in message and "no_such_module_here" in message
    user = tmp_path / "user_funcs.py"
    user.write_text("def prompt(row):\n    if row['id'] == '3':\n        raise KeyError('speaker')\n    return 'x'\n")
    message = error(samsum, RecordForm(prompt_func=f"{user}:prompt", completion_template="{summary}"))
    assert "row 3" in message and "KeyError" in message and "speaker" in message
    message = error(
        HubDataset(str(hub["hallisky/DiSC"]), category="poetry"),
        RecordForm(prompt_template="{original}", completion_template="{generation}"),
    )
    assert "no row" in message and "formal, sarcasm_more" in message
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "train.jsonl").write_text(json.dumps({"a": " ", "b": "x"}) + "\n")
    message = error(
        HubDataset(str(empty), drop_empty=True), RecordForm(prompt_template="{a}", completion_template="{b}")
    )
    assert "no rows left of 1" in message
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "train.jsonl").write_text('{"a": "x"}\n{a: x}\n')
    message = error(HubDataset(str(broken)), RecordForm(prompt_template="{a}", completion_template="{a}"))
    assert "cannot be read as a dataset" in message and str(broken) in message


def test_a_hub_id_out_of_reach_names_the_way_out(tmp_path, monkeypatch):
    import datasets
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # read when the libraries load: set where they keep it too
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(DataError) as raised:
        formatted_splits(
            HubDataset("nobody-here/no-such-dataset"),
            RecordForm(prompt_template="{a}", completion_template="{b}"),
            tmp_path,
            "data.dataset",
        )
    assert "HF_HUB_OFFLINE" in str(raised.value) and "nobody-here/no-such-dataset" in str(raised.value)
