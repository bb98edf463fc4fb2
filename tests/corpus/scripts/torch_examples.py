"""The log lines of the PyTorch examples that people run with torchrun, from a tiny real
training: mnist's ``Train Epoch: 1 [640/60000 (1%)]\tLoss: 2.3``, imagenet's ProgressMeter
``Epoch: [0][ 3/8]\tTime … Loss 6.9e+00 (6.9e+00)\tAcc@1 …``, and the DDP tutorial's banner.

    python torch_examples.py [--style mnist|imagenet]
"""

import os
import sys

import torch

import _truth


class AverageMeter:
    def __init__(self, name: str, fmt: str = ":f"):
        self.name, self.fmt, self.val, self.sum, self.count = name, fmt, 0.0, 0.0, 0

    def update(self, val: float, n: int = 1) -> None:
        self.val, self.sum, self.count = val, self.sum + val * n, self.count + n

    def __str__(self) -> str:
        return ("{name} {val" + self.fmt + "} ({avg" + self.fmt + "})").format(
            name=self.name, val=self.val, avg=self.sum / self.count
        )


def main() -> None:
    style = sys.argv[sys.argv.index("--style") + 1] if "--style" in sys.argv else "mnist"
    rank = int(os.environ.get("RANK", "0"))
    torch.manual_seed(0)
    xs = torch.randn(64, 4)
    ys = xs.sum(1, keepdim=True)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=8)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    print(f"[GPU{rank}] Epoch 0 | Batchsize: 8 | Steps: {len(loader)}", flush=True)
    records = []
    for epoch in range(1, 3):
        losses, top1 = AverageMeter("Loss", ":.4e"), AverageMeter("Acc@1", ":6.2f")
        for batch_idx, (data, target) in enumerate(loader):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(data), target)
            loss.backward()
            optimizer.step()
            if style == "mnist" and batch_idx % 2 == 0:
                print(
                    "Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}".format(
                        epoch, batch_idx * len(data), len(loader.dataset), 100.0 * batch_idx / len(loader), loss.item()
                    ),
                    flush=True,
                )
                records.append({"epoch": epoch, "step": batch_idx * len(data), "loss": loss.item()})
            elif style == "imagenet":
                losses.update(loss.item(), data.size(0))
                top1.update(50.0, data.size(0))
                print(
                    "\t".join([f"Epoch: [{epoch}][{batch_idx:1d}/{len(loader)}]", str(losses), str(top1)]), flush=True
                )
                records.append({"epoch": epoch, "step": batch_idx, "loss": float(f"{loss.item():.4e}")})
    _truth.save(records)


if __name__ == "__main__":
    main()
