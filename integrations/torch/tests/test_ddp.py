"""PyTorch's own DistributedDataParallel over backend "braid", against the
same training over Gloo in the same processes: a small MLP whose initial
weights differ per rank (DDP's first broadcast must fix that), several
gradient buckets, 10 SGD steps on per-rank data. At 2 ranks the parameters
must equal Gloo's bit for bit (a sum of two values has one rounding either
way); at more ranks they match within a float32 tolerance. Again with
find_unused_parameters=True and with a no_sync() accumulation step.

    /usr/bin/python3 test_ddp.py NRANKS
"""
from harness import check, main, ranks_from_argv


def make_model(rank, unused_branch):
    import torch

    torch.manual_seed(100 + rank)  # rank-dependent: DDP broadcasts rank 0's

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(
                torch.nn.Linear(32, 256), torch.nn.ReLU(),
                torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                torch.nn.Linear(1024, 512), torch.nn.ReLU(),  # 3.2 MB in all: more than
                torch.nn.Linear(512, 8))  # DDP's first bucket (1 MB) takes
            self.unused = torch.nn.Linear(32, 8) if unused_branch else None

        def forward(self, x):
            return self.body(x)

    return Net()


def train(rank, group, unused_branch, accumulate):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(make_model(rank, unused_branch), process_group=group, bucket_cap_mb=0.005,
                find_unused_parameters=unused_branch)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(7 + rank)
    for step in range(10):
        x = torch.randn(16, 32, generator=data)
        y = torch.randn(16, 8, generator=data)
        opt.zero_grad()
        if accumulate and step % 2 == 0:
            with model.no_sync():  # gradients accumulate locally, synced next step
                torch.nn.functional.mse_loss(model(x), y).backward()
            x = torch.randn(16, 32, generator=data)
            y = torch.randn(16, 8, generator=data)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    logged = model._get_ddp_logging_data()
    buckets = logged.get("rebuilt_bucket_sizes") or logged.get("bucket_sizes", "")
    check(buckets.count(",") >= 1, f"expected several gradient buckets, got sizes [{buckets}]")
    return [p.detach().clone() for p in model.parameters()]


def test_ddp(rank, size, gloo):
    import torch
    import torch.distributed as dist

    for unused_branch, accumulate in ((False, False), (True, False), (False, True)):
        what = f"find_unused_parameters={unused_branch}, no_sync={accumulate}"
        ours = train(rank, dist.group.WORLD, unused_branch, accumulate)
        theirs = train(rank, gloo, unused_branch, accumulate)
        start = [p.detach() for p in make_model(0, unused_branch).parameters()]
        check(any(not torch.equal(a, b) for a, b in zip(ours, start)), f"{what}: training changed nothing")
        for i, (a, b) in enumerate(zip(ours, theirs)):
            if size == 2:
                check(torch.equal(a, b), f"{what}: parameter {i} differs from Gloo's: max |d| = {(a - b).abs().max()}")
            else:
                check(torch.allclose(a, b, rtol=1e-5, atol=1e-6),
                      f"{what}: parameter {i} differs from Gloo's: max |d| = {(a - b).abs().max()}")
        # Every rank holds the same parameters.
        flat = torch.cat([p.reshape(-1) for p in ours])
        everyone = [torch.empty_like(flat) for _ in range(size)]
        dist.all_gather(everyone, flat)
        check(all(torch.equal(everyone[0], e) for e in everyone), f"{what}: ranks disagree")


if __name__ == "__main__":
    main(test_ddp, ranks_from_argv(), timeout_s=120)
