"""A DDP training loop on backend "braid", for any launcher that sets
torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT):

    braid-run -n 2 python3 train.py
    torchrun --nproc-per-node 2 train.py

Prints each rank's final loss and a checksum of its parameters (the same
on every rank).
"""
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import braid_torch  # noqa: F401  (registers the backend)


def main():
    dist.init_process_group("braid")  # rank and size from the launcher
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)  # DDP makes every rank start from rank 0's weights
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(100 + rank)
    for _ in range(20):
        x = torch.randn(32, 16, generator=data)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
    checksum = sum(float(p.double().sum()) for p in model.parameters())
    line = f"rank {rank}/{size} backend {dist.get_backend()} loss {loss.item():.6f} checksum {checksum:.12e}\n"
    sys.stdout.write(line)  # one write: the ranks share the terminal
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
