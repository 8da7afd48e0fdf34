"""`nxd-train eval`: lm-evaluation-harness over a trained run gives the numbers lm-eval's own Hugging Face model
(`HFLM`) gives on the exported model, on task folders the test writes (no downloads): a multiple-choice task,
a rolling-perplexity task and a generate-until task."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from nxd_train.cli import default_config_path, main

from tests.train.test_generate import VARIED, _train

lm_eval = pytest.importorskip("lm_eval")

WORDS = [
    "def",
    "class",
    "return",
    "import",
    "self",
    "value",
    "list",
    "dict",
    "print",
    "open",
    "read",
    "write",
    "with",
    "for",
    "while",
    "if",
    "else",
    "try",
]


def _write_tasks(folder: Path) -> None:
    rng = random.Random(0)
    folder.mkdir()
    choice = [
        {
            "question": " ".join(rng.choices(WORDS, k=5)),
            "choices": [" " + " ".join(rng.choices(WORDS, k=2)) for _ in range(3)],
            "answer": rng.randrange(3),
        }
        for _ in range(12)
    ]
    text = [{"text": " ".join(rng.choices(WORDS, k=rng.randrange(20, 90)))} for _ in range(5)]
    prompts = [{"question": " ".join(rng.choices(WORDS, k=4)), "answer": "x"} for _ in range(4)]
    for name, rows in (("choice", choice), ("text", text), ("prompts", prompts)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    common = "dataset_path: json\ntest_split: test\n"
    (folder / "nxd_choice.yaml").write_text(
        f"task: nxd_choice\n{common}dataset_kwargs:\n  data_files:\n    test: {folder / 'choice.jsonl'}\n"
        "output_type: multiple_choice\ndoc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{answer}}'\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n"
    )
    (folder / "nxd_text.yaml").write_text(
        f"task: nxd_text\n{common}dataset_kwargs:\n  data_files:\n    test: {folder / 'text.jsonl'}\n"
        "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n"
    )
    (folder / "nxd_until.yaml").write_text(
        f"task: nxd_until\n{common}dataset_kwargs:\n  data_files:\n    test: {folder / 'prompts.jsonl'}\n"
        "output_type: generate_until\ndoc_to_text: '{{question}}'\ndoc_to_target: '{{answer}}'\n"
        "generation_kwargs:\n  until: ['\\n\\n']\n  max_gen_toks: 12\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n"
    )


def _hflm_results(export: Path, tasks: Path, eod: str) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    model = AutoModelForCausalLM.from_pretrained(export).eval()
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(export / "tokenizer.json"), eos_token=eod)
    reference = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=4, max_length=64)
    return simple_evaluate(
        model=reference,
        tasks=["nxd_choice", "nxd_text", "nxd_until"],
        task_manager=TaskManager(include_path=str(tasks)),
        log_samples=True,
    )


def test_lm_eval_numbers_equal_hflm_on_the_export(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    log_dir, tasks = tmp_path / "run", tmp_path / "tasks"
    _train(log_dir)
    _write_tasks(tasks)
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [
                "eval",
                str(default_config_path()),
                *VARIED,
                f"+exp_manager.explicit_log_dir={log_dir}",
                "--tasks",
                "nxd_choice,nxd_text,nxd_until",
                "--include-path",
                str(tasks),
                "+eval.results_prefix=tiny",
                "--log-samples",
            ]
        )
        == 0
    )
    out = capsys.readouterr()
    assert "nxd_choice" in out.out and "|acc" in out.out.replace(" ", "")  # lm-eval's table
    [written] = tmp_path.glob("tiny_eval_results_*.json")
    ours_all = json.loads(written.read_text())
    ours = ours_all["results"]
    assert main(["ckpt", "export-hf", str(log_dir), str(tmp_path / "hf")]) == 0
    from transformers import PreTrainedTokenizerFast

    eod = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "hf" / "tokenizer.json")).convert_ids_to_tokens(0)
    theirs_all = _hflm_results(tmp_path / "hf", tasks, eod)
    theirs = theirs_all["results"]
    print({task: {k: v for k, v in values.items() if "stderr" not in k} for task, values in ours.items()})
    assert 1 < ours["nxd_text"]["word_perplexity,none"] < float("inf")
    assert ours["nxd_choice"]["acc,none"] == theirs["nxd_choice"]["acc,none"]
    assert ours["nxd_choice"]["acc_norm,none"] == theirs["nxd_choice"]["acc_norm,none"]
    for metric in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"):
        assert ours["nxd_text"][metric] == pytest.approx(theirs["nxd_text"][metric], rel=1e-4), metric
    assert ours["nxd_until"]["exact_match,none"] == theirs["nxd_until"]["exact_match,none"]
    generated = [sample["filtered_resps"] for sample in ours_all["samples"]["nxd_until"]]
    assert generated == [sample["filtered_resps"] for sample in theirs_all["samples"]["nxd_until"]]
    assert len({text for [text] in generated}) > 1 and all(text for [text] in generated)  # varied, not empty


def test_bad_eval_input_gets_one_line(tmp_path, capsys):
    config = str(default_config_path())
    assert main(["eval", config, "--tasks", "hellaswagg"]) == 1
    err = capsys.readouterr().err
    assert "'hellaswagg' (did you mean 'hellaswag'?) is not an lm-eval task" in err and "Traceback" not in err
    assert main(["eval", config]) == 1
    assert "eval.tasks: expected at least one lm-eval task" in capsys.readouterr().err
    assert main(["eval", config, "--tasks", "arc_easy", "--num-fewshot", "-1"]) == 1
    assert "--num-fewshot: input should be greater than or equal to 0, found -1" in capsys.readouterr().err
    assert main(["eval", config, "--tasks", "arc_easy", "+eval.results_prefix=/no/such/folder/x"]) == 1
    assert "eval.results_prefix: expected a prefix in an existing folder, found no folder /no/such/folder" in (
        capsys.readouterr().err
    )


def test_lm_eval_missing_names_the_extra(monkeypatch):
    import sys

    from nxd_config.schema.inference import EvalConfig
    from nxd_train.inference.evaluation import evaluation_problems

    monkeypatch.setitem(sys.modules, "lm_eval.tasks", None)  # as where the extra is not installed
    assert evaluation_problems(EvalConfig(tasks=("arc_easy",))) == [
        "nxd-train eval runs EleutherAI's lm-evaluation-harness, which is not installed: pip install "
        "'nxd-train[eval]' (uv sync --extra eval in a checkout)"
    ]


@pytest.mark.slow
def test_two_tensor_parallel_processes_score_what_one_does(tmp_path, monkeypatch):
    from tests.training_runs import FAST, run_command

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    tasks, layout = tmp_path / "tasks", ["distributed_strategy.tensor_model_parallel_size=2", "trainer.devices=2"]
    _write_tasks(tasks)
    log_dir = tmp_path / "run"
    trained = run_command(
        str(default_config_path()),
        *FAST,
        *VARIED,
        *layout,
        "trainer.max_steps=1",
        "data.global_batch_size=4",
        "exp_manager.create_checkpoint_callback=True",
        f"+exp_manager.explicit_log_dir={log_dir}",
        cwd=tmp_path,
    )
    assert trained.returncode == 0, trained.stderr
    results = {}
    for name, extra in (("two", layout), ("one", [])):
        done = run_command(
            "eval",
            str(default_config_path()),
            *VARIED,
            *extra,
            f"+exp_manager.explicit_log_dir={log_dir}",
            "--tasks",
            "nxd_choice,nxd_text",
            "--include-path",
            str(tasks),
            f"+eval.results_prefix={name}",
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        [written] = tmp_path.glob(f"{name}_eval_results_*.json")
        results[name] = json.loads(written.read_text())["results"]
    assert results["two"]["nxd_choice"]["acc,none"] == results["one"]["nxd_choice"]["acc,none"]
    assert results["two"]["nxd_text"]["word_perplexity,none"] == pytest.approx(
        results["one"]["nxd_text"]["word_perplexity,none"], rel=1e-4
    )


def test_a_task_file_with_a_syntax_error_is_named_with_its_line(tmp_path):
    from nxd_config.schema.inference import EvalConfig
    from nxd_train.inference.evaluation import evaluation_problems

    _write_tasks(tmp_path / "tasks")
    broken = tmp_path / "tasks" / "mine.yaml"
    broken.write_text("task: mine\ndataset_path: json\n  doc_to_text: [unclosed\n")
    problems = evaluation_problems(EvalConfig(tasks=("mine",), include_path=str(tmp_path / "tasks")))
    assert problems == [
        f"eval.include_path: {broken}:3:14: expected valid YAML, found mapping values are not "
        "allowed here; lm-eval would pass over this task file without a word"
    ]
