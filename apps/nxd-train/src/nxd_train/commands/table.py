"""The command table of `nxd-train`: one `Command` per subcommand (its arguments, its handler, whether it reads a
config, how it treats Ctrl-C), and the parser built from it.

Importing this module loads argparse alone: the entry point reads `keeps_ctrl_c` before torch or any nxd package is
imported, and each handler's module is imported only when its command runs.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path

from nxd_train.commands.export_dtypes import EXPORT_DTYPES

OVERRIDE_HELP = (
    "a.b=VALUE changes a key, +a.b=VALUE adds one, ~a.b deletes one (VALUE is YAML); --a.b VALUE is a.b=VALUE"
)
ITEMS_HELP = "config files (one NxDT or QEfficient file, or GPT-NeoX files), then overrides: " + OVERRIDE_HELP
DIALECT_HELP = "the files' dialect (default: recognised from the files)"
DEVICE_MEMORY_HELP = (
    "memory of one rank in GiB (default: the local accelerator's, or the host's shared by the local ranks)"
)


@dataclass(frozen=True)
class Command:
    """One subcommand of `nxd-train`."""

    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    """Adds the command's own arguments (and its actions, for a command that has several)."""
    handler: str
    """"module:function" taking the parsed arguments and returning the exit code."""
    description: str | None = None
    reads_config: bool = True
    """It takes config files and overrides (`--KEY VALUE` is an override; a mistyped option is refused)."""
    keeps_ctrl_c: bool = False
    """Python's own Ctrl-C (the command cleans up after itself: temporary files, staging folders); otherwise
    Ctrl-C or SIGTERM outside training's steps ends the process at once with one line."""
    options_first: bool = False
    """Its options may follow its files and overrides (argparse reads none after a positional item)."""


