"""The `nxd-train` command line.

    nxd-train [train] [FILE ...] [OVERRIDE ...]        run the job (the embedded tiny config by default)
    nxd-train config show FILE ... [OVERRIDE ...]      print the resolved config as YAML
    nxd-train config check FILE ... [OVERRIDE ...]     exit 0 if a run would start here, 1 with every problem
    nxd-train config translate FILE ... [--to nxdt]    print the run as an NxDT-dialect file
    nxd-train config list                              the example configs shipped with nxd-train
    nxd-train config copy NAME DEST                    copy one of them to a new file (or into a folder)
    nxd-train config keys [PREFIX]                     every key: type, default and what it does
    nxd-train plan FILE ... [OVERRIDE ...]             each rank's memory before launch
    nxd-train launch FILE ... [OVERRIDE ...] [--submit]  the job a cluster runs: an sbatch script, or each
                                                      host's torchrun command (trainer.cluster)
    nxd-train data preprocess --input F --output-prefix P --tokenizer T ...
                                                      jsonl -> Megatron .bin/.idx
    nxd-train generate FILE ... [OVERRIDE ...]         samples of the run's newest checkpoint (the generate keys)
    nxd-train eval FILE ... [--tasks T1,T2] [OVERRIDE ...]
                                                      lm-evaluation-harness benchmarks of the run (nxd-train[eval])
    nxd-train ckpt list LOGDIR                         checkpoints with step, size and completeness
    nxd-train ckpt verify PATH                         every file's digest against the completion marker
    nxd-train ckpt export-hf CKPT OUT [--dtype D] [--merged]
                                                      a checkpoint -> Hugging Face safetensors + config.json
                                                      (a LoRA one -> a peft adapter folder, or merged)
    nxd-train plot RUN_DIR [RUN_DIR ...] [-o FILE.png] loss, learning rate, tokens/s (and rewards) against step

FILE is one NxDT config, or one or more GPT-NeoX configs (merged as NeoX's launcher merges them); the
dialect is recognised from the files, or forced with --dialect nxdt|neox|qeff. OVERRIDEs use the files' keys,
also written --KEY VALUE. `nxd-train --version` prints the version of every nxd package.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import os
import sys
import warnings
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from nxd_config import DIALECTS, ConfigNotice, NxdConfig, to_nxdt_yaml

from .command_support import exit_if_distributed, load, notices_to_stderr, preflight_stopped
from .export_dtypes import EXPORT_DTYPES

if TYPE_CHECKING:
    from .plan import RunPlan

DEVICE_MEMORY_HELP = (
    "memory of one rank in GiB (default: the local accelerator's, or the host's shared by the local ranks)"
)
SUBCOMMANDS = ("train", "config", "plan", "tune", "launch", "generate", "eval", "data", "ckpt", "plot")
TOP_LEVEL_OPTIONS = ("-h", "--help", "--version", "-V")
OVERRIDE_HELP = (
    "a.b=VALUE changes a key, +a.b=VALUE adds one, ~a.b deletes one (VALUE is YAML); --a.b VALUE is a.b=VALUE"
)
ITEMS_HELP = "config files (one NxDT or QEfficient file, or GPT-NeoX files), then overrides: " + OVERRIDE_HELP
DIALECT_HELP = "the files' dialect (default: recognised from the files)"


def default_config_path() -> Path:
    """The embedded default config (the same file as configs/tiny.yaml)."""
    return Path(str(resources.files("nxd_train") / "configs" / "tiny.yaml"))


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
        from .config_commands import versions

        print(versions())
        parser.exit()


def _gib(text: str) -> float:
    """--device-memory's value: a positive, finite number of GiB."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of GiB, found {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="nxd-train",
        description="Train large language models from one NxDT-dialect YAML file (or GPT-NeoX config files, or a "
        "QEfficient fine-tuning file).",
        epilog="Without a subcommand, nxd-train runs 'train'. Overrides: " + OVERRIDE_HELP,
    )
    parser.add_argument("--version", "-V", action=_Versions, help="print the version of every nxd package")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    train = commands.add_parser("train", help="run the job a config describes (the default command)")
    train.add_argument(
        "--config",
        "-c",
        type=Path,
        action="append",
        default=None,
        help="config file, repeatable for GPT-NeoX files (default: the embedded tiny config)",
    )
    train.add_argument("--dialect", choices=DIALECTS, default=None, help=DIALECT_HELP)
    train.add_argument(
        "overrides",
        nargs="*",
        metavar="FILE|OVERRIDE",
        help="config files (one NxDT or QEfficient file, or GPT-NeoX files; default: the embedded tiny "
        "config, `nxd-train config copy tiny DEST` writes it out), then overrides: " + OVERRIDE_HELP,
    )

    config = commands.add_parser("config", help="inspect a config without running it")
    actions = config.add_subparsers(dest="action", metavar="ACTION", required=True)
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
        action.add_argument(
            "items", nargs="*", metavar="FILE|OVERRIDE", help=ITEMS_HELP + " (no file: the embedded tiny config)"
        )
        action.add_argument("--dialect", choices=DIALECTS, default=None, help=DIALECT_HELP)
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

    text = (
        "count each rank's memory (parameters, gradients, master weights, optimizer state, activations, "
        "loss, step) for the config's layout before launch, against the memory a rank has; exit 1, naming "
        "the keys that would make it fit, when it does not fit"
    )
    plan = commands.add_parser("plan", help="each rank's memory before launch", description=text)
    plan.add_argument("items", nargs="+", metavar="FILE|OVERRIDE", help=ITEMS_HELP)
    plan.add_argument("--dialect", choices=DIALECTS, default=None, help=DIALECT_HELP)
    plan.add_argument("--device-memory", type=_gib, metavar="GIB", default=None, help=DEVICE_MEMORY_HELP)

    text = (
        "search micro-batch size x ZeRO stage (the config's tune keys; GPT-NeoX's autotuning block): the memory "
        "plan leaves out what does not fit, each other candidate trains tune.end_step steps, and the fastest by "
        "tokens/s is written as a new config file"
    )
    tune = commands.add_parser("tune", help="find the fastest micro-batch size and ZeRO stage", description=text)
    tune.add_argument("items", nargs="+", metavar="FILE|OVERRIDE", help=ITEMS_HELP)
    tune.add_argument("--dialect", choices=DIALECTS, default=None, help=DIALECT_HELP)
    tune.add_argument("--device-memory", type=_gib, metavar="GIB", default=None, help=DEVICE_MEMORY_HELP)
    tune.add_argument(
        "--output",
        "-o",
        type=Path,
        default=None,
        help="the tuned config's file (default: <name>-tuned.yaml; never over a file that exists)",
    )

    text = (
        "write the job a cluster runs from the same config files: an sbatch script (trainer.num_nodes nodes, "
        "trainer.devices tasks each, trainer.cluster's partition, account, time, requeue and warning signal) or, "
        "for a hostfile (trainer.cluster.scheduler: hosts), each host's torchrun command; config check and plan "
        "run first for the job's layout"
    )
    launch = commands.add_parser("launch", help="write (and submit) the job a cluster runs", description=text)
    launch.add_argument("items", nargs="+", metavar="FILE|OVERRIDE", help=ITEMS_HELP)
    launch.add_argument("--dialect", choices=DIALECTS, default=None, help=DIALECT_HELP)
    launch.add_argument(
        "--output",
        "-o",
        type=Path,
        default=None,
        help="the script to write (default: JOB_NAME.sbatch, or JOB_NAME-hosts.sh; never replaced)",
    )
    launch.add_argument("--submit", action="store_true", help="submit the sbatch script (sbatch) once written")
    launch.add_argument(
        "--device-memory",
        type=_gib,
        metavar="GIB",
        default=None,
        help="memory of one rank on the cluster's nodes in GiB, for the plan (default: this host's)",
    )

    text = (
        "sample the run's newest complete checkpoint (or exp_manager.resume_from_checkpoint's weights) at its "
        "tensor-parallel layout, as GPT-NeoX's generate.py: generate.text_gen_type unconditional, input-file or "
        "interactive; completions as JSON lines in generate.sample_output_file"
    )
    generation = commands.add_parser("generate", help="sample a trained run", description=text)
    generation.add_argument("items", nargs="+", metavar="FILE|OVERRIDE", help=ITEMS_HELP)
    generation.add_argument("--dialect", choices=DIALECTS, default=None, help=DIALECT_HELP)
    text = (
        "benchmark the run's newest complete checkpoint with EleutherAI's lm-evaluation-harness (the "
        "nxd-train[eval] extra), as GPT-NeoX's eval.py: results printed as lm-eval's table and written to "
        "{eval.results_prefix}_eval_results_{mm-dd-YYYY-HH-MM-SS}.json"
    )
    evaluation = commands.add_parser("eval", help="benchmark a trained run (lm-evaluation-harness)", description=text)
    evaluation.add_argument("items", nargs="+", metavar="FILE|OVERRIDE", help=ITEMS_HELP)
    evaluation.add_argument("--dialect", choices=DIALECTS, default=None, help=DIALECT_HELP)
    evaluation.add_argument("--tasks", default=None, help="comma-separated lm-eval task names (default: eval.tasks)")
    evaluation.add_argument("--limit", type=float, default=None, help="documents per task (a fraction below 1)")
    evaluation.add_argument("--num-fewshot", type=int, default=None, help="examples in each prompt")
    evaluation.add_argument(
        "--include-path",
        default=None,
        help="a folder of one's own task YAML files; it is code: lm-eval runs the Python its "
        "`!function` tags name (utils.py beside them), so run only a folder you trust",
    )
    evaluation.add_argument(
        "--log-samples",
        action="store_true",
        help="each document's prompt, responses and scores in the results file too",
    )

    data = commands.add_parser("data", help="prepare training data")
    data_actions = data.add_subparsers(dest="action", metavar="ACTION", required=True)
    text = "tokenise jsonl files (plain, .gz or .zst) into Megatron .bin/.idx files, one pair per json key"
    preprocess = data_actions.add_parser("preprocess", help=text, description=text)
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

    ckpt = commands.add_parser("ckpt", help="inspect and convert checkpoints")
    ckpt_actions = ckpt.add_subparsers(dest="action", metavar="ACTION", required=True)
    text = "list the checkpoints of a log directory with step, consumed samples, size and completeness"
    listing = ckpt_actions.add_parser("list", help=text, description=text)
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
    verify = ckpt_actions.add_parser("verify", help=text, description=text)
    verify.add_argument("path", type=Path, metavar="PATH", help="a checkpoint directory or a log directory")
    text = "write a checkpoint as Hugging Face safetensors and config.json (AutoModelForCausalLM loads it)"
    export = ckpt_actions.add_parser("export-hf", help=text, description=text)
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

    text = (
        "draw loss and validation loss, learning rate, tokens/s and any reward or accuracy columns against the "
        "step from runs' metrics.csv, several runs overlaid (the nxd-train[plot] extra: matplotlib)"
    )
    plot = commands.add_parser("plot", help="a picture of runs' metrics", description=text)
    plot.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="a run's log directory (its metrics.csv)")
    plot.add_argument(
        "--output",
        "-o",
        type=Path,
        default=Path("plot.png"),
        help="the PNG to write (default: plot.png; never over a file that exists)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and (problem := unknown_command(args_list[0])):
        print(f"nxd-train: {problem}", file=sys.stderr)
        return 2
    if not args_list or (args_list[0] not in SUBCOMMANDS and args_list[0] not in TOP_LEVEL_OPTIONS):
        args_list.insert(0, "train")
    if args_list[0] == "train":  # `nxd-train A.yml B.yml ...` reads like `--config A.yml --config B.yml ...`
        index = 1
        while index < len(args_list) and _is_config_file(args_list[index]):
            args_list[index : index + 1] = ["--config", args_list[index]]
            index += 2
    if args_list[0] in ("train", "config", "plan", "tune", "launch", "generate", "eval"):
        if problem := mistyped_option(args_list):
            print(f"nxd-train {args_list[0]}: {problem}", file=sys.stderr)
            return 2
        args_list = flag_overrides(args_list)
    if args_list[0] in ("generate", "eval"):
        args_list = _options_first(args_list)
    parser = build_parser()
    args = parser.parse_args(args_list)
    if args.command == "config" and args.action in ("list", "copy", "keys"):
        from .config_commands import copy_command, keys_command, list_command

        if args.action == "list":
            return list_command()
        if args.action == "copy":
            return copy_command(args.name, args.destination)
        return keys_command(args.prefix)
    if args.command in ("config", "plan", "tune", "launch", "generate", "eval"):
        files, overrides = split_items(args.items)
        if not files and args.command == "config":
            files = [default_config_path()]
        if not files:
            parser.error(f"{args.command}: expected a config file before the overrides, found {args.items[0]!r}")
        if args.command in ("generate", "eval"):
            from .inference_commands import eval_command, generate_command

            if args.command == "generate":
                return generate_command(files, overrides, args.dialect)
            return eval_command(files, overrides, args.dialect, args)
        if args.command == "launch":
            return _launch_command(files, overrides, args)
        if args.command == "plan":
            return _plan_command(files, overrides, args.device_memory, args.dialect)
        if args.command == "tune":
            from .tuning import tune_command

            return tune_command(files, overrides, args.dialect, args.device_memory, args.output)
        return _config_command(args.action, files, overrides, args.dialect, getattr(args, "to", "nxdt"))
    if args.command == "data":
        return _preprocess_command(args)
    if args.command == "ckpt":
        from .ckpt_commands import export_command, list_command, verify_command

        if args.action == "list":
            return list_command(args.log_dir)
        if args.action == "verify":
            return verify_command(args.path)
        return export_command(args.checkpoint, args.out, args.dtype, args.merged)
    if args.command == "plot":
        from .plot import plot_command

        return plot_command(args.runs, args.output)
    return _train_command(args.config or [default_config_path()], args.overrides, args.dialect)


OPTIONS = (
    "--config",
    "-c",
    "--dialect",
    "--to",
    "--device-memory",
    "--output",
    "-o",
    "--submit",
    "--tasks",
    "--limit",
    "--num-fewshot",
    "--include-path",
    "--log-samples",
    "-h",
    "--help",
)

FLAGS = ("-h", "--help", "--submit", "--log-samples")
"""nxd's options that take no value."""


def flag_overrides(arguments: list[str]) -> list[str]:
    """`--KEY VALUE` and `--KEY=VALUE` (a command line in the Trainer's style, as QEfficient's) as the override
    `KEY=VALUE`; several values (`--target_modules q_proj v_proj`) make a list. nxd's own options stay."""
    out: list[str] = []
    index = 0
    while index < len(arguments):
        item = arguments[index]
        name = item.partition("=")[0]
        if name in OPTIONS:
            takes_value = "=" not in item and name not in FLAGS
            out += arguments[index : index + 1 + takes_value]
            index += 1 + takes_value
            continue
        if not item.startswith("--") or item == "--":
            out.append(item)
            index += 1
            continue
        if "=" in item:
            out.append(item[2:])
            index += 1
            continue
        values = []
        index += 1
        while index < len(arguments) and not arguments[index].startswith("--") and "=" not in arguments[index]:
            values.append(arguments[index])
            index += 1
        value = values[0] if len(values) == 1 else f"[{','.join(values)}]" if values else "true"
        out.append(f"{item[2:]}={value}")
    return out


def unknown_command(first: str) -> str | None:
    """Why the first argument is no command, config file or override ('trian'), with the closest command; None
    when it is one of them."""
    if first in SUBCOMMANDS or first.startswith(("-", "+", "~")) or "=" in first or _is_config_file(first):
        return None
    if Path(first).exists():
        return None  # a config file with another suffix: the loader says what it finds in it
    close = difflib.get_close_matches(first, SUBCOMMANDS, n=1, cutoff=0.6)
    if close:
        return f"unknown command {first!r} (did you mean {close[0]!r}?); expected one of {', '.join(SUBCOMMANDS)}"
    return (
        f"{first!r}: expected a command ({', '.join(SUBCOMMANDS)}), a config file (.yaml, .yml or .json) or an "
        f"override (KEY=VALUE), found none of them"
    )


def mistyped_option(arguments: list[str]) -> str | None:
    """A `--name` close to one of nxd's own options (--dialet, --num-fewshots): the option it meant. Names with '_'
    or '.' are config keys written `--KEY VALUE` and pass."""
    for item in arguments[1:]:
        name = item.partition("=")[0]
        if not name.startswith("--") or name in OPTIONS or "_" in name or "." in name:
            continue
        close = difflib.get_close_matches(name, [o for o in OPTIONS if o.startswith("--")], n=1, cutoff=0.85)
        if close:
            return f"unknown option {name} (did you mean {close[0]}?)"
    return None


def _options_first(arguments: list[str]) -> list[str]:
    """The subcommand's own options before its files and overrides, wherever they were written (argparse reads
    no positional item after an option)."""
    options, items, index = [], [], 1
    while index < len(arguments):
        item = arguments[index]
        if item in OPTIONS and item not in FLAGS and index + 1 < len(arguments):
            options += arguments[index : index + 2]
            index += 2
        else:
            (options if item.startswith("-") and item.partition("=")[0] in OPTIONS else items).append(item)
            index += 1
    return [arguments[0], *options, *items]


def _is_config_file(argument: str) -> bool:
    """A YAML or JSON file named where overrides go (an override always holds '=' or starts with '~')."""
    return "=" not in argument and not argument.startswith(("~", "-")) and argument.endswith((".yaml", ".yml", ".json"))


def split_items(items: Sequence[str]) -> tuple[list[Path], list[str]]:
    """Leading config files, then the overrides (an override holds '=' or starts with '~' or '+')."""
    files = []
    for item in items:
        if "=" in item or item.startswith(("~", "+")):
            break
        files.append(Path(item))
    return files, list(items[len(files) :])


def _names(paths: Sequence[Path]) -> str:
    return ", ".join(str(path) for path in paths)


def _config_command(
    action: str, paths: Sequence[Path], overrides: Sequence[str], dialect: str | None, to: str = "nxdt"
) -> int:
    config = load(paths, overrides, dialect)
    if config is None:
        return 1
    if action == "show":
        print(to_yaml(config), end="")
        return 0
    if action == "translate":
        print(f"# {_names(paths)} as an {to}-dialect nxd config\n" + to_nxdt_yaml(config), end="")
        return 0
    path = _names(paths)
    processes = f"{config.world_size} process{'es' if config.world_size != 1 else ''}"
    print(
        f"{path}: valid ({processes}: tp={config.distributed_strategy.tensor_model_parallel_size} "
        f"pp={config.distributed_strategy.pipeline_model_parallel_size} "
        f"cp={config.distributed_strategy.context_parallel_size} dp={config.data_parallel_size}, "
        f"gradient accumulation {config.gradient_accumulation_steps})"
    )
    from .corpus import default_cache_dir  # the same preflight as training, without launching
    from .preflight import PreflightError, plan_run

    try:
        with notices_to_stderr():
            plan_run(config, default_cache_dir(), here=False)
    except PreflightError as error:
        print(
            f"{path}: would stop a run on this machine:\n" + "\n".join(f"  {p}" for p in error.problems),
            file=sys.stderr,
        )
        return 1
    return 0


def _plan_command(
    paths: Sequence[Path], overrides: Sequence[str], device_memory: float | None, dialect: str | None
) -> int:
    config = load(paths, overrides, dialect)
    if config is None:
        return 1
    path = _names(paths)
    from .corpus import default_cache_dir
    from .memory_check import memory_report
    from .preflight import PreflightError, plan_run

    try:
        with notices_to_stderr():
            plan = plan_run(config, default_cache_dir(), data_required=False, here=False)
    except PreflightError as error:
        print(f"{path}: {error}", file=sys.stderr)
        return 1
    report, fits = memory_report(plan, device_memory)
    print(f"{path}: {report}")
    return 0 if fits else 1


def _launch_command(files: list[Path], overrides: list[str], args: argparse.Namespace) -> int:
    """Check the job for its layout, write its script (never over a file that exists), submit it if asked."""
    config = load(files, overrides, args.dialect)
    if config is None:
        return 1
    path = _names(files)
    from .cluster_launch import LaunchError, host_commands, sbatch_script, unread_keys
    from .corpus import default_cache_dir
    from .memory_check import memory_report
    from .preflight import PreflightError, plan_run

    try:
        with notices_to_stderr():
            plan = plan_run(config, default_cache_dir(), here=False)
            for notice in unread_keys(config):
                warnings.warn(notice, ConfigNotice, stacklevel=1)
        report, fits = memory_report(plan, args.device_memory)
        if not fits:
            print(f"{path}: {report}", file=sys.stderr)
            return 1
        hosts = config.trainer.cluster.scheduler == "hosts"
        script = (host_commands if hosts else sbatch_script)(config, files, overrides, args.dialect)
    except PreflightError as error:
        print(f"{path}: would stop the job:\n" + "\n".join(f"  {p}" for p in error.problems), file=sys.stderr)
        return 1
    except LaunchError as error:
        print(f"{path}: {error}", file=sys.stderr)
        return 1
    if hosts and args.submit:
        print(
            "nxd-train launch: --submit submits an sbatch script; run the hosts script it wrote instead",
            file=sys.stderr,
        )
        return 1
    name = config.trainer.cluster.job_name or config.name
    output = args.output or Path(f"{name}-hosts.sh" if hosts else f"{name}.sbatch")
    try:
        with open(output, "x") as handle:  # never over a file the user has
            handle.write(script)
    except FileExistsError:
        print(
            f"--output: {output} exists; expected a new file (nxd-train never replaces one): name another",
            file=sys.stderr,
        )
        return 1
    except OSError as error:
        print(f"--output: cannot write {output} ({error.strerror or error})", file=sys.stderr)
        return 1
    output.chmod(0o755)
    layout = f"{config.trainer.num_nodes} node(s) x {config.trainer.devices} process(es)"
    print(f"wrote {output}: {layout}; {report.splitlines()[0]}")
    if not args.submit:
        return 0
    import shutil
    import subprocess

    if shutil.which("sbatch") is None:
        print(
            "--submit: sbatch is not on this machine's PATH; submit the script from a Slurm login node", file=sys.stderr
        )
        return 1
    result = subprocess.run(["sbatch", "--parsable", str(output)], capture_output=True, text=True)
    if result.returncode:
        print(f"--submit: sbatch refused {output}: {result.stderr.strip()}", file=sys.stderr)
        return 1
    print(f"submitted job {result.stdout.strip().split(';')[0]}")
    return 0


def _save_base_shapes(config: NxdConfig, path: str, quiet: bool) -> int:
    """model.mup.save_base_shapes: write the base-shape file (the first process of each node) and exit 0 without
    training, as GPT-NeoX stops after saving."""
    from nxd_models import ModelConfigError

    from .preflight import write_base_shapes

    if quiet:
        return 0
    try:
        written = write_base_shapes(config)
    except (ModelConfigError, OSError) as error:
        print(f"{path}: {error}", file=sys.stderr)
        return 1
    print(f"nxd-train: muP base shapes written to {written} (model.mup.save_base_shapes); not training")
    return 0


def _coordinate_check(plan: RunPlan, widths: list[int] | None, path: str, quiet: bool) -> int:
    """model.mup.coord_check: mup's coordinate check in the working directory (the first process of each node), then
    exit 0 without training, as GPT-NeoX stops after plotting."""
    import torch
    from nxd_models import ModelConfigError

    from .coord_check import coordinate_check
    from .preflight import accelerator_name

    if quiet:
        return 0
    try:
        written = coordinate_check(plan, widths, Path.cwd(), torch.device(accelerator_name()))
    except (ModelConfigError, OSError) as error:
        print(f"{path}: {error}", file=sys.stderr)
        return 1
    print(
        f"nxd-train: muP coordinate check written to {', '.join(str(p) for p in written)} (model.mup.coord_check); "
        "not training"
    )
    return 0


def _train_command(paths: Sequence[Path], overrides: Sequence[str], dialect: str | None) -> int:
    from .launcher_check import readable_world

    world = readable_world(os.environ)
    quiet = world is not None and world.local_rank != 0  # the first process of each node speaks for it
    launch = (
        None
        if world is None
        else {"WORLD_SIZE": str(world.world_size), "LOCAL_WORLD_SIZE": str(world.local_world_size)}
    )
    config = load(paths, overrides, dialect, launch=launch, quiet=quiet)  # a QEfficient file reads the sizes
    if config is None:
        return 1
    path = _names(paths)
    from .cluster import RanksDidNotMeet
    from .corpus import default_cache_dir  # the training stack loads only when training
    from .memory_check import memory_notice
    from .preflight import PreflightError, plan_run

    if (mup := config.model.mup) is not None and mup.save_base_shapes:
        return _save_base_shapes(config, path, quiet)

    try:
        with notices_to_stderr(quiet):
            plan = plan_run(config, default_cache_dir())
            if not quiet and (notice := memory_notice(plan)):
                warnings.warn(notice, ConfigNotice, stacklevel=1)  # the launching process says it once
    except PreflightError as error:
        return preflight_stopped(path, error, quiet)
    if mup is not None and mup.coord_check:
        return _coordinate_check(plan, mup.coord_check_widths, path, quiet)
    from nxd_ckpt import CheckpointError
    from nxd_data import DataError
    from nxd_precision import NonFiniteStop
    from torch.distributed import DistError

    from .comet_logger import CometStartError
    from .interrupts import TrainingInterrupted
    from .logdir import LogDirError, disk_full
    from .loop import train
    from .peers import collective_failure
    from .run_state import UploadsFailed
    from .wandb_logger import WandbStartError

    try:
        train(plan)
    except LogDirError as error:  # every rank has it from rank 0
        return _stopped(f"{path}: {error}", 1)
    except (CheckpointError, WandbStartError, CometStartError) as error:  # found once loading or logging began
        print(f"{path}: {error}", file=sys.stderr)
        return 1
    except UploadsFailed as error:  # rank 0 alone, once the others have left
        print(f"{path}: training ended, but {error}", file=sys.stderr, flush=True)
        exit_if_distributed(1, group_wide=False)
        return 1
    except RanksDidNotMeet as error:  # each rank says what it saw: no process group exists to agree on one line
        print(f"{path}: {error}", file=sys.stderr, flush=True)
        return 1
    except DataError as error:  # met in a sample while training: only this rank knows, so it says so and leaves
        print(f"{path}: {_worker_message(error)}", file=sys.stderr, flush=True)
        exit_if_distributed(1, group_wide=False)
        return 1
    except (NonFiniteStop, TrainingInterrupted) as error:  # every rank stops after the same step
        return _stopped(f"{path}: {error}", getattr(error, "exit_code", 1))
    except (RuntimeError, DistError) as error:
        if not collective_failure(error):
            raise
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"{path}: a collective between the ranks failed ({first}); every rank stops", file=sys.stderr, flush=True)
        exit_if_distributed(1, group_wide=False)
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the first step
        print(f"{path}: interrupted before training began; nothing was saved", file=sys.stderr)
        return 130
    except OSError as error:  # a log or metrics file this rank writes
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        print(
            f"{path}: {disk_full(error, plan.log_dir or plan.logging.explicit_log_dir or Path.cwd())}",
            file=sys.stderr,
            flush=True,
        )
        exit_if_distributed(1, group_wide=False)
        return 1
    exit_if_distributed()
    return 0


