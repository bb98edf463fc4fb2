"""A tiny real training with the Hugging Face Trainer or Lightning, as a user writes it (no
rpcctl in it): ``library_steps.py hf|lightning TRUTH_FILE``. Both print their losses as the
library does (HF: a dict per log; Lightning: its progress bar). TRUTH_FILE gets what the
library itself recorded: [{"step": global step, "loss": ...}, ...].

hf: 12 batches of 2, gradient_accumulation_steps=2 (6 optimizer steps), logging_steps=2: HF
logs at global steps 2, 4, 6 the mean loss of the steps since the last log (log_history).
lightning: 2 epochs of 6 batches, accumulate_grad_batches=2 (6 optimizer steps),
log_every_n_steps=2: the truth is each logged optimizer step's mean batch loss, at the step Lightning's
own logger (CSVLogger) wrote for it.
"""

import json
import os
import sys

import torch

library, truth_file = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
xs = torch.randn(12, 4)


def hf() -> list[dict]:
    from transformers import Trainer, TrainingArguments

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "corpus", "scripts"))
    from hf_trainer import TinyRegressor  # the loss-parsing corpus's model

    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(truth_file), "hf-out"),
        max_steps=6,
        logging_steps=2,
        gradient_accumulation_steps=2,
        per_device_train_batch_size=2,
        learning_rate=0.05,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(model=TinyRegressor(), args=args, train_dataset=[{"x": x, "labels": x.sum()} for x in xs])
    trainer.train()
    return [{"step": h["step"], "loss": h["loss"]} for h in trainer.state.log_history if "loss" in h]


def lightning() -> list[dict]:
    import pytorch_lightning as pl

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)
            self.losses = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), y)
            self.log("train_loss", loss, prog_bar=True)
            self.losses.append(float(loss))
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    model = Tiny()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, xs.sum(1)), batch_size=2)
    logger = pl.loggers.CSVLogger(os.path.join(os.path.dirname(truth_file), "pl-logs"), name="tiny")
    trainer = pl.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        logger=logger,
        enable_checkpointing=False,
        enable_model_summary=False,
        log_every_n_steps=2,
        accumulate_grad_batches=2,
    )
    trainer.fit(model, loader)
    steps = [model.losses[i : i + 2] for i in range(0, len(model.losses), 2)]  # batches per optimizer step
    logged = [n for n, _ in enumerate(steps, 1) if n % 2 == 0]  # the optimizer steps Lightning logs
    import csv

    with open(os.path.join(logger.log_dir, "metrics.csv")) as f:  # the step Lightning's own logger wrote for each
        written = [int(row["step"]) for row in csv.DictReader(f) if row.get("train_loss")]
    assert len(written) == len(logged), (written, logged)
    return [{"step": step, "loss": sum(steps[n - 1]) / 2} for step, n in zip(written, logged)]


with open(truth_file, "w") as f:
    json.dump(hf() if library == "hf" else lightning(), f)
