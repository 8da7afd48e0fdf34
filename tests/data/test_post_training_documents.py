"""Pre-tokenised post-training documents (GPT-NeoX's files): rows follow NeoX's reading (inputs
tokens[:seq_length], position j trained on label j + 1), long documents are cut or left out with
allow_chopped, documents with nothing to train on are left out (pairs as a whole), a reward model's
score is read where --for-rm's label is, reference files are summed over the trained positions, rewards
give KTO's labels; files that do not line up get one message naming them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from nxd_data import DataError, DocumentFiles, ExampleDocuments, IndexedDataset, IndexedDatasetWriter, PairDocuments

from tests.neox_post_training import write_neox_reference

IGNORE = -100
EOS = 9


def _write(prefix, documents, dtype=np.int32) -> str:
    with IndexedDatasetWriter(prefix, dtype) as writer:
        for document in documents:
            writer.add_document(np.asarray(document, dtype=dtype))
    return str(prefix)


@pytest.fixture
def pairs(tmp_path):
    """Three pairs; NeoX --only-last labels (the prompt -100, the answer and EOS trained). Pair 1's
    rejected side is 9 tokens long; pair 2's chosen labels are all -100."""
    chosen = [[1, 2, 3, 4, EOS], [1, 5, 6, EOS], [1, 7, 7, EOS]]
    rejected = [[1, 2, 8, EOS], [1, 5, 4, 4, 4, 4, 4, 4, EOS], [1, 7, 3, EOS]]
    chosen_labels = [[IGNORE, IGNORE, 3, 4, EOS], [IGNORE, IGNORE, 6, EOS], [IGNORE] * 4]
    rejected_labels = [[IGNORE, IGNORE, 8, EOS], [IGNORE, IGNORE] + [4] * 6 + [EOS], [IGNORE, IGNORE, 3, EOS]]
    names = {}
    for name, documents in (("c", chosen), ("r", rejected), ("cl", chosen_labels), ("rl", rejected_labels)):
        names[name] = _write(tmp_path / name, documents)
    return names


def _pairs(names, seq_length=6, **kwargs) -> PairDocuments:
    return PairDocuments(
        DocumentFiles(names["c"], names["cl"], names.get("cref"), "data.pair_documents.train"),
        DocumentFiles(names["r"], names["rl"], names.get("rref"), "data.pair_documents.train"),
        seq_length,
        0,
        **kwargs,
    )


def test_pair_rows_follow_neox_shift_and_leave_out_what_cannot_train(pairs):
    data = _pairs(pairs, allow_chopped=True)
    assert len(data) == 2 and data.left_out == 1 and data.truncated == 1  # pair 2: nothing to train on chosen
    sample = data[0]
    assert sample["input_ids"].tolist() == [[1, 2, 3, 4, EOS, 0], [1, 2, 8, EOS, 0, 0]]
    assert sample["labels"].tolist() == [[IGNORE, 3, 4, EOS, IGNORE, IGNORE], [IGNORE, 8, EOS, IGNORE, IGNORE, IGNORE]]
    long = data[1]  # the rejected side is cut to seq_length + 1 = 7 tokens: 6 inputs, 6 labels
    assert long["input_ids"][1].tolist() == [1, 5, 4, 4, 4, 4]
    assert long["labels"][1].tolist() == [IGNORE, 4, 4, 4, 4, 4]
    assert _pairs(pairs, allow_chopped=False).left_out == 2  # and now the over-long pair too


def test_a_reward_model_reads_its_score_where_for_rm_puts_the_label(tmp_path):
    tokens = [[1, 2, 3, EOS, EOS], [1, 4, EOS, EOS]]
    labels = [[IGNORE] * 4 + [EOS], [IGNORE] * 3 + [EOS]]  # NeoX's --for-rm: tokens + 2 EOS, the last labelled
    names = {
        "c": _write(tmp_path / "c", tokens),
        "cl": _write(tmp_path / "cl", labels),
        "r": _write(tmp_path / "r", tokens[::-1]),
        "rl": _write(tmp_path / "rl", labels[::-1]),
    }
    sample = _pairs(names, seq_length=8, scores=True)[0]
    # NeoX gathers the output at the position whose shifted label counts: the first appended EOS
    assert sample["score_position"].tolist() == [3, 2]
    assert sample["margin"].tolist() == [0.0, 0.0]


def test_reference_files_are_summed_over_the_trained_positions(pairs, tmp_path):
    """Written as NeoX's precompute writes them: seq_length float32 values a document under NeoX's
    float32 code, the document count rounded up (the data wrapping round)."""
    values = {
        "cref": [[0.5, 0.25, 0.125, 2.0, 9.0], [1.0, 1.0, 1.0, 9.0], [0.0] * 4],
        "rref": [[0.5, 0.25, 0.125, 9.0], [1.0] * 8 + [9.0], [0.0] * 4],
    }
    for name, documents in values.items():
        write_neox_reference(tmp_path / name, documents, 6, documents=8)
        pairs[name] = str(tmp_path / name)
    sample = _pairs(pairs, allow_chopped=True)[0]
    assert IndexedDataset(pairs["cref"]).dtype == np.float32  # NeoX's code 6, Megatron-LM's float64
    # position j holds the log-prob of token j + 1; trained positions of pair 0: chosen 1-3, rejected 1-2
    assert sample["reference_log_probs"].tolist() == [0.25 + 0.125 + 2.0, 0.25 + 0.125]
    assert sample["reference_log_probs"].dtype == torch.float64


