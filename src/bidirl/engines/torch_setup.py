"""Process-level torch settings a device worker makes: intra-op threads and the
data-parallel group.

Kept apart from the trainer because the rollout engine's stepping thread and the warm start
set threads too, and neither needs the trainer.
"""

from __future__ import annotations

import torch

__all__ = ["init_process_group", "set_torch_threads"]

_ORIGINAL_SET_NUM_THREADS = torch._C.set_num_threads  # vLLM's CPU worker replaces torch.set_num_threads


def set_torch_threads(n: int) -> None:
    """Set intra-op threads even after vLLM has monkey-patched ``torch.set_num_threads``."""
    _ORIGINAL_SET_NUM_THREADS(int(n))


def init_process_group(
    rank: int, world_size: int, master_addr: str = "127.0.0.1", master_port: int = 29500,
    backend: str | None = None,
):
    """Join a torch.distributed group for data-parallel training (gloo on CPU, NCCL on CUDA)."""
    import torch.distributed as dist

    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(
        backend, init_method=f"tcp://{master_addr}:{master_port}", rank=rank, world_size=world_size
    )
    return dist.group.WORLD