def _gib(text: str) -> float:
    """--device-memory's value: a positive, finite number of GiB."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of GiB, found {text!r}")
    return value


def add_config_items(parser: argparse.ArgumentParser, *, optional: bool = False) -> None:
    """The config files and overrides a command reads, and --dialect."""
    note = " (no file: the embedded tiny config)" if optional else ""
    parser.add_argument("items", nargs="*" if optional else "+", metavar="FILE|OVERRIDE", help=ITEMS_HELP + note)
    add_dialect(parser)


def add_dialect(parser: argparse.ArgumentParser) -> None:
    from nxd_config import DIALECTS  # loaded when the parser is built, not when the table is read

    parser.add_argument("--dialect", choices=DIALECTS, default=None, help=DIALECT_HELP)


def add_device_memory(parser: argparse.ArgumentParser, text: str = DEVICE_MEMORY_HELP) -> None:
    parser.add_argument("--device-memory", type=_gib, metavar="GIB", default=None, help=text)


def add_output(parser: argparse.ArgumentParser, text: str, default: Path | None = None) -> None:
    parser.add_argument("--output", "-o", type=Path, default=default, help=text)


def _actions(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return parser.add_subparsers(dest="action", metavar="ACTION", required=True)


def _train(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        "-c",
        type=Path,
        action="append",
        default=None,
        help="config file, repeatable for GPT-NeoX files (default: the embedded tiny config)",
    )
    add_dialect(parser)
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="FILE|OVERRIDE",
        help="config files (one NxDT or QEfficient file, or GPT-NeoX files; default: the embedded tiny "
        "config, `nxd-train config copy tiny DEST` writes it out), then overrides: " + OVERRIDE_HELP,
    )


def _config(parser: argparse.ArgumentParser) -> None:
    actions = _actions(parser)
    for name, text in (
        ("show", "print the resolved config (defaults filled in) as YAML"),
        (
            "check",
            "validate a config and run training's preflight (data, model, layout) without "
            "launching: exit 0 if a run would start on this machine, 1 listing every problem",
        ),
        (
            "translate",
            "print the same run as an NxDT-dialect file: the keys it sets, nxd extensions "
            "marked (a GPT-NeoX run migrates to NxDT's dialect)",
        ),
    ):
        action = actions.add_parser(name, help=text, description=text)
        add_config_items(action, optional=True)
        if name == "translate":
            action.add_argument("--to", choices=("nxdt",), default="nxdt", help="the dialect to write (nxdt)")
    text = "list the example configs shipped with nxd-train (NxDT recipes, GPT-NeoX and QEfficient files)"
    actions.add_parser("list", help=text, description=text)
    text = "copy an example config to a new file (or into a folder), never over a file that exists"
    copy = actions.add_parser("copy", help=text, description=text)
    copy.add_argument(
        "name", metavar="NAME", help="an example's name as `config list` prints it (tiny, neox/pythia_tiny)"
    )
    copy.add_argument("destination", type=Path, metavar="DEST", help="a new file, or a folder to copy it into")
    text = "list the config's keys (NxDT's dialect and nxd's extensions) with type, default and what each does"
    keys = actions.add_parser("keys", help=text, description=text)
    keys.add_argument(
        "prefix",
        nargs="?",
        default="",
        metavar="PREFIX",
        help="only this section or key and those under it (model.optim)",
    )


def _plan(parser: argparse.ArgumentParser) -> None:
    add_config_items(parser)
    add_device_memory(parser)


def _tune(parser: argparse.ArgumentParser) -> None:
    add_config_items(parser)
    add_device_memory(parser)
    add_output(parser, "the tuned config's file (default: <name>-tuned.yaml; never over a file that exists)")


def _launch(parser: argparse.ArgumentParser) -> None:
    add_config_items(parser)
    add_output(parser, "the script to write (default: JOB_NAME.sbatch, or JOB_NAME-hosts.sh; never replaced)")
    parser.add_argument("--submit", action="store_true", help="submit the sbatch script (sbatch) once written")
    add_device_memory(parser, "memory of one rank on the cluster's nodes in GiB, for the plan (default: this host's)")


def _eval(parser: argparse.ArgumentParser) -> None:
    add_config_items(parser)
    parser.add_argument("--tasks", default=None, help="comma-separated lm-eval task names (default: eval.tasks)")
    parser.add_argument("--limit", type=float, default=None, help="documents per task (a fraction below 1)")
    parser.add_argument("--num-fewshot", type=int, default=None, help="examples in each prompt")
    parser.add_argument(
        "--include-path",
        default=None,
        help="a folder of one's own task YAML files; it is code: lm-eval runs the Python its "
        "`!function` tags name (utils.py beside them), so run only a folder you trust",
    )
    parser.add_argument(
        "--log-samples",
        action="store_true",
        help="each document's prompt, responses and scores in the results file too",
    )


def _data(parser: argparse.ArgumentParser) -> None:
    text = "tokenise jsonl files (plain, .gz or .zst) into Megatron .bin/.idx files, one pair per json key"
    preprocess = _actions(parser).add_parser("preprocess", help=text, description=text)
    preprocess.add_argument("--input", nargs="+", type=Path, required=True, metavar="FILE", help="jsonl input files")
    preprocess.add_argument("--output-prefix", required=True, help="writes PREFIX_{key}_document.bin/.idx")
    preprocess.add_argument(
        "--tokenizer", help="a tokenizer.json file, or a directory holding one or a SentencePiece tokenizer.model"
    )
    preprocess.add_argument(
        "--tokenizer-type",
        choices=("GPT2BPETokenizer", "CharLevelTokenizer", "TiktokenTokenizer"),
        help="Megatron's tokenizer class (not --tokenizer): GPT2BPETokenizer from --vocab-file "
        "and --merge-file, CharLevelTokenizer, TiktokenTokenizer from --vocab-file",
    )
    preprocess.add_argument(
        "--vocab-file", help="GPT-2 vocab.json, or a tiktoken encoding name (with --tokenizer-type)"
    )
    preprocess.add_argument("--merge-file", help="GPT-2 merges.txt (with --tokenizer-type)")
    preprocess.add_argument("--json-keys", nargs="+", default=["text"], metavar="KEY", help="keys to tokenise")
    preprocess.add_argument("--append-eod", action="store_true", help="end each document with the EOD token")
    preprocess.add_argument("--workers", type=int, default=1, help="tokenising processes (default 1)")
    preprocess.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="skip lines that are not JSON objects with the keys (default: stop at the first)",
    )
    preprocess.add_argument("--no-progress", action="store_true", help="no progress bar")
    preprocess.add_argument(
        "--overwrite", action="store_true", help="replace files already under the output prefix (default: refuse)"
    )


def _ckpt(parser: argparse.ArgumentParser) -> None:
    actions = _actions(parser)
    text = "list the checkpoints of a log directory with step, consumed samples, size and completeness"
    listing = actions.add_parser("list", help=text, description=text)
    listing.add_argument(
        "log_dir",
        type=Path,
        metavar="LOGDIR",
        help="a run's log directory, its checkpoints folder, or an experiment folder of versions",
    )
    text = (
        "check every file of a checkpoint (or of each checkpoint of a log directory) against the digest and size "
        "its completion marker recorded; exit 1 if any is damaged"
    )
    verify = actions.add_parser("verify", help=text, description=text)
    verify.add_argument("path", type=Path, metavar="PATH", help="a checkpoint directory or a log directory")
    text = "write a checkpoint as Hugging Face safetensors and config.json (AutoModelForCausalLM loads it)"
    export = actions.add_parser("export-hf", help=text, description=text)
    export.add_argument(
        "checkpoint",
        type=Path,
        metavar="CKPT",
        help="a checkpoint directory, or a log directory (its newest complete checkpoint)",
    )
    export.add_argument("out", type=Path, metavar="OUT", help="a new or empty directory")
    export.add_argument(
        "--dtype",
        choices=sorted(EXPORT_DTYPES),
        default=None,
        help="store floating-point weights in this dtype (default: as trained)",
    )
    export.add_argument(
        "--merged",
        action="store_true",
        help="a LoRA checkpoint saved with its base (save_lora_base or merge_lora): the model with "
        "the adapter merged in, instead of the peft adapter folder",
    )


def _plot(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="a run's log directory (its metrics.csv)")
    add_output(parser, "the PNG to write (default: plot.png; never over a file that exists)", Path("plot.png"))


COMMANDS = (
    Command(
        "train",
        "run the job a config describes (the default command)",
        _train,
        "nxd_train.commands.train:run",
    ),
    Command(
        "config",
        "inspect a config without running it",
        _config,
        "nxd_train.commands.config:run",
        keeps_ctrl_c=True,
    ),
    Command(
        "plan",
        "each rank's memory before launch",
        _plan,
        "nxd_train.commands.plan:run",
        "count each rank's memory (parameters, gradients, master weights, optimizer state, activations, "
        "loss, step) for the config's layout before launch, against the memory a rank has; exit 1, naming "
        "the keys that would make it fit, when it does not fit",
        keeps_ctrl_c=True,
    ),
    Command(
        "tune",
        "find the fastest micro-batch size and ZeRO stage",
        _tune,
        "nxd_train.commands.tune:run",
        "search micro-batch size x ZeRO stage (the config's tune keys; GPT-NeoX's autotuning block): the memory "
        "plan leaves out what does not fit, each other candidate trains tune.end_step steps, and the fastest by "
        "tokens/s is written as a new config file",
    ),
    Command(
        "launch",
        "write (and submit) the job a cluster runs",
        _launch,
        "nxd_train.commands.launch:run",
        "write the job a cluster runs from the same config files: an sbatch script (trainer.num_nodes nodes, "
        "trainer.devices tasks each, trainer.cluster's partition, account, time, requeue and warning signal) or, "
        "for a hostfile (trainer.cluster.scheduler: hosts), each host's torchrun command; config check and plan "
        "run first for the job's layout",
        keeps_ctrl_c=True,
    ),
    Command(
        "generate",
        "sample a trained run",
        add_config_items,
        "nxd_train.commands.inference:run_generate",
        "sample the run's newest complete checkpoint (or exp_manager.resume_from_checkpoint's weights) at its "
        "tensor-parallel layout, as GPT-NeoX's generate.py: generate.text_gen_type unconditional, input-file or "
        "interactive; completions as JSON lines in generate.sample_output_file",
        options_first=True,
    ),
    Command(
        "eval",
        "benchmark a trained run (lm-evaluation-harness)",
        _eval,
        "nxd_train.commands.inference:run_eval",
        "benchmark the run's newest complete checkpoint with EleutherAI's lm-evaluation-harness (the "
        "nxd-train[eval] extra), as GPT-NeoX's eval.py: results printed as lm-eval's table and written to "
        "{eval.results_prefix}_eval_results_{mm-dd-YYYY-HH-MM-SS}.json",
        options_first=True,
    ),
    Command(
        "data",
        "prepare training data",
        _data,
        "nxd_train.commands.data:run",
        reads_config=False,
        keeps_ctrl_c=True,
    ),
    Command(
        "ckpt",
        "inspect and convert checkpoints",
        _ckpt,
        "nxd_train.commands.ckpt:run",
        reads_config=False,
        keeps_ctrl_c=True,
    ),
    Command(
        "plot",
        "a picture of runs' metrics",
        _plot,
        "nxd_train.commands.plot:run",
        "draw loss and validation loss, learning rate, tokens/s and any reward or accuracy columns against the "
        "step from runs' metrics.csv, several runs overlaid (the nxd-train[plot] extra: matplotlib)",
        reads_config=False,
        keeps_ctrl_c=True,
    ),
)
BY_NAME = {command.name: command for command in COMMANDS}


class _Parser(argparse.ArgumentParser):
    """argparse with a did-you-mean for a mistyped subcommand or choice."""

    def _check_value(self, action: argparse.Action, value: object) -> None:
        if action.choices is not None and value not in action.choices:
            close = difflib.get_close_matches(str(value), [str(choice) for choice in action.choices], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            choices = ", ".join(str(choice) for choice in action.choices)
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}{hint}; expected one of {choices}")
        super()._check_value(action, value)


class _Versions(argparse.Action):
    """`--version`: every nxd package's installed version (read when asked, not each time the parser is built)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help=kwargs.get("help"))  # type: ignore[arg-type]

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from nxd_train.commands.config import versions

        print(versions())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command in the table."""
    parser = _Parser(
        prog="nxd-train",
        description="Train large language models from one NxDT-dialect YAML file (or GPT-NeoX config files, or a "
        "QEfficient fine-tuning file).",
        epilog="Without a subcommand, nxd-train runs 'train'. Overrides: " + OVERRIDE_HELP,
    )
    parser.add_argument("--version", "-V", action=_Versions, help="print the version of every nxd package")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        kwargs = {} if command.description is None else {"description": command.description}
        command.arguments(subparsers.add_parser(command.name, help=command.help, **kwargs))
    return parser


def run_command(args: argparse.Namespace) -> int:
    """Run the parsed command's handler."""
    module, _, function = BY_NAME[args.command].handler.partition(":")
    return getattr(import_module(module), function)(args)
