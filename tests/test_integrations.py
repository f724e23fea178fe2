"""The trainer callbacks: a Hugging Face ``Trainer`` and a Lightning ``Trainer`` tuned on a
simulated GPU, their headline in the trainers' logs (the real packages; skipped without them)."""

import json
import logging
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

#: Small enough for a test: 3 clocks of 1 iteration, one per-operator round and the static
#: clock's, each of 2 pairs of 2-iteration blocks; the work scaled so that one iteration spans
#: the simulated power sensor's windows.
TUNE = {
    "actuator": "sim:a100-like",
    "cache": False,
    "clocks": [1410.0, 1380.0, 210.0],
    "iterations_per_clock": 1,
    "block": 2,
    "pairs": 2,
    "rounds": 2,
}
STEPS = 40


def _lightning_trainer(pl, tmp_path: Path, callback, steps: int, logger):
    """A Lightning trainer on the CPU with ``callback``, quiet, no checkpoints."""
    return pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=logger,
        callbacks=[callback],
        default_root_dir=str(tmp_path),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )


def _check(result, folder: Path) -> None:
    assert result is not None and result.error is None, result and result.error
    assert len(result.rounds) >= 1 and result.static is not None
    assert result.whole_run() is not None and len(result.iterations) == STEPS
    assert json.loads((folder / "tune.json").read_text())["iterations"] == STEPS
    assert (folder / "run.png").is_file()


@pytest.mark.slow
def test_a_hugging_face_trainer_is_tuned_and_logs_the_saving(tmp_path, caplog):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from opdvfs.integrations.huggingface import OpdvfsCallback

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=2)
    model = GPT2LMHeadModel(config)  # randomly initialised: nothing downloaded

    class Data(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 1000

        def __getitem__(self, i: int) -> dict:
            x = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": x, "labels": x}

    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=STEPS,
        per_device_train_batch_size=2,
        report_to="none",
        use_cpu=True,
        # every step logs: on a simulated GPU the executor counts operators, and a logging
        # step's extra ones would differ from the plan's
        logging_steps=1,
        log_level="error",
        save_strategy="no",
        disable_tqdm=True,
    )
    callback = OpdvfsCallback(0.02, work_scale=2e6, **TUNE)
    trainer = Trainer(model=model, args=args, train_dataset=Data(), callbacks=[callback])
    with caplog.at_level(logging.INFO, logger="opdvfs"):
        trainer.train()
    result = callback.result
    _check(result, tmp_path / "opdvfs")
    (logged,) = [h for h in trainer.state.log_history if "opdvfs/run_saving" in h]
    assert logged["step"] == STEPS
    run = result.whole_run()
    assert logged["opdvfs/run_saving"] == pytest.approx(run.saving)
    assert logged["opdvfs/static_mhz"] == result.static.static_mhz
    assert logged["opdvfs/steady_saving"] == pytest.approx(result.best.saving.mean)
    messages = [r.getMessage() for r in caplog.records if r.name == "opdvfs"]
    assert any(m.startswith("tune: round 1: planned at 2.00%") for m in messages)
    assert any(m.startswith("tune: steady state (round ") for m in messages)


@pytest.mark.slow
def test_a_lightning_trainer_is_tuned_and_logs_the_saving(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.loggers import CSVLogger

    from opdvfs.integrations.lightning import OpdvfsCallback

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(64, 32)
            self.out = torch.nn.Linear(32, 64)

        def training_step(self, batch, index):
            (x,) = batch
            logits = self.out(self.emb(x[:, :-1]))
            return torch.nn.functional.cross_entropy(logits.reshape(-1, 64), x[:, 1:].reshape(-1))

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randint(0, 64, (400, 17))), batch_size=4
    )
    callback = OpdvfsCallback(0.02, work_scale=2e7, **TUNE)
    trainer = _lightning_trainer(pl, tmp_path, callback, STEPS, CSVLogger(str(tmp_path)))
    trainer.fit(Tiny(), data)
    result = callback.result
    _check(result, tmp_path / "opdvfs")
    (csv,) = tmp_path.glob("lightning_logs/version_*/metrics.csv")
    header, row = csv.read_text().strip().splitlines()[-2:]
    logged = dict(zip(header.split(","), row.split(","), strict=True))
    assert float(logged["opdvfs/run_saving"]) == pytest.approx(result.whole_run().saving)
    assert float(logged["opdvfs/static_mhz"]) == result.static.static_mhz


@pytest.mark.slow
def test_lightning_restores_the_clock_when_training_raises(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")

    from opdvfs.integrations.lightning import OpdvfsCallback

    class Failing(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def training_step(self, batch, index):
            if index == 3:
                raise RuntimeError("boom")
            return self.lin(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(40, 4)))
    callback = OpdvfsCallback(0.02, actuator="sim:a100-like", cache=False)
    trainer = _lightning_trainer(pl, tmp_path, callback, 10, logger=False)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Failing(), data)
    assert not callback.session.active and callback.session.tuner.guard.restored
    assert callback.result is not None and len(callback.result.iterations) == 3


def test_the_hugging_face_headline_goes_to_each_logger_report_to_names(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from opdvfs.integrations import huggingface
    from opdvfs.integrations._session import TuneSession

    logged: list[dict] = []
    fake = types.ModuleType("wandb")
    fake.run = types.SimpleNamespace(log=logged.append)
    fake.Image = lambda path: ("image", path)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    (tmp_path / "run.png").write_bytes(b"png")
    session = TuneSession(0.02, "sim:a100-like", tmp_path, {})
    args = types.SimpleNamespace(report_to=["wandb", "comet_ml"], logging_dir=str(tmp_path))
    huggingface.send(args, 7, {"opdvfs/run_saving": 0.1}, session)
    assert logged == [
        {"opdvfs/run_saving": 0.1, "opdvfs/run.png": ("image", str(tmp_path / "run.png"))}
    ]
    fake.run = None  # no active run: skipped with a warning, nothing raised
    huggingface.send(args, 7, {"opdvfs/run_saving": 0.1}, session)
    assert len(logged) == 1
