"""A tiny real Hugging Face Trainer run (a plain nn.Module, no hub download).

    python hf_trainer.py [--no-tqdm]

Trainer prints each log as a Python dict (transformers 5 quotes the numbers); with tqdm on,
between the redraws of its progress bar. The truth is ``trainer.state.log_history``.
"""

import sys

import torch
from transformers import Trainer, TrainingArguments

import _truth


class TinyRegressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x, labels=None):
        out = self.linear(x).squeeze(-1)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


def main() -> None:
    torch.manual_seed(0)
    xs = torch.randn(32, 4)
    data = [{"x": x, "labels": x.sum()} for x in xs]
    args = TrainingArguments(
        output_dir="hf-out",
        max_steps=8,
        logging_steps=1,
        per_device_train_batch_size=4,
        learning_rate=0.05,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm="--no-tqdm" in sys.argv,
        seed=0,
    )
    trainer = Trainer(model=TinyRegressor(), args=args, train_dataset=data)
    trainer.train()
    _truth.save(
        [
            {"step": h["step"], "epoch": h.get("epoch"), "loss": h["loss"]}
            for h in trainer.state.log_history
            if "loss" in h
        ]
    )


if __name__ == "__main__":
    main()
