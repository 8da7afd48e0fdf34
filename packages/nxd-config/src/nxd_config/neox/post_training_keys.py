"""GPT-NeoX's post-training keys: `train_impl` dpo / kto / rm with their settings and data files (as
`preprocess_data_with_chat_template.py` writes them), onto nxd's preference methods and
`data.pair_documents` / `data.example_documents`. SFT is `train_impl: normal` with label files, which
the data keys already read."""

from __future__ import annotations

from typing import Any

from ..errors import show
from .translation import Arguments, Translation, choice, typed

SPLITS = (("train", "train"), ("valid", "validation"), ("test", "test"))
IMPLS = ("normal", "dpo", "kto", "rm", "reinforce")


def post_training_keys(a: Arguments, t: Translation) -> None:
    impl = choice(t, a, "train_impl", IMPLS)
    dataset = choice(t, a, "dataset_impl", ("gpt2", "pairwise", "online"))
    if dataset == "online" and impl == "reinforce":
        t.notice(
            "dataset_impl",
            "accepted: online reads the samples a generation server sends; nxd samples reinforce's completions "
            "itself from the policy (model_alignment_strategy.grpo), so no data server is read",
        )
    elif dataset is not None and impl in ("normal", "dpo", "kto", "rm"):
        wanted = "pairwise" if impl in ("dpo", "rm") else "gpt2"
        if dataset != wanted:
            t.refuse(
                "dataset_impl",
                f"expected {wanted} with train_impl {impl} (GPT-NeoX reads "
                f"{'pos/neg pairs' if wanted == 'pairwise' else 'one document a sample'} for it), found "
                f"{dataset}",
            )
    _unused_files(a, t, impl)
    if impl == "dpo":
        reference_free = typed(t, a, "dpo_reference_free", bool, "true or false")
        t.set(
            "model_alignment_strategy.dpo",
            {"kl_beta": a["dpo_beta"], "reference_free": bool(reference_free)},
            "train_impl",
            "dpo_beta",
            "dpo_reference_free",
        )
        if reference_free and a["precompute_model_name"] is not None:
            t.refuse(
                "precompute_model_name",
                "expected none with dpo_reference_free: true (no reference log-probs are "
                "read), found " + show(a["precompute_model_name"]),
            )
        _pairs(a, t, with_reference=not reference_free)
    elif impl == "rm":
        t.set("model_alignment_strategy.reward_model", {"z_loss": a["z_loss"]}, "train_impl", "z_loss")
        _pairs(a, t, with_reference=False)
    elif impl == "reinforce":
        _reinforce(a, t)
    elif impl == "kto":
        if a["data_path"] is not None:
            t.refuse(
                "data_path",
                "expected train/valid/test_data_paths with train_impl kto (each with its label and "
                "reward files), found data_path",
            )
        t.set(
            "model_alignment_strategy.kto",
            {
                "beta": a["kto_beta"],
                "desirable_weight": a["kto_desirable_weight"],
                "undesirable_weight": a["kto_undesirable_weight"],
                "kl_estimate": "batch_halves",
            },
            "train_impl",
            "kto_beta",
            "kto_desirable_weight",
            "kto_undesirable_weight",
        )
        _examples(a, t)
    for key in REINFORCE_KEYS if impl != "reinforce" else ():
        if a.given(key):
            t.notice(key, "accepted, changes nothing here: read with train_impl reinforce only")
    if a["precompute_model_name"] is not None and impl not in ("dpo", "kto"):
        t.refuse(
            "precompute_model_name",
            f"expected none with train_impl {impl} (reference log-probs are read by "
            f"dpo and kto), found {show(a['precompute_model_name'])}",
        )


REINFORCE_KEYS = ("kl_impl", "kl_div_beta", "reinforce_leave_one_out")
KL_IMPLS = {"abs": "abs", "mse": "mse", "kl": "k1"}
"""GPT-NeoX's kl_impl -> GRPO's kl_estimator."""