def _stopped(message: str, code: int) -> int:
    """End a run every rank stopped early: the first rank says why and returns `code` (what the user or
    scheduler sees); the others leave quietly with 0, so a launcher watching them takes the stop for
    an orderly end rather than a crash to kill everything for."""
    import torch.distributed

    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        print(message, file=sys.stderr)
        return code
    first = torch.distributed.get_rank() == 0
    if first:
        print(message, file=sys.stderr, flush=True)
    torch.distributed.barrier()
    exit_if_distributed(0 if not first else code)
    return code


def _worker_message(error: Exception) -> str:
    """An error's own message, also when a data-loader worker raised it (torch re-raises it with the
    worker's traceback as text: its last line holds the message)."""
    text = str(error)
    if "Original Traceback" not in text:
        return text
    return text.strip().splitlines()[-1].partition(": ")[2]


def _preprocess_command(args: argparse.Namespace) -> int:
    from nxd_data import DataError, TokenizerSource, preprocess_jsonl

    if (args.tokenizer is None) == (args.tokenizer_type is None):
        print("nxd-train data preprocess: expected either --tokenizer or --tokenizer-type", file=sys.stderr)
        return 1
    tokenizer = args.tokenizer or TokenizerSource(args.tokenizer_type, "megatron", args.vocab_file, args.merge_file)
    try:
        summary = preprocess_jsonl(
            args.input,
            args.output_prefix,
            tokenizer,
            json_keys=args.json_keys,
            append_eod=args.append_eod,
            workers=args.workers,
            skip_bad_lines=args.skip_bad_lines,
            progress=not args.no_progress,
            overwrite=args.overwrite,
        )
    except DataError as error:
        print(f"nxd-train data preprocess: {error}", file=sys.stderr)
        return 1
    skipped = f"; skipped {summary.skipped_lines} bad lines" if summary.skipped_lines else ""
    print(
        f"wrote {', '.join(f'{prefix}.bin/.idx' for prefix in summary.outputs)}: {summary.documents:,} documents, "
        f"{summary.tokens:,} tokens in {summary.seconds:.1f} s ({summary.tokens_per_second:,.0f} tokens/s){skipped}"
    )
    return 0


def to_yaml(config: NxdConfig) -> str:
    """The resolved config as YAML, in the key order of the schema."""
    return yaml.safe_dump(config.model_dump(mode="json", by_alias=True), sort_keys=False)


if __name__ == "__main__":
    sys.exit(main())
