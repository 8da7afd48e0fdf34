"""DPO's and KTO's reference model in a run (nxd-align's tables and row log-probs, wired to the run's
executor), and KTO's KL baseline pass.

Precomputed (the default): before the first step, every sample of the training, validation and test
data goes once through the initial weights (under LoRA, the base with its adapters off), in eval mode,
several training micro-batches at a time, sharded over the data-parallel ranks; the table is gathered
on every rank, written beside the logs and into each checkpoint, and read by dataset index. A resumed
run reads the table of the checkpoint it continues and never recomputes it from trained weights; a
fresh run reuses the log directory's table when its digest matches and otherwise computes it anew,
saying so.

Live (`precompute_ref_log_probs: False`): the reference runs beside the policy on each step's
micro-batches: the policy with adapters off under LoRA, else a frozen copy of the initial weights.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import torch
from nxd_align import (
    IGNORE_INDEX,
    KL_KEY,
    REFERENCE_KEY,
    TABLE_FILE,
    ReferenceError,
    RowLogProbs,
    WithReference,
    adapters_disabled,
    kl_baseline,
    load_reference,
    save_reference,
)
from nxd_ckpt import CheckpointError
from nxd_data import PADDING
from nxd_parallel import DirectExecutor, PipelineExecutor, StagedModel, build_executor, build_parallel_model
from nxd_precision import prepare_parameters
from torch import nn
from torch.utils.data import Dataset

from nxd_train.run.checkpointing import Resume
from nxd_train.run.initial_weights import load_weights
from nxd_train.run.state import Batch, Run, forward_autocast


@contextlib.contextmanager
def reference_mode(model: nn.Module | StagedModel, lora: bool) -> Iterator[None]:
    """`model` computing the reference: eval mode (no dropout), adapters off under LoRA, no gradients."""
    stages = model.stages if isinstance(model, StagedModel) else [model]
    modes = [stage.training for stage in stages]
    model.eval()
    try:
        with torch.no_grad(), adapters_disabled(stages) if lora else contextlib.nullcontext():
            yield
    finally:
        for stage, training in zip(stages, modes, strict=True):
            stage.train(training)


def _row_log_probs(executor: DirectExecutor | PipelineExecutor, batches: list[Batch]) -> torch.Tensor:
    """Every row's summed response log-prob, the micro-batches' rows in order (zeros on pipeline
    ranks without the last stage; partial sums under context parallelism)."""
    found = executor.run(batches, RowLogProbs(batches), training=False).metrics.get("log_probs")
    if found is None:
        rows = sum(batch["labels"].shape[0] for batch in batches)
        return torch.zeros(rows, dtype=torch.float64, device=batches[0]["labels"].device)
    return found


def reference_batching(loss_chunk_tokens: int) -> int:
    """How many training micro-batches' samples the reference pass runs at once (outside pipelines,
    whose stages pass the step's shape). It keeps no activations for a backward; what bounds it is the
    output layer: whole logits of two micro-batches take what a training step's logits and their
    gradient take, and a chunked loss never holds more than a chunk, so there four."""
    return 4 if loss_chunk_tokens else 2


def compute_table(run: Run, dataset: Dataset) -> torch.Tensor:
    """The (samples x rows per sample) reference log-probs of `dataset`, on every rank. Samples of like
    length share a micro-batch (longest first), so the trimmed micro-batches carry little padding; a
    micro-batch holds `reference_batching` training micro-batches' samples (pipelines: one, and a call
    the step's micro-batches); the data-parallel ranks take turns through that order and make as many
    calls each. Each value depends on its sample only, so the order changes nothing but the time."""
    samples, dp, rank = len(dataset), run.dims.dp, run.mesh.data_parallel_rank
    pipelined = isinstance(run.executor, PipelineExecutor)
    merged = 1 if pipelined else reference_batching(run.plan.family.loss_chunk_tokens)
    micro = run.plan.batches.micro_batch_size * merged
    per_call = micro * (run.accumulation if pipelined else 1)
    lengths = dataset.lengths() if hasattr(dataset, "lengths") else [0] * samples
    mine = sorted(range(samples), key=lambda index: (-lengths[index], index))[rank::dp]
    share = -(-samples // dp)  # the most samples a rank takes
    calls = max(1, -(-share // per_call))
    order = mine + [PADDING] * (calls * per_call - len(mine))
    batches = run.micro_batches(dataset, [order[i : i + micro] for i in range(0, len(order), micro)])
    rows = run.plan.data.rows_per_sample
    table = torch.zeros(samples, rows, dtype=torch.float64, device=run.fabric.device)
    with reference_mode(run.model, run.plan.lora is not None):
        for call in range(calls):
            step = [next(batches) for _ in range(per_call // micro)]
            values = _row_log_probs(run.executor, step).view(per_call, rows)
            indices = torch.tensor(order[call * per_call : (call + 1) * per_call])
            real = indices != PADDING
            table[indices[real].to(table.device)] = values[real.to(values.device)]
    return run.summed(table, run.token_mesh, run.pp_mesh)


def _broadcast(run: Run, tables: dict[str, torch.Tensor] | None, sizes: dict[str, int]) -> dict[str, torch.Tensor]:
    """Rank 0's tables (None elsewhere) on every rank."""
    received, rows = {}, run.plan.data.rows_per_sample
    for split, size in sizes.items():
        table = torch.empty(size, rows, dtype=torch.float64) if tables is None else tables[split].double()
        table = table.to(run.fabric.device)
        if torch.distributed.is_initialized():
            torch.distributed.broadcast(table, src=0)
        received[split] = table.cpu()
    return received


