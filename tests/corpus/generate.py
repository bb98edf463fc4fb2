"""Regenerate the loss-parsing corpus (tests/data/losses/) from tiny REAL trainings.

    python -m venv /tmp/corpus && /tmp/corpus/bin/pip install -c constraints.txt -e '.[corpus]'
    /tmp/corpus/bin/python tests/corpus/generate.py            # every case
    /tmp/corpus/bin/python tests/corpus/generate.py keras_fit  # one case

Each case runs one script of tests/corpus/scripts/ (Hugging Face Trainer, Lightning with its
Rich and its tqdm bar, Keras 3 on torch, tqdm, the PyTorch examples' formats, plain prints)
with stdout and stderr on one pipe, as ``rpcctl launch`` gives a rank, and saves:

- ``<case>.log``: the bytes exactly as written (``\\r`` redraws included);
- ``<case>.truth.json``: what the library itself recorded (log_history, callbacks), the
  values the parser must find.

``cases.json`` lists the cases with the library versions that produced them.
tests/test_losses_corpus.py parses every saved case, so the tests need none of these libraries.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
DATA = HERE.parent / "data" / "losses"

# case → (script, arguments, the libraries it uses)
CASES: dict[str, tuple[str, list[str], list[str]]] = {
    "hf_trainer_tqdm": ("hf_trainer.py", [], ["transformers", "accelerate", "tqdm"]),
    "hf_trainer_plain": ("hf_trainer.py", ["--no-tqdm"], ["transformers", "accelerate"]),
    "lightning_rich": ("lightning_fit.py", ["--bar", "rich"], ["pytorch-lightning", "rich"]),
    "lightning_tqdm": ("lightning_fit.py", ["--bar", "tqdm"], ["pytorch-lightning", "tqdm"]),
    "keras_fit": ("keras_fit.py", [], ["keras"]),
    "tqdm_stderr": ("tqdm_postfix.py", ["--stream", "stderr"], ["tqdm"]),
    "tqdm_stdout": ("tqdm_postfix.py", ["--stream", "stdout"], ["tqdm"]),
    "torch_mnist": ("torch_examples.py", ["--style", "mnist"], []),
    "torch_imagenet": ("torch_examples.py", ["--style", "imagenet"], []),
    "plain_epoch_steps": ("plain_prints.py", ["--style", "epoch-steps"], []),
    "plain_json": ("plain_prints.py", ["--style", "json"], []),
    "plain_keyvalue": ("plain_prints.py", ["--style", "keyvalue"], []),
}


def run_case(name: str, python: str = sys.executable, env: dict[str, str] | None = None) -> tuple[bytes, list[dict]]:
    """Run one case; return (its output bytes, its truth records)."""
    script, args, _ = CASES[name]
    with tempfile.TemporaryDirectory() as tmp:
        truth_path = Path(tmp) / "truth.json"
        child_env = {
            **(env or os.environ),
            "CORPUS_TRUTH": str(truth_path),
            "KERAS_BACKEND": "torch",
            "PYTHONPATH": str(SCRIPTS),
        }
        child_env.pop("COLUMNS", None)
        read_fd, write_fd = os.pipe()
        proc = subprocess.Popen(
            [python, str(SCRIPTS / script), *args],
            stdout=write_fd,
            stderr=write_fd,
            stdin=subprocess.DEVNULL,
            cwd=tmp,
            env=child_env,
        )
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as pipe:
            output = pipe.read()
        if proc.wait(timeout=600) != 0:
            raise SystemExit(f"{name} failed ({proc.returncode}):\n{output.decode(errors='replace')[-3000:]}")
        return output, json.loads(truth_path.read_text())


def main() -> None:
    names = sys.argv[1:] or list(CASES)
    DATA.mkdir(parents=True, exist_ok=True)
    manifest_path = DATA / "cases.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for name in names:
        output, truth = run_case(name)
        (DATA / f"{name}.log").write_bytes(output)
        (DATA / f"{name}.truth.json").write_text(json.dumps(truth, indent=1) + "\n")
        script, args, libraries = CASES[name]
        versions = {lib: importlib.metadata.version(lib) for lib in ["torch", *libraries]}
        manifest[name] = {"script": script, "args": args, "versions": versions}
        print(
            f"{name}: {len(output)} bytes, {len(truth)} truth records"
            f" ({', '.join(f'{k} {v}' for k, v in versions.items())})"
        )
    manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")


if __name__ == "__main__":
    main()
