"""Near miss for TR302: Lightning's seed_everything(workers=True) installs a worker init function."""

import lightning as L
import torch
from torch.utils.data import DataLoader


class Data(L.LightningDataModule):
    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        return DataLoader(self.train_set, batch_size=32, shuffle=True, num_workers=4, generator=g)  # ok

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=32, num_workers=4)  # ok: workers seeded by Lightning


def main():
    L.seed_everything(42, workers=True)
    L.Trainer(deterministic=True).fit(L.LightningModule(), Data())


if __name__ == "__main__":
    main()
