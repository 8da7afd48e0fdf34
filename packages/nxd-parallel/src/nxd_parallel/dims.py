"""Parallel degrees, validated against the world size, and the one named device mesh built from them."""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from .errors import ParallelConfigError

MESH_ORDER = ("pp", "dp", "cp", "tp")
"""Mesh dimensions outermost first: tp innermost, so a tensor-parallel group is consecutive ranks."""
EXPERT_MESH_ORDER = ("pp", "edp", "ep", "cp", "tp")
"""With expert parallelism dp splits into edp x ep: an expert-parallel group is ep consecutive
data-parallel ranks, and edp ranks hold the same experts (they reduce the experts' gradients)."""


@dataclass(frozen=True)
class ParallelDims:
    """tp * pp * cp * dp == world_size; dp is derived; ep (expert parallel) divides dp."""

    world_size: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        problems = [
            f"{name}: expected a positive integer, found {value}"
            for name, value in (
                ("world_size", self.world_size),
                ("tp", self.tp),
                ("pp", self.pp),
                ("cp", self.cp),
                ("ep", self.ep),
            )
            if value < 1
        ]
        model_parallel = self.tp * self.pp * self.cp
        if not problems and self.world_size % model_parallel:
            problems.append(
                f"tp * pp * cp = {self.tp} * {self.pp} * {self.cp} = {model_parallel}: expected a divisor "
                f"of the world size {self.world_size}"
            )
        elif not problems and self.dp % self.ep:
            problems.append(f"ep = {self.ep}: expected a divisor of the data-parallel size {self.dp}")
        if problems:
            raise ParallelConfigError(*problems)

    @property
    def dp(self) -> int:
        return self.world_size // (self.tp * self.pp * self.cp)

    def sizes(self) -> dict[str, int]:
        if self.ep > 1:
            return {"pp": self.pp, "edp": self.dp // self.ep, "ep": self.ep, "cp": self.cp, "tp": self.tp}
        return {"pp": self.pp, "dp": self.dp, "cp": self.cp, "tp": self.tp}

    def build_mesh(self, device_type: str) -> ParallelMesh:
        """The mesh over the default process group. Only dimensions larger than one get a mesh dimension
        (and process groups); `dp` is the flattened edp x ep view and `dp_cp` the data x context one
        where they have two parts."""
        sizes = self.sizes()
        names = tuple(name for name in (EXPERT_MESH_ORDER if self.ep > 1 else MESH_ORDER) if sizes[name] > 1)
        if not names:
            return ParallelMesh(self, None)
        mesh = init_device_mesh(device_type, tuple(sizes[name] for name in names), mesh_dim_names=names)
        data = tuple(name for name in ("edp", "ep") if name in names)
        if len(data) == 2:
            mesh[data]._flatten("dp")
        data = tuple(name for name in ("dp", "edp", "ep", "cp") if name in names)
        if len(data) >= 2 and "cp" in data:
            mesh[data]._flatten("dp_cp")
        return ParallelMesh(self, mesh)


@dataclass(frozen=True)
class ParallelMesh:
    """The device mesh with accessors that answer None (and cost nothing) for a size-1 dimension."""

    dims: ParallelDims
    mesh: DeviceMesh | None

    def get(self, name: str) -> DeviceMesh | None:
        """The 1-D sub-mesh `pp`, `dp`, `cp`, `tp`, `dp_cp` (data loading and loss reduction), `ep` (expert
        parallel) or `edp` (ranks holding the same experts), or None."""
        if self.mesh is None:
            return None
        present = self.mesh.mesh_dim_names or ()
        if name == "dp_cp" and "cp" not in present:
            name = "dp"
        parts = {"dp": ("dp", "edp", "ep"), "dp_cp": ("dp", "edp", "ep", "cp")}.get(name, (name,))
        held = [part for part in parts if part in present]
        if len(held) > 1:  # flattened when the mesh was built
            return self.mesh[name]
        return self.mesh[held[0]] if held else None

    def experts(self) -> DeviceMesh | None:
        """The mesh an expert's weights are split over: ep (experts), tp (each expert's ffn), both or None."""
        if self.mesh is None:
            return None
        held = tuple(name for name in ("ep", "tp") if name in (self.mesh.mesh_dim_names or ()))
        return self.mesh[held] if held else None

    def rank(self, name: str) -> int:
        """This process's coordinate along `name` (0 for a size-1 dimension)."""
        sub = self.get(name)
        return 0 if sub is None else sub.get_local_rank()

    @property
    def data_parallel_rank(self) -> int:
        return self.rank("dp")
