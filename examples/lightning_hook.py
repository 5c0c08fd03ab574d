"""Train a small CNN with Lightning on 2 CPU processes and a gvq communication hook (the GvqHook callback):

    python examples/lightning_hook.py qsgd                 # any conf/aggregator ring option
    python examples/lightning_hook.py qsgd --no-hook       # Lightning's own DDP all-reduce, to compare

The callback registers the hook once Lightning has wrapped the model in DDP (Lightning's
``DDPStrategy(ddp_comm_hook=...)`` does so only on CUDA), closes it at teardown, and keeps every rank's
hook state in Lightning's checkpoints.  On GPUs: ``accelerator="gpu"``, the same callback.  Prints the
mean loss over ranks each epoch, and the parameters' checksum at the end.
"""
import argparse

import lightning.pytorch as pl
import torch
import torch.nn.functional as F

from gvq.hooks.lightning import GvqHook


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)                       # the same initial model on every rank
        self.net = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                       torch.nn.Linear(8 * 6 * 6, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

    def training_step(self, batch, _):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def on_train_epoch_end(self):
        if self.trainer.is_global_zero:
            print(f"epoch {self.current_epoch} loss {self.trainer.callback_metrics['loss'].item():.7f}", flush=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def data() -> torch.utils.data.DataLoader:
    """8x8 random images labelled by a fixed rule (Lightning gives each rank its share of them)."""
    x = torch.randn(2048, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0, :4].mean((1, 2)) > 0).long() + 2 * (x[:, 0, 4:].mean((1, 2)) > 0).long()
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)


def main(args) -> None:
    torch.set_num_threads(1)
    callbacks = [] if args.no_hook else [GvqHook(args.option)]
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=args.epochs, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=callbacks)
    model = Net()
    trainer.fit(model, data())
    if trainer.is_global_zero:
        print(f"checksum {sum(p.double().sum().item() for p in model.parameters()):.12f}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("option", nargs="?", default="qsgd", help="a conf/aggregator ring option")
    ap.add_argument("--no-hook", action="store_true", help="Lightning's own DDP, no gvq hook")
    ap.add_argument("--epochs", type=int, default=4)
    main(ap.parse_args())
