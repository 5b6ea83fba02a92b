"""Logical axis → mesh axis rules, and the shardings of train state and batches.

One rules table serves every parallelism: an axis of size 1 shards nothing, so pure data
parallelism, FSDP, tensor parallelism and their combinations differ only in mesh sizes.
Rules are tried in order and a mesh axis is used at most once per array, so an activation
[batch, length, embed] gets its batch split over (data, fsdp) and keeps embed whole, while
a parameter [vocab, embed] gets vocab over tensor and embed over fsdp.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from attnmt.common import TOKEN_KEYS, axes
from attnmt.parallel.mesh import BATCH_AXES, FSDP, TENSOR

LOGICAL_RULES: tuple[tuple[str, Any], ...] = (
    (axes.BATCH, BATCH_AXES),
    (axes.VOCAB, TENSOR),
    (axes.HEADS, TENSOR),
    (axes.MLP, TENSOR),
    (axes.EMBED, FSDP),
    (axes.LENGTH, None),
    (axes.KV_LENGTH, None),
    (axes.KV, None),
    (axes.LAYERS, None),  # every device holds all layers of its shard
)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """[batch, length] arrays: rows split over data × fsdp, positions whole."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, None))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def logical_shardings(boxed_tree: Any, mesh: Mesh) -> Any:
    """NamedShardings for a tree whose leaves may be flax LogicallyPartitioned boxes;
    unannotated leaves (step counters, RNG keys) are replicated."""
    specs = nn.get_partition_spec(boxed_tree)
    return nn.logical_to_mesh_sharding(specs, mesh, LOGICAL_RULES)


def bytes_per_device(tree: Any) -> dict[int, int]:
    """Bytes of the tree's arrays held by each device (from the arrays' shards)."""
    held: dict[int, int] = {}
    for leaf in jax.tree_util.tree_leaves(tree):
        for shard in leaf.addressable_shards:
            held[shard.device.id] = held.get(shard.device.id, 0) + shard.data.nbytes
    return held


def put_batch(batch: dict[str, Any], mesh: Mesh) -> dict[str, jax.Array]:
    """This process's rows of the global batch → global arrays split over data × fsdp."""
    sharding = batch_sharding(mesh)
    return {
        name: jax.make_array_from_process_local_data(sharding, value)
        for name, value in batch.items()
    }


class RuledJit:
    """jax.jit with explicit shardings, traced under the mesh and the logical rules so the
    model's activation annotations become sharding constraints. Callable, and `lower()`
    works as on a jitted function (the memory pre-flight compiles through it)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        mesh: Mesh,
        *,
        in_shardings: Any,
        out_shardings: Any,
        donate_argnums: tuple[int, ...] = (),
        compiler_options: dict[str, Any] | None = None,
    ) -> None:
        self.mesh = mesh
        self._compiled: dict[Any, Any] = {}
        self._jitted = jax.jit(
            fn,
            in_shardings=in_shardings,
            out_shardings=out_shardings,
            donate_argnums=donate_argnums,
            compiler_options=compiler_options,
        )

    def __call__(self, *args: Any) -> Any:
        if self._compiled:
            signature = _signature(args)
            compiled = self._compiled.get(signature)
            if compiled is not None:
                try:
                    return compiled(*args)
                except (TypeError, ValueError):
                    # An argument placed otherwise than compiled for (jit would move it):
                    # let jit handle this signature from now on.
                    del self._compiled[signature]
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(LOGICAL_RULES):
            return self._jitted(*args)

    def lower(self, *args: Any) -> Any:
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(LOGICAL_RULES):
            return self._jitted.lower(*args)

    def compile(self, *args: Any) -> Any:
        """Compiles for these (abstract or concrete) arguments and keeps the executable: a
        later call with arguments of the same structure, shapes and dtypes runs it instead
        of compiling again (jax.jit does not reuse an ahead-of-time compile by itself)."""
        compiled = self.lower(*args).compile()
        self._compiled[_signature(args)] = compiled
        return compiled


def _signature(args: Any) -> Any:
    leaves, treedef = jax.tree_util.tree_flatten(args)
    return treedef, tuple((tuple(leaf.shape), str(leaf.dtype)) for leaf in leaves)


def jit_with_rules(
    fn: Callable[..., Any],
    mesh: Mesh,
    *,
    in_shardings: Any,
    out_shardings: Any,
    donate_argnums: tuple[int, ...] = (),
    compiler_options: dict[str, Any] | None = None,
) -> RuledJit:
    return RuledJit(
        fn,
        mesh,
        in_shardings=in_shardings,
        out_shardings=out_shardings,
        donate_argnums=donate_argnums,
        compiler_options=compiler_options,
    )


def batch_shardings(mesh: Mesh, keys: tuple[str, ...] = TOKEN_KEYS) -> dict[str, NamedSharding]:
    """The shardings of a training batch dict (rows over the data axes)."""
    return {name: batch_sharding(mesh) for name in keys}


def abstract_with_shardings(boxed_abstract: Any, mesh: Mesh) -> Any:
    """eval_shape output with logical boxes → unboxed ShapeDtypeStructs carrying shardings."""
    shardings = nn.meta.unbox(logical_shardings(boxed_abstract, mesh))
    return jax.tree_util.tree_map(
        lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
        nn.meta.unbox(boxed_abstract),
        shardings,
    )
