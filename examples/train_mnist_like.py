"""Data-parallel training of a small convolutional classifier with fastring.torch, written the
way Horovod users write it: only the import line differs from a horovod.torch script.

The data are synthetic and MNIST-like (28x28 images of 10 classes), generated here from a
fixed seed, so nothing is downloaded. Each rank trains on its shard (DistributedSampler), the
learning rate is scaled by the number of ranks, gradients are averaged by
DistributedOptimizer, and metrics are averaged with allreduce. At the end every rank checks
that its model and optimizer state are bitwise identical to rank 0's (exit status 1 if not).

Run:
    fastring-run -np 2 python examples/train_mnist_like.py
"""
from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import fastring.torch as hvd


class Net(nn.Module):
    """The classic MNIST network of the Horovod and PyTorch examples (~21k parameters)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def make_dataset(n: int, seed: int, noise: float = 1.5) -> TensorDataset:
    """`n` noisy, randomly shifted copies of 10 smooth class templates (1x28x28, float32).

    Every rank builds the same dataset from the same seed (templates come from seed 0, so the
    train and test sets share their classes); the sampler picks each rank's shard.
    """
    templates = torch.randn(10, 1, 32, 32, generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        templates = F.avg_pool2d(templates, 5, stride=1, padding=2, count_include_pad=False)
    templates = (templates - templates.mean()) / templates.std()
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    dy, dx = torch.randint(0, 5, (2, n), generator=g)
    rows = (dy[:, None] + torch.arange(28))[:, :, None]
    cols = (dx[:, None] + torch.arange(28))[:, None, :]
    images = templates[labels, 0][torch.arange(n)[:, None, None], rows, cols]
    images = images + noise * torch.randn(n, 28, 28, generator=g)
    return TensorDataset(images.unsqueeze(1), labels)


def metric_average(value: float, name: str) -> float:
    return hvd.allreduce(torch.tensor(value), name=name).item()


def train(model, optimizer, loader, sampler, epoch: int) -> tuple[float, float]:
    model.train()
    sampler.set_epoch(epoch)
    total_loss, correct, seen = 0.0, 0, 0
    for data, target in loader:
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        total_loss += loss.item() * len(data)
        correct += int((output.argmax(1) == target).sum())
        seen += len(data)
    return (metric_average(total_loss / seen, "train_loss"),
            metric_average(correct / seen, "train_accuracy"))


def evaluate(model, loader) -> tuple[float, float]:
    model.eval()
    total_loss, correct, seen = 0.0, 0, 0
    with torch.no_grad():
        for data, target in loader:
            output = model(data)
            total_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += int((output.argmax(1) == target).sum())
            seen += len(data)
    return metric_average(total_loss / seen, "test_loss"), metric_average(correct / seen, "test_accuracy")


def replicas_identical(model, optimizer) -> bool:
    """Whether every rank holds rank 0's parameters and optimizer state, bit for bit."""
    tensors = [p.detach().reshape(-1) for p in model.state_dict().values()]
    tensors += [v.reshape(-1).to(torch.float32) for state in optimizer.state.values()
                for v in state.values() if torch.is_tensor(v)]
    mine = torch.cat(tensors)
    root = hvd.broadcast(mine, root_rank=0, name="replica_check")
    same = torch.tensor(int(torch.equal(mine, root)))
    return bool(hvd.allreduce(same, op=hvd.Min, name="replica_check.ok"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fastring.torch MNIST-like example")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--train-size", type=int, default=6000)
    parser.add_argument("--test-size", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=0.01, help="per rank; scaled by the number of ranks")
    parser.add_argument("--momentum", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--fp16-allreduce", action="store_true", help="send gradients as float16")
    args = parser.parse_args(argv)

    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # one rank per core

    train_set = make_dataset(args.train_size, seed=args.seed)
    test_set = make_dataset(args.test_size, seed=args.seed + 1)
    train_sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank())
    test_sampler = DistributedSampler(test_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_loader = DataLoader(test_set, batch_size=args.batch_size, sampler=test_sampler)

    model = Net()
    optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)

    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        train_loss, train_acc = train(model, optimizer, train_loader, train_sampler, epoch)
        test_loss, test_acc = evaluate(model, test_loader)
        if hvd.rank() == 0:
            print(f"epoch {epoch}: train loss {train_loss:.4f} accuracy {100 * train_acc:.1f}% | "
                  f"test loss {test_loss:.4f} accuracy {100 * test_acc:.1f}% | "
                  f"{time.perf_counter() - start:.1f} s on {hvd.size()} ranks", flush=True)

    if not replicas_identical(model, optimizer):
        print(f"rank {hvd.rank()}: the replicas differ after training", file=sys.stderr, flush=True)
        return 1
    if hvd.rank() == 0:
        print(f"replicas identical on all {hvd.size()} ranks", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