def _reinforce(a: Arguments, t: Translation) -> None:
    """train_impl reinforce: GRPO with GPT-NeoX's REINFORCE settings. Its baseline is the mean of the group's other
    completions (reinforce_leave_one_out) or of the last 100 groups' means, rewards are not scaled, the KL term is
    kl_div_beta x kl_impl's estimate, with no importance correction (one update per rollout: the plain policy
    gradient). Completions come from the policy itself, not a generation server, of up to half of seq_length (the
    server decided their length); the rewards are nxd's (model_alignment_strategy.grpo.rewards), which the file
    cannot name: its translation (nxd-train config translate) takes them."""
    kl_impl = choice(t, a, "kl_impl", ("abs", "mse", "kl", "full"))
    if kl_impl == "full":
        t.refuse(
            "kl_impl",
            "expected abs, mse or kl, found full: the whole vocabulary's KL needs every logit of every completion "
            "token, and nxd's loss reads the sampled tokens' log-probs only",
        )
    leave_one_out = typed(t, a, "reinforce_leave_one_out", bool, "true or false")
    t.set(
        "model_alignment_strategy.grpo",
        {
            "baseline": "leave_one_out" if leave_one_out else "running_mean",
            "scale_rewards": "none",
            "loss_type": "dapo",
            "beta": a["kl_div_beta"],
            "kl_estimator": KL_IMPLS.get(kl_impl, "mse"),
            "kl_importance_correction": False,
            "max_new_tokens": max(1, int(a["seq_length"] or 2) // 2),
        },
        "train_impl",
        "reinforce_leave_one_out",
        "kl_impl",
        "kl_div_beta",
    )


PRETRAINING_DATA = (
    "data_path",
    "split",
    "train_data_paths",
    "valid_data_paths",
    "test_data_paths",
    "train_label_data_paths",
    "valid_label_data_paths",
    "test_label_data_paths",
    "train_data_weights",
    "valid_data_weights",
    "test_data_weights",
    "weight_by_num_documents",
    "weighted_sampler_alpha",
)
"""The data keys of train_impl normal (and, but for blending, kto)."""


def _unused_files(a: Arguments, t: Translation, impl: str | None) -> None:
    """Pair files are read by dpo and rm only, reward files by kto only; dpo and rm read no
    pretraining data keys, kto blends nothing (one path a split)."""
    for key in PRETRAINING_DATA:
        if not a.given(key):
            continue
        if impl in ("dpo", "rm"):
            t.refuse(
                key, f"expected it unset with train_impl {impl}, which reads pos/neg_*_data_paths, found {show(a[key])}"
            )
        elif impl == "kto" and key in ("weight_by_num_documents", "weighted_sampler_alpha", "split"):
            t.notice(
                key,
                "accepted, changes nothing here: train_impl kto reads one path a split (train/valid/"
                "test_data_paths), with nothing to blend or cut",
            )
    for prefix, impls in (("pos_", ("dpo", "rm")), ("neg_", ("dpo", "rm"))):
        for split, _ in SPLITS:
            for key in (f"{prefix}{split}_data_paths", f"{prefix}{split}_label_data_paths"):
                if a[key] is not None and impl not in impls:
                    t.refuse(
                        key,
                        f"expected none with train_impl {impl} (pos/neg pairs are read by dpo and rm), "
                        f"found {show(a[key])}",
                    )
    for split, _ in SPLITS:
        key = f"{split}_reward_data_paths"
        if a[key] is not None and impl != "kto":
            t.refuse(key, f"expected none with train_impl {impl} (rewards are read by kto), found {show(a[key])}")


def _one(t: Translation, a: Arguments, key: str) -> str | None:
    """The single prefix of a NeoX path list (nxd reads one set of files a split)."""
    value = a[key]
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or len(value) != 1 or not isinstance(value[0], str):
        t.refuse(
            key,
            f"expected one path prefix in a list (nxd reads one set of post-training files a split; "
            f"join them into one with preprocessing), found {show(value)}",
        )
        return None
    return value[0]


def _reference(a: Arguments, prefix: str | None) -> str | None:
    """NeoX's precomputed reference file of a data prefix: `{prefix}_{precompute_model_name}`."""
    name = a["precompute_model_name"]
    return None if name is None or prefix is None else f"{prefix}_{name}"


def _pairs(a: Arguments, t: Translation, *, with_reference: bool) -> None:
    """pos/neg_{train,valid,test}_data_paths and their label paths as data.pair_documents."""
    splits: dict[str, dict[str, Any]] = {}
    keys = []
    for split, section in SPLITS:
        names = {
            "chosen": f"pos_{split}_data_paths",
            "rejected": f"neg_{split}_data_paths",
            "chosen_labels": f"pos_{split}_label_data_paths",
            "rejected_labels": f"neg_{split}_label_data_paths",
        }
        files = {role: _one(t, a, key) for role, key in names.items()}
        if not any(a[key] is not None for key in names.values()):
            continue
        keys += list(names.values())
        if files["chosen"] is None or files["rejected"] is None:
            missing = names["chosen"] if files["chosen"] is None else names["rejected"]
            t.refuse(missing, f"expected pos and neg {split} data paths together, found only the other")
            continue
        if (files["chosen_labels"] is None) != (files["rejected_labels"] is None):
            missing = names["chosen_labels"] if files["chosen_labels"] is None else names["rejected_labels"]
            t.refuse(missing, f"expected pos and neg {split} label paths together (or neither), found only the other")
            continue
        if with_reference:
            files |= {
                "chosen_reference": _reference(a, files["chosen"]),
                "rejected_reference": _reference(a, files["rejected"]),
            }
        splits[section] = {role: value for role, value in files.items() if value is not None}
    if "train" not in splits:
        t.refuse(
            "pos_train_data_paths",
            "expected the training pairs (pos_train_data_paths and neg_train_data_paths) "
            "with train_impl dpo or rm, found none",
        )
        return
    t.set("data.pair_documents", splits, *keys, *(["precompute_model_name"] if with_reference else []))


def _examples(a: Arguments, t: Translation) -> None:
    """{train,valid,test}_data_paths with their label and reward paths as data.example_documents."""
    splits: dict[str, dict[str, Any]] = {}
    keys = []
    for split, section in SPLITS:
        names = {
            "documents": f"{split}_data_paths",
            "labels": f"{split}_label_data_paths",
            "rewards": f"{split}_reward_data_paths",
        }
        if a[names["documents"]] is None:
            for key in (names["labels"], names["rewards"]):
                if a[key] is not None:
                    t.refuse(key, f"expected it with {names['documents']}, found no {names['documents']}")
            continue
        files = {role: _one(t, a, key) for role, key in names.items()}
        keys += list(names.values())
        if files["documents"] is None:
            continue
        if files["rewards"] is None:
            if a[names["rewards"]] is None:
                t.refuse(
                    names["rewards"],
                    f"expected one reward document per example with train_impl kto (written by "
                    f"preprocess_data_with_chat_template.py --reward-key), found none for {names['documents']}",
                )
            continue
        if a[f"{split}_data_weights"] is not None:
            t.notice(f"{split}_data_weights", "accepted, changes nothing here: one path a split has nothing to blend")
        files["reference"] = _reference(a, files["documents"])
        splits[section] = {role: value for role, value in files.items() if value is not None}
    if "train" not in splits:
        if a["train_data_paths"] is None:
            t.refuse("train_data_paths", "expected the training examples with train_impl kto, found none")
        return
    t.set("data.example_documents", splits, *keys, "precompute_model_name")
