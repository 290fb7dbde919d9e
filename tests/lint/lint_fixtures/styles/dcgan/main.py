"""Deep convolutional GAN on an image folder or a torchvision dataset (style of pytorch/examples dcgan).

A script without a main(): everything runs at module level. Without --manualSeed the seed is drawn from the
unseeded `random` module, so every run gets another one (it is printed, but two runs of the same command
differ). Checkpoints are the two state_dicts, written every epoch, and --netG/--netD load them "to continue
training": the Adam moments, the RNG states and the epoch are not in them.
"""

import argparse
import os
import random

import torch
import torch.backends.cudnn as cudnn
import torch.nn as nn
import torch.optim as optim
import torch.utils.data
import torchvision.datasets as dset
import torchvision.transforms as transforms
import torchvision.utils as vutils

parser = argparse.ArgumentParser()
parser.add_argument("--dataset", required=True, help="cifar10 | mnist | folder | fake")
parser.add_argument("--dataroot", required=False, help="path to the dataset")
parser.add_argument("--workers", type=int, default=2, help="data loading workers")
parser.add_argument("--batchSize", type=int, default=64)
parser.add_argument("--imageSize", type=int, default=64, help="height and width of the images")
parser.add_argument("--nz", type=int, default=100, help="size of the latent vector")
parser.add_argument("--ngf", type=int, default=64)
parser.add_argument("--ndf", type=int, default=64)
parser.add_argument("--niter", type=int, default=25, help="number of epochs")
parser.add_argument("--lr", type=float, default=0.0002)
parser.add_argument("--beta1", type=float, default=0.5, help="beta1 of Adam")
parser.add_argument("--cuda", action="store_true")
parser.add_argument("--dry-run", action="store_true", help="one batch only")
parser.add_argument("--netG", default="", help="generator weights (to continue training)")
parser.add_argument("--netD", default="", help="discriminator weights (to continue training)")
parser.add_argument("--outf", default=".", help="where images and checkpoints go")
parser.add_argument("--manualSeed", type=int, help="seed")
opt = parser.parse_args()
print(opt)

os.makedirs(opt.outf, exist_ok=True)

if opt.manualSeed is None:
    opt.manualSeed = random.randint(1, 10000)  # expect[seed]: TR105
print("Random Seed:", opt.manualSeed)
random.seed(opt.manualSeed)  # expect[seed]: TR105
torch.manual_seed(opt.manualSeed)  # expect[seed]: TR105

cudnn.benchmark = True  # expect: TR201

device = torch.device("cuda:0" if opt.cuda and torch.cuda.is_available() else "cpu")

if opt.dataroot is None and opt.dataset != "fake":
    raise ValueError(f"--dataroot is required for the dataset {opt.dataset!r}")

if opt.dataset == "folder":
    dataset = dset.ImageFolder(root=opt.dataroot, transform=transforms.Compose([
        transforms.Resize(opt.imageSize),
        transforms.CenterCrop(opt.imageSize),
        transforms.ToTensor(),
        transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    ]))
    nc = 3
elif opt.dataset == "cifar10":
    dataset = dset.CIFAR10(root=opt.dataroot, download=True, transform=transforms.Compose([
        transforms.Resize(opt.imageSize),
        transforms.ToTensor(),
        transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    ]))
    nc = 3
elif opt.dataset == "mnist":
    dataset = dset.MNIST(root=opt.dataroot, download=True, transform=transforms.Compose([
        transforms.Resize(opt.imageSize),
        transforms.ToTensor(),
        transforms.Normalize((0.5,), (0.5,)),
    ]))
    nc = 1
else:
    dataset = dset.FakeData(image_size=(3, opt.imageSize, opt.imageSize), transform=transforms.ToTensor())
    nc = 3

# the images are only resized and normalised: the workers draw no random numbers (TR302 has nothing to seed)
dataloader = torch.utils.data.DataLoader(dataset, batch_size=opt.batchSize,  # expect: TR301
                                         shuffle=True, num_workers=int(opt.workers))

