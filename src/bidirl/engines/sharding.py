"""The primary trainer's ranks sharded with FSDP2 (``trainer.strategy=fsdp2``), and the
optimizer's files in a checkpoint, sharded or not.

What is sharded, and why not more: the model is wrapped with ``fully_shard`` per decoder
layer and at the root, so every parameter the optimizer sees is a ``DTensor`` holding this
rank's rows (``Shard(0)``): the fp32 master weights, their gradients and AdamW's two
moments live once over the ranks.  Between steps every FSDP module is kept *gathered*
(``unshard``; ``reshard_after_forward=False``, gradient sync and reshard after backward
off), and FSDP then runs forwards and backwards with no collective at all.  That is what
the rest of bidirl needs of a primary rank:

* the driver sends each rank its micro-batches one call at a time and lets auxiliaries
  steal from a rank's tail, so ranks run different numbers of passes (a collective per
  layer would deadlock them), and each call returns one micro-batch's own gradient;
* rank 0 alone is asked for the weights a replica or an auxiliary loads, and for the
  model directory a checkpoint or ``export`` writes: it holds them whole.

The ranks meet only in ``apply_grads``: each rank folds the micro-batches it merges, the
folds are reduce-scattered with SUM (every loss is already divided by the step's global
totals, so SUM is the right reduction; FSDP's own averaging never runs), AdamW steps the
shards, and the updated shards are all-gathered back (``regather``).  What this saves per
rank is the optimizer's share, ``(4 + 8) P (1 - 1/ranks)`` bytes of ``P`` fp32 parameters;
the gathered weights and one micro-batch's gradient stay whole (``planner/memory.py:
trainer_state_bytes``).

The optimizer's state in a checkpoint: ``optimizer.pt`` (a full copy, ``ddp``) or one
``optimizer.shard-<r>-of-<n>.pt`` per rank (``fsdp2``, each rank its rows, written without
a collective).  Either loads into either strategy and any rank count: the rows are
concatenated, then each rank takes its own.  This module imports torch only inside its
functions, so ``runtime/checkpoints.py`` can name the files.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

__all__ = ["ShardedModel", "load_optimizer", "optimizer_files", "save_optimizer"]

_SHARD = re.compile(r"optimizer\.shard-(\d+)-of-(\d+)\.pt")


def optimizer_files(trainer_dir: Path) -> tuple[list[Path], str | None]:
    """(the optimizer's files in rank order, why they are not a whole set or None)."""
    full = trainer_dir / "optimizer.pt"
    if full.is_file():
        return [full], None
    found = {}
    for f in trainer_dir.glob("optimizer.shard-*-of-*.pt"):
        m = _SHARD.fullmatch(f.name)
        if m:
            found[(int(m[1]), int(m[2]))] = f
    counts = {n for _, n in found}
    if not found:
        return [], "trainer/optimizer.pt missing"
    n = max(counts)
    missing = [r for r in range(n) if (r, n) not in found]
    if len(counts) > 1 or missing:
        return [], f"trainer/optimizer.shard-*-of-{n}.pt: shards {missing or sorted(found)} missing or mixed"
    return [found[(r, n)] for r in range(n)], None


def _rows(n: int, rank: int, world: int) -> tuple[int, int]:
    """The rows ``[a, b)`` of ``n`` that rank ``rank`` holds: FSDP2's ``Shard(0)`` is
    ``torch.chunk`` along dim 0 (chunks of ``ceil(n / world)``; the last ranks may hold none)."""
    c = -(-n // world)
    return min(n, rank * c), min(n, (rank + 1) * c)


class ShardedModel:
    """An HF model under ``fully_shard``, kept gathered between steps (the module docstring)."""

    def __init__(self, model, process_group, device: str = "cpu") -> None:
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import FSDPModule, fully_shard

        self.model, self.group = model, process_group
        self.rank, self.world = dist.get_rank(process_group), dist.get_world_size(process_group)
        self.mesh = DeviceMesh.from_group(process_group, "cuda" if device.startswith("cuda") else "cpu")
        layers = set(getattr(model, "_no_split_modules", None) or [])
        # Innermost first: a layer class nested in another (a vision tower's) is wrapped before it.
        for m in reversed(list(model.modules())):
            if m is not model and type(m).__name__ in layers:
                fully_shard(m, mesh=self.mesh, reshard_after_forward=False)
        fully_shard(model, mesh=self.mesh, reshard_after_forward=False)
        self.modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
        for m in self.modules:
            m.set_requires_gradient_sync(False, recurse=False)  # no reduce-scatter per backward
            m.set_reshard_after_backward(False, recurse=False)
        self.shards = dict(model.named_parameters())
        """Every parameter as this rank's ``DTensor`` rows: what the optimizer steps."""
        self.regather(reshard=False)

    def gathered(self) -> dict[str, Any]:
        """Every parameter whole (plain tensors), by its HF name: what the passes run on."""
        return dict(self.model.named_parameters())

    def regather(self, reshard: bool = True) -> None:
        """All-gather the shards into the whole parameters (a collective: every rank calls it)."""
        for m in self.modules if reshard else ():
            m.reshard()
        for m in self.modules:
            m.unshard()

    def local_rows(self, full):
        """This rank's rows of ``full``, a whole tensor shaped like one of the parameters."""
        a, b = _rows(full.shape[0], self.rank, self.world)
        return full[a:b]

    def set_full(self, weights: dict[str, Any]) -> None:
        """Copy whole tensors into the shards and regather (every rank, same ``weights``)."""
        import torch

        with torch.no_grad():
            for name, sh in self.shards.items():
                sh.to_local().copy_(self.local_rows(weights[name]))
        self.regather()

    def reduce_scatter_grads(self, full: dict[str, Any], names: list[str]) -> None:
        """SUM the ranks' whole gradients ``full`` (one flat collective) and set each trained
        shard's ``.grad`` to its rows of the sum."""
        import torch
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        c = {n: -(-full[n].shape[0] // self.world) for n in names}
        blocks = []
        for r in range(self.world):
            for n in names:
                g = full[n]
                a, b = _rows(g.shape[0], r, self.world)
                row = g[a:b].reshape(b - a, g[:1].numel())
                pad = torch.zeros(c[n] - (b - a), row.shape[1], dtype=g.dtype, device=g.device)
                blocks.append(torch.cat([row, pad]).reshape(-1))
        flat = torch.cat(blocks)
        out = torch.empty(flat.numel() // self.world, dtype=flat.dtype, device=flat.device)
        dist.reduce_scatter_single(out, flat, op=dist.ReduceOp.SUM, group=self.group)
        offset = 0
        for n in names:
            sh, g = self.shards[n], full[n]
            width = g[:1].numel()
            a, b = _rows(g.shape[0], self.rank, self.world)
            local = out[offset : offset + (b - a) * width].view(b - a, *g.shape[1:])
            offset += c[n] * width
            sh.grad = DTensor.from_local(local.clone(), self.mesh, sh.placements, shape=sh.shape,
                                         stride=sh.stride(), run_check=False)


def save_optimizer(optimizer, trainer_dir: Path, sharded: ShardedModel | None) -> None:
    """This rank's optimizer file: ``optimizer.pt`` (whole) or its shard's rows."""
    import torch
    from torch.distributed.tensor import DTensor

    sd = optimizer.state_dict()
    sd["state"] = {i: {k: v.to_local() if isinstance(v, DTensor) else v for k, v in st.items()}
                   for i, st in sd["state"].items()}
    name = "optimizer.pt" if sharded is None else f"optimizer.shard-{sharded.rank}-of-{sharded.world}.pt"
    torch.save(sd, trainer_dir / name)


def load_optimizer(optimizer, trainer_dir: Path, sharded: ShardedModel | None, params: list) -> None:
    """What :func:`save_optimizer` wrote, by any strategy and rank count, into ``optimizer``
    over ``params`` (whole tensors, or ``sharded``'s ``DTensor`` rows)."""
    import torch
    from torch.distributed.tensor import DTensor

    files, problem = optimizer_files(trainer_dir)
    if problem:
        raise FileNotFoundError(f"{trainer_dir}: {problem}")
    parts = [torch.load(f, weights_only=True) for f in files]
    sd = parts[0]
    for i, st in sd["state"].items():
        for k, v in st.items():
            if v.dim() == 0:  # AdamW's step count: the same on every rank
                continue
            whole = torch.cat([p["state"][i][k] for p in parts]) if len(parts) > 1 else v
            p = params[i]
            if sharded is not None:
                a, b = _rows(whole.shape[0], sharded.rank, sharded.world)
                st[k] = DTensor.from_local(whole[a:b].clone(), sharded.mesh, p.placements, shape=p.shape,
                                           stride=p.stride(), run_check=False)
            else:
                st[k] = whole
    optimizer.load_state_dict(sd)