def test_kto_examples_take_their_labels_and_strength_from_the_rewards(tmp_path):
    tokens = [[1, 2, 3, EOS], [1, 4, EOS], [1, 5, EOS], [1, 6, 6, EOS]]
    names = {"t": _write(tmp_path / "t", tokens), "w": _write(tmp_path / "w", [[1], [-1], [0], [2]])}
    data = ExampleDocuments(DocumentFiles(names["t"], where="data.example_documents.train"), names["w"], 6, 0)
    assert (len(data), data.desirable, data.undesirable) == (4, 2, 1)
    assert [data[i]["kto_reward"].item() for i in range(4)] == [1.0, -1.0, 0.0, 2.0]
    assert [data[i]["kto_label"].item() for i in range(4)] == [1.0, 0.0, 0.0, 1.0]
    assert data[0]["labels"].tolist() == [2, 3, EOS, IGNORE, IGNORE, IGNORE]  # no label file: every next token
    assert data.padding()["labels"].eq(IGNORE).all() and data.padding()["kto_reward"].item() == 0.0


@pytest.mark.parametrize(
    "problem, message",
    [
        (
            "fewer_rejected",
            "data.pair_documents.train: {r} holds 2 documents where {c} holds 3; expected one rejected "
            "response per chosen one",
        ),
        (
            "label_sizes",
            "data.pair_documents.train: labels file {cl}: document 0 holds 4 values where {c} holds 5 tokens",
        ),
        (
            "out_of_vocabulary",
            "data.pair_documents.train: {c}: document 1 holds token id 40; expected ids from 0 to the "
            "tokenizer's vocabulary (32)",
        ),
        (
            "one_side_labels",
            "data.pair_documents.train: expected labels files for both chosen and rejected documents or "
            "for neither, found one",
        ),
        (
            "short_reference",
            "data.pair_documents.train: reference file {cref}: document 0 holds 3 log-probs where its row "
            "has 4 positions; expected one per position (computed with a shorter seq_length?)",
        ),
    ],
)
def test_files_that_do_not_line_up_are_named(pairs, tmp_path, problem, message):
    if problem == "fewer_rejected":
        pairs["r"] = _write(tmp_path / "r2", [[1, 2], [1, 2]])
        pairs["rl"] = _write(tmp_path / "rl2", [[1, 2], [1, 2]])
    elif problem == "one_side_labels":
        pairs["rl"] = None
    elif problem == "short_reference":
        for name in ("cref", "rref"):
            write_neox_reference(tmp_path / name, [[0.0] * 3], 3, documents=3)
            pairs[name] = str(tmp_path / name)
    elif problem == "label_sizes":
        pairs["cl"] = _write(tmp_path / "cl2", [[IGNORE] * 4, [IGNORE] * 4, [IGNORE] * 4])
    else:
        pairs["c"] = _write(tmp_path / "c2", [[1, 2, 3, 4, EOS], [1, 40, 6, EOS], [1, 7, 7, EOS]])
    with pytest.raises(DataError) as error:
        _pairs(pairs, vocab_size=32)
    assert message.format(**pairs) in str(error.value)


def test_reward_documents_that_do_not_line_up_are_named(tmp_path):
    tokens = _write(tmp_path / "t", [[1, 2, EOS], [1, 3, EOS]])
    files = DocumentFiles(tokens, where="data.example_documents.train")
    where = "data.example_documents.train.rewards"
    with pytest.raises(
        DataError, match=f"{where}: .*w1: expected one reward document per document of .*t \\(2\\), found 3"
    ):
        ExampleDocuments(files, _write(tmp_path / "w1", [[1], [1], [-1]]), 4, 0, rewards_where=where)
    with pytest.raises(DataError, match=f"{where}: .*w2: document 1: expected one reward, found 2 values"):
        ExampleDocuments(files, _write(tmp_path / "w2", [[1], [1, -1]]), 4, 0, rewards_where=where)


def test_the_batch_entries_are_those_nxd_align_reads():
    """nxd-data and nxd-align do not import each other: the names and the neutral-reward threshold they
    share are spelt twice, and must agree."""
    from nxd_align import kto
    from nxd_data import documents

    assert documents.REFERENCE_KEY == kto.REFERENCE_KEY and documents.LABEL_KEY == kto.LABEL_KEY
    assert documents.REWARD_KEY == kto.REWARD_KEY and documents.NEUTRAL == kto.NEUTRAL
