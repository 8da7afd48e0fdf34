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

import difflib
import sys
from collections.abc import Sequence
from pathlib import Path

from nxd_train.commands.support import default_config_path
from nxd_train.commands.table import BY_NAME, build_parser, run_command

__all__ = ["default_config_path", "flag_overrides", "main"]

TOP_LEVEL_OPTIONS = ("-h", "--help", "--version", "-V")


def main(argv: Sequence[str] | None = None) -> int:
    """The command as a function: `argv` as the shell gives it (sys.argv[1:] when None); returns the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and (problem := unknown_command(args_list[0])):
        print(f"nxd-train: {problem}", file=sys.stderr)
        return 2
    if not args_list or (args_list[0] not in BY_NAME and args_list[0] not in TOP_LEVEL_OPTIONS):
        args_list.insert(0, "train")
    if args_list[0] == "train":  # `nxd-train A.yml B.yml ...` reads like `--config A.yml --config B.yml ...`
        index = 1
        while index < len(args_list) and _is_config_file(args_list[index]):
            args_list[index : index + 1] = ["--config", args_list[index]]
            index += 2
    command = BY_NAME.get(args_list[0])
    if command is not None and command.reads_config:
        if problem := mistyped_option(args_list):
            print(f"nxd-train {args_list[0]}: {problem}", file=sys.stderr)
            return 2
        args_list = flag_overrides(args_list)
    if command is not None and command.options_first:
        args_list = _options_first(args_list)
    parser = build_parser()
    args = parser.parse_args(args_list)
    if hasattr(args, "items"):  # a command reading config files, then overrides
        args.files, args.overrides = split_items(args.items)
        if not args.files and args.command == "config":
            args.files = [default_config_path()]
        if not args.files:
            parser.error(f"{args.command}: expected a config file before the overrides, found {args.items[0]!r}")
    return run_command(args)


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
    if first in BY_NAME or first.startswith(("-", "+", "~")) or "=" in first or _is_config_file(first):
        return None
    if Path(first).exists():
        return None  # a config file with another suffix: the loader says what it finds in it
    close = difflib.get_close_matches(first, list(BY_NAME), n=1, cutoff=0.6)
    if close:
        return f"unknown command {first!r} (did you mean {close[0]!r}?); expected one of {', '.join(BY_NAME)}"
    return (
        f"{first!r}: expected a command ({', '.join(BY_NAME)}), a config file (.yaml, .yml or .json) or an "
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


if __name__ == "__main__":
    sys.exit(main())