nz = opt.nz
ngf = opt.ngf
ndf = opt.ndf


def weights_init(m):
    """DCGAN initialisation: N(0, 0.02) for convolutions, N(1, 0.02) for batch-norm scales."""
    name = m.__class__.__name__
    if "Conv" in name:
        nn.init.normal_(m.weight, 0.0, 0.02)
    elif "BatchNorm" in name:
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 8, 4, 1, 0, bias=False),  # expect: TR203
            nn.BatchNorm2d(ngf * 8),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 8, ngf * 4, 4, 2, 1, bias=False),  # also: TR203
            nn.BatchNorm2d(ngf * 4),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False),  # also: TR203
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),  # also: TR203
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),  # also: TR203
            nn.Tanh(),
        )

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),  # expect: TR203
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),  # also: TR203
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False),  # also: TR203
            nn.BatchNorm2d(ndf * 4),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 4, ndf * 8, 4, 2, 1, bias=False),  # also: TR203
            nn.BatchNorm2d(ndf * 8),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 8, 1, 4, 1, 0, bias=False),  # also: TR203
            nn.Sigmoid(),
        )

    def forward(self, x):
        return self.main(x).view(-1, 1).squeeze(1)


netG = Generator().to(device)
netG.apply(weights_init)
if opt.netG != "":
    netG.load_state_dict(torch.load(opt.netG))  # expect[resumeG]: TR501|TR502
print(netG)

netD = Discriminator().to(device)
netD.apply(weights_init)
if opt.netD != "":
    netD.load_state_dict(torch.load(opt.netD))  # expect[resumeD]: TR501|TR502
print(netD)

criterion = nn.BCELoss()
fixed_noise = torch.randn(opt.batchSize, nz, 1, 1, device=device)  # ok: drawn after torch.manual_seed
real_label = 1.0
fake_label = 0.0

optimizerD = optim.Adam(netD.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))

if opt.dry_run:
    opt.niter = 1

for epoch in range(opt.niter):
    for i, data in enumerate(dataloader, 0):
        # (1) the discriminator: maximise log(D(x)) + log(1 - D(G(z)))
        netD.zero_grad()
        real = data[0].to(device)
        batch_size = real.size(0)
        label = torch.full((batch_size,), real_label, dtype=real.dtype, device=device)
        output = netD(real)
        errD_real = criterion(output, label)
        errD_real.backward()
        D_x = output.mean().item()

        noise = torch.randn(batch_size, nz, 1, 1, device=device)
        fake = netG(noise)
        label.fill_(fake_label)
        output = netD(fake.detach())
        errD_fake = criterion(output, label)
        errD_fake.backward()
        D_G_z1 = output.mean().item()
        errD = errD_real + errD_fake
        optimizerD.step()

        # (2) the generator: maximise log(D(G(z)))
        netG.zero_grad()
        label.fill_(real_label)
        output = netD(fake)
        errG = criterion(output, label)
        errG.backward()
        D_G_z2 = output.mean().item()
        optimizerG.step()

        print(f"[{epoch}/{opt.niter}][{i}/{len(dataloader)}] Loss_D {errD.item():.4f} Loss_G {errG.item():.4f} "
              f"D(x) {D_x:.4f} D(G(z)) {D_G_z1:.4f} / {D_G_z2:.4f}")
        if i % 100 == 0:
            vutils.save_image(real, f"{opt.outf}/real_samples.png", normalize=True)
            fake = netG(fixed_noise)
            vutils.save_image(fake.detach(), f"{opt.outf}/fake_samples_epoch_{epoch:03d}.png", normalize=True)
        if opt.dry_run:
            break

    # checkpoints, read back by --netG / --netD
    torch.save(netG.state_dict(), f"{opt.outf}/netG_epoch_{epoch}.pth")  # expect[resumeG]: TR501|TR502
    torch.save(netD.state_dict(), f"{opt.outf}/netD_epoch_{epoch}.pth")  # expect[resumeD]: TR501|TR502
