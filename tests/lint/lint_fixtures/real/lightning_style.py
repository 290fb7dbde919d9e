"""Image classification with Lightning, seeded correctly: seed_everything(workers=True), a seeded shuffle
generator, deterministic=True (which also sets CUBLAS_WORKSPACE_CONFIG)."""

import os

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, random_split
from torchvision import transforms
from torchvision.datasets import CIFAR10


class LitResNet(L.LightningModule):
    def __init__(self, lr=0.05, num_classes=10):
        super().__init__()
        self.save_hyperparameters()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1, stride=2), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 128, 3, padding=1, stride=2), nn.BatchNorm2d(128), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.head = nn.Linear(128, num_classes)

    def forward(self, x):
        return self.head(self.features(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_acc", (logits.argmax(1) == y).float().mean(), prog_bar=True)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9, weight_decay=5e-4)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class CIFARDataModule(L.LightningDataModule):
    def __init__(self, data_dir="./data", batch_size=128, num_workers=4, seed=42):
        super().__init__()
        self.data_dir, self.batch_size, self.num_workers, self.seed = data_dir, batch_size, num_workers, seed
        self.train_tf = transforms.Compose([transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip(),
                                            transforms.ToTensor()])
        self.test_tf = transforms.ToTensor()

    def prepare_data(self):
        CIFAR10(self.data_dir, train=True, download=True)
        CIFAR10(self.data_dir, train=False, download=True)

    def setup(self, stage=None):
        full = CIFAR10(self.data_dir, train=True, transform=self.train_tf)
        split = torch.Generator().manual_seed(self.seed)
        self.train_set, self.val_set = random_split(full, [45000, 5000], generator=split)
        self.test_set = CIFAR10(self.data_dir, train=False, transform=self.test_tf)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers,
                          generator=torch.Generator().manual_seed(self.seed), persistent_workers=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size, num_workers=self.num_workers)

    def test_dataloader(self):
        return DataLoader(self.test_set, batch_size=self.batch_size, num_workers=self.num_workers)


def main():
    L.seed_everything(int(os.environ.get("SEED", "42")), workers=True)
    model = LitResNet()
    data = CIFARDataModule()
    trainer = L.Trainer(max_epochs=30, accelerator="auto", devices=1, deterministic=True,
                        callbacks=[ModelCheckpoint(monitor="val_acc", mode="max")])
    trainer.fit(model, datamodule=data)
    trainer.test(model, datamodule=data)


if __name__ == "__main__":
    main()
