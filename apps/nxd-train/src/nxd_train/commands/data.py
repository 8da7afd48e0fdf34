"""`nxd-train data preprocess`: jsonl files tokenised into Megatron .bin/.idx files (nxd-data)."""

from __future__ import annotations

import argparse
import sys


def run(args: argparse.Namespace) -> int:
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
