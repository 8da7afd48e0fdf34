"""nxd_data: Megatron indexed datasets, GPT pretraining samples, blending, Hugging Face data,
supervised fine-tuning records (packed or padded), preference pairs, KTO examples, online RL's prompts and
completion rows, and exact-resume sampling."""

from importlib.metadata import version as _distribution_version

from .completion_rows import completion_rows
from .curriculum import SequenceCurriculum, truncate
from .documents import DocumentFiles, ExampleDocuments, PairDocuments
from .errors import DataError
from .files import save_atomically
from .gpt_dataset import GPTDataset
from .hf_data import TokenStream, hf_pretraining_dataset
from .hub_records import HubDataset, RecordForm, formatted_splits
from .indexed import IndexedDataset, IndexedDatasetWriter, token_dtype
from .kto import kto_dataset
from .megatron import MegatronDataBuilder
from .preference import collate_packed_pairs, collate_pairs, preference_dataset
from .preprocess import preprocess_jsonl
from .prompts import (
    PROMPT_INDEX,
    PROMPT_SPLIT,
    Prompt,
    PromptDataset,
    collate_prompts,
    document_prompts,
    prompt_dataset,
)
from .sampler import PADDING, PretrainingSampler, WithPadding
from .samples import SampleFormat, collate
from .sft import sft_dataset
from .tokenizer import TextTokenizer, TokenizerSource, load_tokenizer

__version__ = _distribution_version("nxd-data")  # one source: the pyproject's version

__all__ = [
    "PADDING",
    "PROMPT_INDEX",
    "PROMPT_SPLIT",
    "DataError",
    "DocumentFiles",
    "ExampleDocuments",
    "GPTDataset",
    "HubDataset",
    "IndexedDataset",
    "IndexedDatasetWriter",
    "MegatronDataBuilder",
    "PairDocuments",
    "PretrainingSampler",
    "Prompt",
    "PromptDataset",
    "RecordForm",
    "SampleFormat",
    "SequenceCurriculum",
    "TextTokenizer",
    "TokenStream",
    "TokenizerSource",
    "WithPadding",
    "collate",
    "collate_packed_pairs",
    "collate_pairs",
    "collate_prompts",
    "completion_rows",
    "document_prompts",
    "formatted_splits",
    "hf_pretraining_dataset",
    "kto_dataset",
    "load_tokenizer",
    "preference_dataset",
    "preprocess_jsonl",
    "prompt_dataset",
    "save_atomically",
    "sft_dataset",
    "token_dtype",
    "truncate",
]