def _stored(run: Run, path: Path, sizes: dict[str, int], *, required: bool) -> dict[str, torch.Tensor] | None:
    """The tables stored at `path`, read on rank 0 and sent to every rank; None when absent or (for a
    fresh run, `required` False) made for another run, said in the log."""
    problem = None
    if run.fabric.global_rank == 0:
        try:
            tables = load_reference(path, run.plan.reference.digest) if path.exists() else None
            shapes = {split: tuple(table.shape) for split, table in (tables or {}).items()}
            expected = {split: (size, run.plan.data.rows_per_sample) for split, size in sizes.items()}
            if tables is not None and shapes != expected:
                raise ReferenceError(f"{path}: expected reference log-probs of shape {expected}, found {shapes}")
        except ReferenceError as error:
            tables, problem = None, str(error)
        state = "found" if tables is not None else "absent" if problem is None else problem
    state = run.fabric.broadcast(state if run.fabric.global_rank == 0 else None, src=0)
    if state == "found":
        return _broadcast(run, tables if run.fabric.global_rank == 0 else None, sizes)
    if required:
        found = "no reference_log_probs table" if state == "absent" else state
        raise CheckpointError(
            f"{path.parent}: expected the reference log-probs saved with the checkpoint "
            f"(they are never recomputed from trained weights), found {found}"
        )
    if state != "absent":
        run.monitor.info(f"{state}: computing them anew")
    return None


def prepare_reference(run: Run, resume: Resume | None) -> None:
    """Give the run its reference log-probs: the table (read back or computed) on its datasets, or the
    live reference pass; the objective then finds `reference_log_probs` in every micro-batch."""
    plan = run.plan
    if plan.reference.kl_baseline:  # after the reference values, which it reads for the KL rows
        run.step_passes.insert(0, partial(_baseline_pass, run))
    if not plan.reference.precompute:
        run.step_passes.insert(0, _live_pass(run))
        return
    datasets = {"train": plan.data.train, "validation": plan.data.validation, "test": plan.data.test}
    datasets = {split: dataset for split, dataset in datasets.items() if dataset is not None}
    sizes = {split: len(dataset) for split, dataset in datasets.items()}
    continuing = resume is not None and not resume.weights_only
    stored = run.log_dir / TABLE_FILE
    tables = _stored(run, resume.path / TABLE_FILE if continuing else stored, sizes, required=continuing)
    if tables is None:
        started = time.perf_counter()
        tables = {split: compute_table(run, dataset).cpu() for split, dataset in datasets.items()}
        run.monitor.info(
            f"reference log-probs of {', '.join(f'{n} {s} samples' for s, n in sizes.items())} computed "
            f"in {time.perf_counter() - started:.2f} s"
        )
        if run.fabric.global_rank == 0:
            save_reference(stored, tables, plan.reference.digest)
    else:
        run.monitor.info(f"reference log-probs from {resume.path if continuing else run.log_dir}/{TABLE_FILE}")
    run.train_data = WithReference(plan.data.train, tables["train"])
    if "validation" in tables:
        run.validation_data = WithReference(plan.data.validation, tables["validation"])
    if "test" in tables:
        run.test_data = WithReference(plan.data.test, tables["test"])
    run.padding = run.train_data.padding()
    run.attach.append(partial(_keep_with_checkpoint, tables=tables, digest=plan.reference.digest))


