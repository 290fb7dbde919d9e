"""A small CNN on MNIST with a validation split beside the training loader (style of pytorch/examples mnist).

torch is seeded and nothing else draws. The images are only converted and normalised, so the loader workers
draw no random numbers; the training order comes from torch's global generator.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, random_split
from torchvision import datasets, transforms


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)  # expect: TR203
        self.conv2 = nn.Conv2d(32, 64, 3, 1)  # also: TR203
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)  # ok: 2-D max pooling is deterministic on CUDA
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)}]\tLoss: {loss.item():.6f}")
            if args.dry_run:
                break


def evaluate(model, device, loader, name):
    model.eval()
    loss = 0.0
    correct = 0
    with torch.no_grad():
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            loss += F.nll_loss(output, target, reduction="sum").item()
            correct += output.argmax(dim=1).eq(target).sum().item()
    n = len(loader.dataset)
    print(f"{name}: average loss {loss / n:.4f}, accuracy {correct}/{n} ({100.0 * correct / n:.0f}%)")
    return correct / n


def main():
    parser = argparse.ArgumentParser(description="MNIST example")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--test-batch-size", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=14)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--no-cuda", action="store_true")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=10)
    parser.add_argument("--save-model", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    use_cuda = not args.no_cuda and torch.cuda.is_available()
    device = torch.device("cuda" if use_cuda else "cpu")

    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    full_train = datasets.MNIST("../data", train=True, download=True, transform=transform)
    test_set = datasets.MNIST("../data", train=False, transform=transform)
    split_generator = torch.Generator().manual_seed(args.seed)  # ok: seeded where it is made
    # the split has its own generator: the same 5,000 validation images in every run
    train_set, val_set = random_split(full_train, [55_000, 5_000], generator=split_generator)  # ok: generator=

    train_loader = DataLoader(  # expect: TR301 - but no TR302: the workers draw nothing
        train_set, batch_size=args.batch_size, shuffle=True, num_workers=2, pin_memory=use_cuda)
    val_loader = DataLoader(val_set, batch_size=args.test_batch_size, shuffle=False,  # ok: no random transforms
                            num_workers=2, pin_memory=use_cuda)
    test_loader = DataLoader(test_set, batch_size=args.test_batch_size, num_workers=2)  # ok: same transforms

    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    best = 0.0
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch)
        acc = evaluate(model, device, val_loader, "Validation set")
        scheduler.step()
        best = max(best, acc)
    evaluate(model, device, test_loader, "Test set")

    if args.save_model:
        torch.save(model.state_dict(), "mnist_cnn.pt")  # ok: the trained model, nothing resumes from it


if __name__ == "__main__":
    main()
