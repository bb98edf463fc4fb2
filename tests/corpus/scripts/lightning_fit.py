"""A tiny real PyTorch Lightning run.

    python lightning_fit.py [--bar rich|tqdm]

With rich installed (rpcctl depends on it) Lightning picks its Rich progress bar; ``tqdm`` is
what it draws when rich is missing. The truth is what the module logged at each batch.
"""

import sys

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import RichProgressBar, TQDMProgressBar

import _truth


class TinyModule(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Truth(pl.Callback):
    def __init__(self):
        self.records = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.records.append({"epoch": trainer.current_epoch, "step": batch_idx + 1, "loss": float(outputs["loss"])})


def main() -> None:
    torch.manual_seed(0)
    xs = torch.randn(16, 4)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, xs.sum(1)), batch_size=4)
    bar = sys.argv[sys.argv.index("--bar") + 1] if "--bar" in sys.argv else "rich"
    truth = Truth()
    trainer = pl.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        callbacks=[RichProgressBar() if bar == "rich" else TQDMProgressBar(), truth],
    )
    trainer.fit(TinyModule(), loader)
    _truth.save(truth.records)


if __name__ == "__main__":
    main()
