"""Parallel degrees, validated against the world size, and the one named device mesh built from them."""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from .errors import ParallelConfigError

MESH_ORDER = ("pp", "dp", "cp", "tp")
"""Mesh dimensions outermost first: tp innermost, so a tensor-parallel group is consecutive ranks."""


@dataclass(frozen=True)
class ParallelDims:
    """tp * pp * cp * dp == world_size; dp is derived."""

    world_size: int
    tp: int = 1
    pp: int = 1
    cp: int = 1

    def __post_init__(self) -> None:
        problems = [f"{name}: expected a positive integer, found {value}"
                    for name, value in (("world_size", self.world_size), ("tp", self.tp), ("pp", self.pp),
                                        ("cp", self.cp)) if value < 1]  # fmt: skip
        model_parallel = self.tp * self.pp * self.cp
        if not problems and self.world_size % model_parallel:
            problems.append(f"tp * pp * cp = {self.tp} * {self.pp} * {self.cp} = {model_parallel}: expected a divisor "
                            f"of the world size {self.world_size}")  # fmt: skip
        if problems:
            raise ParallelConfigError(*problems)

    @property
    def dp(self) -> int:
        return self.world_size // (self.tp * self.pp * self.cp)

    def sizes(self) -> dict[str, int]:
        return {"pp": self.pp, "dp": self.dp, "cp": self.cp, "tp": self.tp}

    def build_mesh(self, device_type: str) -> ParallelMesh:
        """The mesh over the default process group. Only dimensions larger than one get a mesh dimension
        (and process groups); `dp_cp` is the flattened data x context view when both exist."""
        names = tuple(name for name in MESH_ORDER if self.sizes()[name] > 1)
        if not names:
            return ParallelMesh(self, None)
        mesh = init_device_mesh(device_type, tuple(self.sizes()[name] for name in names), mesh_dim_names=names)
        if "dp" in names and "cp" in names:
            mesh["dp", "cp"]._flatten("dp_cp")
        return ParallelMesh(self, mesh)


@dataclass(frozen=True)
class ParallelMesh:
    """The device mesh with accessors that answer None (and cost nothing) for a size-1 dimension."""

    dims: ParallelDims
    mesh: DeviceMesh | None

    def get(self, name: str) -> DeviceMesh | None:
        """The 1-D sub-mesh `pp`, `dp`, `cp`, `tp` or `dp_cp` (data loading and loss reduction), or None."""
        if self.mesh is None:
            return None
        present = self.mesh.mesh_dim_names or ()
        if name == "dp_cp":
            both = [part for part in ("dp", "cp") if part in present]
            return self.mesh["dp_cp"] if len(both) == 2 else (self.mesh[both[0]] if both else None)
        return self.mesh[name] if name in present else None

    def rank(self, name: str) -> int:
        """This process's coordinate along `name` (0 for a size-1 dimension)."""
        sub = self.get(name)
        return 0 if sub is None else sub.get_local_rank()

    @property
    def data_parallel_rank(self) -> int:
        return self.rank("dp")
