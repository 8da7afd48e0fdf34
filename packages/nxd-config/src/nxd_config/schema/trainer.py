"""`trainer`: the loop's length, logging, validation cadence and gradient clipping.

Defaults follow the PyTorch Lightning Trainer, whose definitions the reference adopts.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from ..hostfile import check_host_name
from ._base import OneLine, Section, Status, key

_Count = Annotated[int, Field(ge=0)]
_Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
_Interval = Annotated[float, Field(gt=0.0, le=1.0)]
_LIMIT = "an integer >= 0 (batches) or a number from 0.0 to 1.0 (fraction)"

APP = "nxd-train"


class ClusterLaunch(Section):
    """How `nxd-train launch` starts the job on a cluster (an nxd extension; GPT-NeoX's launcher keys map here)."""

    scheduler: Literal["slurm", "hosts"] = key(
        "slurm",
        "What `nxd-train launch` writes: an sbatch script (slurm), or the torchrun command of each host of "
        "hostfile (hosts).",
        by=APP,
        status=Status.EXTENSION,
        note="GPT-NeoX's launcher: slurm (or deepspeed_slurm) is slurm; pdsh, openmpi, mvapich are hosts",
    )
    hostfile: OneLine | None = key(
        None,
        "A DeepSpeed hostfile ('HOST slots=N' a line): the hosts the job runs on, N processes each.",
        by=APP,
        status=Status.EXTENSION,
        note="GPT-NeoX's hostfile",
    )
    include: OneLine | None = key(
        None,
        "Hosts of the hostfile to use, DeepSpeed's form: 'host1@host2:0,1' (slots after ':').",
        by=APP,
        status=Status.EXTENSION,
        note="GPT-NeoX's include",
    )
    exclude: OneLine | None = key(
        None,
        "Hosts (or their slots, after ':') of the hostfile to leave out, DeepSpeed's form.",
        by=APP,
        status=Status.EXTENSION,
        note="GPT-NeoX's exclude",
    )
    master_addr: Annotated[OneLine | None, AfterValidator(check_host_name)] = key(
        None,
        "The rendezvous host (hosts scheduler; null: the first host).",
        by=APP,
        status=Status.EXTENSION,
        note="GPT-NeoX's master_addr",
    )
    master_port: int = key(
        29500,
        "The rendezvous port.",
        by=APP,
        status=Status.EXTENSION,
        ge=1,
        le=65535,
        note="GPT-NeoX's master_port",
    )
    partition: OneLine | None = key(
        None,
        "Slurm partition (sbatch --partition).",
        by=APP,
        status=Status.EXTENSION,
        note="NxDT's users wrote their own sbatch scripts",
    )
    account: OneLine | None = key(
        None,
        "Slurm account (sbatch --account).",
        by=APP,
        status=Status.EXTENSION,
        note="GPT-NeoX's account",
    )
    comment: OneLine | None = key(
        None,
        "Slurm job comment (sbatch --comment).",
        by=APP,
        status=Status.EXTENSION,
        note="GPT-NeoX's comment",
    )
    time: OneLine | None = key(
        None,
        "Slurm time limit (sbatch --time, e.g. 04:00:00 or 2-00:00:00); null: the partition's.",
        by=APP,
        status=Status.EXTENSION,
        note="NxDT's users wrote their own sbatch scripts",
    )
    gpus_per_node: int | None = key(
        None,
        "GPUs to request on each node (sbatch --gpus-per-node); null: none (CPU nodes, or the partition's).",
        by=APP,
        status=Status.EXTENSION,
        ge=1,
        note="NxDT's users wrote their own sbatch scripts",
    )
    requeue: bool = key(
        True,
        "The job may be requeued (sbatch --requeue): after preemption, or the save trainer.requeue_signal "
        "causes, it runs again and resumes by itself.",
        by=APP,
        status=Status.EXTENSION,
        note="a job that resumes by itself is safe to requeue",
    )
    signal_seconds: int = key(
        120,
        "Seconds before the time limit that Slurm sends trainer.requeue_signal (sbatch --signal=USR1@120), "
        "time for a checkpoint to be written.",
        by=APP,
        status=Status.EXTENSION,
        ge=1,
        le=65535,
        note="Slurm's own warning, which Lightning's SLURMEnvironment also relies on",
    )
    job_name: OneLine | None = key(
        None,
        "The Slurm job's name; null: the run's name.",
        by=APP,
        status=Status.EXTENSION,
        note="NxDT's users wrote their own sbatch scripts",
    )


class TrainerConfig(Section):
    devices: int = key(1, "Devices (processes) per node; with torchrun, nproc_per_node.", by=APP, ge=1)
    num_nodes: int = key(1, "Number of nodes; world size is devices * num_nodes.", by=APP, ge=1)
    max_epochs: int = key(-1, "Maximum epochs; -1 means the length is set by max_steps alone.", by=APP, ge=-1)
    max_steps: int = key(-1, "Maximum optimizer steps; -1 means the length is set by max_epochs alone.", by=APP, ge=-1)
    exit_interval: int | None = key(
        None,
        "Stop after every N-th optimizer step (a multiple of N counted from the run's start) with a checkpoint, "
        "exit code 0; a run resuming from that checkpoint stops at the next multiple. null: run to the end.",
        by=APP,
        ge=1,
        status=Status.EXTENSION,
        note="GPT-NeoX's exit_interval; NxDT has no such key",
    )
    char_level_ppl: bool = key(
        False,
        "Validation and test also log validation/lm_loss_char_lvl_ppl (test/...): exp(loss x tokens per "
        "character), the characters counted by decoding the samples evaluated with the run's tokenizer.",
        by=APP,
        status=Status.EXTENSION,
        note="GPT-NeoX's char_level_ppl",
    )
    log_every_n_steps: int = key(1, "Log loss and metrics every N optimizer steps.", by=APP, ge=1)
    val_check_interval: Annotated[int, Field(ge=1)] | _Interval = key(
        1.0,
        "Validate every N training steps (int) or at this fraction of each epoch (float).",
        by=APP,
        expected="an integer >= 1 (steps) or a number in (0, 1] (fraction of an epoch)",
    )
    check_val_every_n_epoch: int | None = key(
        1,
        "Validate every N epochs; null lets val_check_interval count steps across epochs.",
        by=APP,
        ge=1,
    )
    num_sanity_val_steps: int = key(
        2, "Validation batches run before training starts; 0 disables, -1 runs all.", by=APP, ge=-1
    )
    limit_val_batches: _Count | _Fraction = key(
        1.0, "Validation batches per run: int = batches, float = fraction, 0 = off.", by=APP, expected=_LIMIT
    )
    limit_test_batches: _Count | _Fraction = key(
        1.0, "Test batches per run: int = batches, float = fraction, 0 = off.", by=APP, expected=_LIMIT
    )
    gradient_clip_val: float | None = key(
        None, "Clip the global gradient norm to this value; null or 0 disables.", by=APP, ge=0.0
    )
    on_nonfinite: Literal["skip", "stop"] = key(
        "skip",
        "A step whose loss or gradient norm is NaN or infinite: skip it (no update) or stop the run.",
        by="nxd-precision",
        status=Status.EXTENSION,
        note="NxDT trains on; skipping is what loss-scaled mixed precision does with an overflow",
    )
    max_consecutive_nonfinite: int = key(
        10,
        "With on_nonfinite skip: stop the run after this many skipped steps in a row.",
        by="nxd-precision",
        status=Status.EXTENSION,
        note="a diverged run ends with a message instead of spinning",
        ge=1,
    )
    keep_freed_host_memory: bool = key(
        True,
        "When the training device is the CPU (glibc Linux): keep freed host memory in the process for the next "
        "step (mallopt M_MMAP_MAX 0, no heap trimming) instead of faulting its large tensors in afresh every "
        "step; peak host memory a few percent higher. A malloc setting in the environment (MALLOC_*_ or "
        "GLIBC_TUNABLES) is kept instead.",
        by="nxd-parallel",
        status=Status.EXTENSION,
        note="NxDT's steps run on Neuron devices; on the CPU, glibc unmaps and faults in every large tensor each step",
    )
    requeue_signal: Literal["SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP", "SIGCONT"] | None = key(
        "SIGUSR1",
        "The signal that warns of the end of a job's time or of preemption (Slurm's sbatch --signal=USR1@SECONDS): "
        "every rank stops after the current step, a checkpoint of that step is saved and, under Slurm with "
        "auto_requeue, the job is requeued. SIGTERM and SIGINT always save and stop; null: no warning signal.",
        by=APP,
        status=Status.EXTENSION,
        note="Lightning's SLURMEnvironment(requeue_signal=SIGUSR1); NxDT launched through Slurm scripts of its own",
    )
    auto_requeue: bool = key(
        True,
        "Under a Slurm batch job, after the save that requeue_signal or SIGTERM causes: requeue the job "
        "(scontrol requeue), so that it resumes by itself from that checkpoint when it runs again.",
        by=APP,
        status=Status.EXTENSION,
        note="Lightning's SLURMEnvironment(auto_requeue=True)",
    )
    requeue_exit_code: int | None = key(
        None,
        "The exit code of a run stopped by a signal after its save; null: 128 + the signal's number, as a shell "
        "reports it. Set the code a cluster's RequeueExit names to have Slurm requeue on it.",
        by=APP,
        status=Status.EXTENSION,
        ge=0,
        le=255,
        note="Slurm's RequeueExit in slurm.conf requeues a batch job that exits with a listed code",
    )
    cluster: ClusterLaunch = key(
        ClusterLaunch(),
        "How `nxd-train launch` starts this job on a cluster: an sbatch script or each host's torchrun command.",
        by=APP,
        status=Status.EXTENSION,
        note="GPT-NeoX's launcher keys map here",
    )
    lnc: int | None = key(
        None,
        "Logical-to-physical NeuronCore ratio (1 or 2).",
        by="nxd-precision",
        status=Status.NEURON_ONLY,
        note="sets NEURON_LOGICAL_NC_CONFIG on Neuron devices",
        ge=1,
        le=2,
    )
    sequential_move_factor: int = key(
        11,
        "Ranks that initialise and move weights to the device at the same time.",
        by="nxd-parallel",
        note="each rank initialises the modules it holds one at a time on the host and keeps its shards; "
        "this many ranks do it at once",
        ge=1,
    )