def _keep_with_checkpoint(folder: Path, *, tables: dict[str, torch.Tensor], digest: str) -> None:
    save_reference(folder / TABLE_FILE, tables, digest)


def _baseline_pass(run: Run, batches: list[Batch]) -> None:
    """KTO's KL baseline for a step: the policy's log-probs of every micro-batch's KL rows (the odd
    rows), without gradients or dropout, against their reference values, averaged over the step's
    global batch and clamped at 0 (nxd-align's `kl_baseline`), given to each micro-batch as `kto_kl`.
    The micro-batches then keep only their example rows; pipeline stages keep one shape, so there
    the KL rows stay (measured with the rest) and their labels are ignored instead."""
    whole = isinstance(run.executor, PipelineExecutor)
    kl_rows = [{key: value[1::2] for key, value in batch.items()} for batch in batches]
    with reference_mode(run.model, lora=False):
        policy = run.summed(
            _row_log_probs(run.executor, batches if whole else kl_rows), run.mesh.get("cp"), run.pp_mesh
        )
    counted = run.summed(torch.cat([(rows["labels"] != IGNORE_INDEX).sum(-1) for rows in kl_rows]), run.mesh.get("cp"))
    reference = torch.cat([rows[REFERENCE_KEY] for rows in kl_rows])
    data_parallel = run.mesh.get("dp")
    kl = kl_baseline(
        policy[1::2] if whole else policy, reference, counted > 0, lambda sums: run.summed(sums, data_parallel)
    )
    for batch in batches:
        if whole:
            batch["labels"] = batch["labels"].clone()
            batch["labels"][1::2] = IGNORE_INDEX
        else:
            batch.update({key: value[0::2] for key, value in batch.items()})
        batch[KL_KEY] = kl


def frozen_reference(
    run: Run, initial: Resume | None
) -> tuple[nn.Module | StagedModel, DirectExecutor | PipelineExecutor, bool]:
    """The reference model beside the policy, its executor, and whether it is the policy with its adapters off
    (LoRA); else a frozen copy of the `initial` weights (None: the seeded initialisation), sharded like the policy."""
    plan = run.plan
    if plan.lora is not None:
        return run.model, run.executor, True
    model = build_parallel_model(
        plan.family,
        plan.layout,
        run.mesh,
        run.fabric.device,
        seed=plan.launch.seed,
        use_cpu_initialization=plan.launch.use_cpu_initialization,
        prepare=partial(prepare_parameters, policy=plan.policy),
        loaded=() if initial is None else plan.family.parameter_shapes(),
    )
    if initial is not None:
        load_weights(model, initial, plan.family, run.checkpoint_group)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    executor = build_executor(
        model,
        plan.family.token_losses,
        run.fabric.device,
        pp=run.pp_mesh,
        microbatches=run.accumulation,
        autocast=forward_autocast(run.fabric, plan.policy),
    )
    return model, executor, False


def _live_pass(run: Run) -> Callable[[list[Batch]], None]:
    """Each step's reference log-probs, computed just before the policy's pass on the same micro-batches."""
    model, executor, lora = frozen_reference(run, run.plan.reference.initial)
    sequence = run.mesh.get("cp")

    def attach(batches: list[Batch]) -> None:
        with reference_mode(model, lora):
            values = run.summed(_row_log_probs(executor, batches), sequence, run.pp_mesh)
        start = 0
        for batch in batches:
            rows = batch["labels"].shape[0]
            batch[REFERENCE_KEY] = values[start : start + rows]
            start += rows

    return attach
