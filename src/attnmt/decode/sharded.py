"""Data-parallel decoding: a batch's sentences split over the mesh's data axes (data ×
fsdp) on every device of every process, the parameters replicated on each device.

Sentences do not interact while they are decoded, so each device runs the one-device
search on its own rows (`jax.shard_map`): nothing crosses devices inside the search, and a
device whose rows have all finished leaves its while-loop without waiting for the others.
Only the finished token ids (and scores) are gathered, once per batch, to every process.

Every process holds the whole batch (each reads all the input lines: host work, cheap next
to decoding), so all of them make the same batches in the same order, which the
collectives need; each then places only the rows of its own devices (`put_rows`). A
mesh's tensor axis, if it has one, holds copies of the same rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from attnmt.config.parallel import ParallelConfig
from attnmt.parallel.mesh import BATCH_AXES, DATA, FSDP, make_mesh

ROWS = PartitionSpec(BATCH_AXES)  # axis 0 split over data × fsdp, any further axes whole
REPLICATED = PartitionSpec()


def decode_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Every device (of every process; or `devices`) on the data axis."""
    return make_mesh(ParallelConfig(data=-1, fsdp=1, tensor=1), devices)


def row_shards(mesh: Mesh) -> int:
    """How many parts a batch's rows are split into: data × fsdp."""
    return mesh.shape[DATA] * mesh.shape[FSDP]


def padded_rows(rows: int, mesh: Mesh) -> int:
    """`rows` rounded up to a multiple of the row shards (the rest are filler rows)."""
    shards = row_shards(mesh)
    return math.ceil(rows / shards) * shards


def data_parallel(
    fn: Callable[..., Any],
    mesh: Mesh,
    row_arguments: int,
    compiler_options: dict[str, Any] | None = None,
) -> Callable[..., Any]:
    """`fn(params, *row_arrays)` jitted so that each device runs it on its own rows.

    `params` (any pytree) is replicated; the `row_arguments` others are pytrees of arrays
    (or None) whose axis 0 is the batch, as is every output. Compiled once per shape.
    """

    def sharded(params: Any, *row_arrays: Any) -> Any:
        # No collective runs inside, so the per-device values need no replication check
        # (which the search's while-loops, carrying one device's rows, would not pass).
        return jax.shard_map(
            fn,
            mesh=mesh,
            in_specs=(REPLICATED, *[ROWS] * row_arguments),
            out_specs=ROWS,
            check_vma=False,
        )(params, *row_arrays)

    rows = NamedSharding(mesh, ROWS)
    return jax.jit(
        sharded,
        in_shardings=(NamedSharding(mesh, REPLICATED), *[rows] * row_arguments),
        out_shardings=rows,
        compiler_options=compiler_options,
    )


def put_rows(tree: Any, mesh: Mesh) -> Any:
    """Host arrays of a whole batch (the same on every process) → global arrays whose rows
    are split over the mesh's data axes; each process places only its own devices' rows."""
    sharding = NamedSharding(mesh, ROWS)

    def put(host: np.ndarray) -> jax.Array:
        host = np.asarray(host)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree.map(put, tree)


def gather_rows(tree: Any) -> Any:
    """Global arrays split over rows → the whole arrays in NumPy, on every process, rows in
    their order (one all-gather per array with several processes)."""
    return jax.tree.map(lambda array: multihost_utils.process_allgather(array, tiled=True), tree)


def replicate(tree: Any, mesh: Mesh) -> Any:
    """A copy of every array of `tree` on every device of `mesh`.

    Leaves may be NumPy arrays, arrays on one device of this process (a checkpoint loaded
    for inference) or arrays sharded over a training mesh of this or every process (FSDP,
    tensor parallel: gathered whole first, a collective every process takes part in).
    """
    target = NamedSharding(mesh, REPLICATED)
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    split = [
        i
        for i, leaf in enumerate(leaves)
        if isinstance(leaf, jax.Array)
        and not leaf.is_fully_replicated
        and isinstance(leaf.sharding, NamedSharding)
    ]
    if split:
        whole = jax.jit(
            lambda arrays: arrays,
            out_shardings=[leaves[i].sharding.update(spec=REPLICATED) for i in split],
        )([leaves[i] for i in split])
        for i, array in zip(split, whole, strict=True):
            leaves[i] = array
    return treedef.unflatten([_copied(leaf, target) for leaf in leaves])


def _copied(leaf: Any, target: NamedSharding) -> jax.Array:
    """`leaf` (whole on each device that holds it, or a host array) on every device of
    `target`'s mesh."""
    if isinstance(leaf, jax.Array):
        if leaf.sharding == target:
            return leaf
        if not leaf.is_fully_replicated:  # another kind of sharding: through the host
            leaf = multihost_utils.process_allgather(leaf, tiled=True)
        else:
            leaf = leaf.addressable_data(0)
    devices = sorted(target.addressable_devices, key=lambda device: device.id)
    copies = [jax.device_put(leaf, device) for device in devices]
    return jax.make_array_from_single_device_arrays(np.shape(leaf), target, copies)


def join_job() -> int:
    """Joins the multi-process job the environment describes (as `attnmt train` does), so
    that decoding uses every device of every process; returns the number of processes."""
    from attnmt.parallel.distributed import initialize

    if not jax.distributed.is_initialized():  # `evaluate` of a parsing run comes twice
        initialize()
    return jax.process_count()


def writes_outputs() -> bool:
    """Whether this process writes the decodes' files and prints (process 0 does; the
    others decode their rows and write nothing)."""
    return jax.process_index() == 0
