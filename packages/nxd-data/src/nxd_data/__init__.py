"""nxd_data: Megatron indexed datasets, GPT pretraining samples, blending, Hugging Face data,
supervised fine-tuning records (packed or padded), preference pairs, KTO examples and exact-resume
sampling."""

from importlib.metadata import version as _distribution_version

from .blending import BlendedDataset, blend_indices, weights_by_documents
from .documents import DocumentFiles, ExampleDocuments, PairDocuments
from .errors import DataError, DataWarning
from .files import save_atomically
from .gpt_dataset import GPTDataset, split_documents
from .hf_data import TokenStream, hf_pretraining_dataset, load_records
from .hub_records import HubDataset, RecordForm, formatted_splits
from .indexed import IndexedDataset, IndexedDatasetWriter, token_dtype
from .indices import build_indices
from .kto import KTODataset, kto_dataset
from .megatron import MegatronDataBuilder
from .preference import PreferenceDataset, collate_packed_pairs, collate_pairs, preference_dataset
from .preprocess import PreprocessSummary, preprocess_jsonl
from .sampler import PADDING, PretrainingSampler, WithPadding
from .samples import IGNORE_INDEX, SampleFormat, collate
from .sft import SFTDataset, pack_best_fit, sft_dataset
from .tokenizer import TextTokenizer, TokenizerSource, load_tokenizer
from .whole_documents import PACKINGS, WholeDocumentDataset

__version__ = _distribution_version("nxd-data")  # one source: the pyproject's version

__all__ = [
    "IGNORE_INDEX",
    "PACKINGS",
    "PADDING",
    "BlendedDataset",
    "DataError",
    "DataWarning",
    "DocumentFiles",
    "ExampleDocuments",
    "GPTDataset",
    "HubDataset",
    "IndexedDataset",
    "IndexedDatasetWriter",
    "KTODataset",
    "MegatronDataBuilder",
    "PairDocuments",
    "PreferenceDataset",
    "PreprocessSummary",
    "PretrainingSampler",
    "RecordForm",
    "SFTDataset",
    "SampleFormat",
    "TextTokenizer",
    "TokenStream",
    "TokenizerSource",
    "WholeDocumentDataset",
    "WithPadding",
    "blend_indices",
    "build_indices",
    "collate",
    "collate_packed_pairs",
    "collate_pairs",
    "formatted_splits",
    "hf_pretraining_dataset",
    "kto_dataset",
    "load_records",
    "load_tokenizer",
    "pack_best_fit",
    "preference_dataset",
    "preprocess_jsonl",
    "save_atomically",
    "sft_dataset",
    "split_documents",
    "token_dtype",
    "weights_by_documents",
]
