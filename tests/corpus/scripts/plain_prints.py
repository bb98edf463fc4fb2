"""Plain prints of a tiny real training loop, in the shapes people write by hand.

    python plain_prints.py [--style epoch-steps|json|keyvalue]

``epoch-steps``: ``epoch 2 step 10 loss=0.52 acc=0.9`` (steps restart every epoch);
``json``: ``{"step": 1, "loss": 1.0, "lr": 0.05}``; ``keyvalue``: ``loss=0.52`` alone.
"""

import json
import sys

import torch

import _truth


def main() -> None:
    style = sys.argv[sys.argv.index("--style") + 1] if "--style" in sys.argv else "epoch-steps"
    torch.manual_seed(0)
    xs = torch.randn(40, 4)
    ys = xs.sum(1, keepdim=True)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    records = []
    global_step = 0
    for epoch in range(3):
        for step in range(5):
            batch = slice(step * 8, step * 8 + 8)
            optimizer.zero_grad()
            out = model(xs[batch])
            loss = torch.nn.functional.mse_loss(out, ys[batch])
            loss.backward()
            optimizer.step()
            acc = float(((out - ys[batch]).abs() < 0.5).float().mean())
            value = round(loss.item(), 6)
            if style == "epoch-steps":
                print(f"epoch {epoch} step {step} loss={value} acc={acc:.3f}", flush=True)
                records.append({"epoch": epoch, "step": step, "loss": value, "acc": round(acc, 3)})
            elif style == "json":
                print(json.dumps({"step": global_step, "loss": value, "lr": 0.05}), flush=True)
                records.append({"step": global_step, "loss": value, "lr": 0.05})
            else:
                print(f"loss={value}", flush=True)
                records.append({"loss": value})
            global_step += 1
        print(f"epoch {epoch} done", flush=True)
    _truth.save(records)


if __name__ == "__main__":
    main()
