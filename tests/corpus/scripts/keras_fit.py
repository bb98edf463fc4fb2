"""A tiny real Keras 3 run on the torch backend (KERAS_BACKEND=torch).

Keras prints ``Epoch 1/2`` and then its progress bar ``4/4 ━━━━ 0s 5ms/step - loss: …``. The
truth is what Keras passed to callbacks at each batch (the running mean its bar shows).
"""

import os

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import _truth  # noqa: E402


class Truth(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.records, self.epoch = [], 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch + 1  # as Keras prints it: "Epoch 1/2"

    def on_train_batch_end(self, batch, logs=None):
        self.records.append(
            {"epoch": self.epoch, "step": batch + 1, "loss": float(logs["loss"]), "mae": float(logs["mae"])}
        )


def main() -> None:
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    truth = Truth()
    model.fit(x, y, epochs=2, batch_size=8, verbose=1, callbacks=[truth])
    _truth.save(truth.records)


if __name__ == "__main__":
    main()
