"""TR502: a GAN saved every epoch, loaded back "to continue training", without its optimizers' state."""

import argparse

import torch
import torch.nn as nn
import torch.optim as optim

parser = argparse.ArgumentParser()
parser.add_argument("--niter", type=int, default=25)
parser.add_argument("--netG", default="", help="path to netG (to continue training)")
parser.add_argument("--netD", default="", help="path to netD (to continue training)")
parser.add_argument("--outf", default=".", help="folder to output images and model checkpoints")
opt = parser.parse_args()
torch.manual_seed(999)

netG = nn.Sequential(nn.Linear(100, 784), nn.Tanh())
if opt.netG != "":
    netG.load_state_dict(torch.load(opt.netG))
netD = nn.Sequential(nn.Linear(784, 1), nn.Sigmoid())
if opt.netD != "":
    netD.load_state_dict(torch.load(opt.netD))

optimizerD = optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
criterion = nn.BCELoss()

for epoch in range(opt.niter):
    for i in range(100):
        noise = torch.randn(64, 100)
        fake = netG(noise)
        optimizerD.zero_grad()
        criterion(netD(fake.detach()), torch.zeros(64, 1)).backward()
        optimizerD.step()
        optimizerG.zero_grad()
        criterion(netD(fake), torch.ones(64, 1)).backward()
        optimizerG.step()
    torch.save(fake.detach(), "%s/fake_samples_epoch_%03d.pt" % (opt.outf, epoch))  # ok: not a model
    torch.save(netG.state_dict(), "%s/netG_epoch_%d.pth" % (opt.outf, epoch))  # expect: TR502
    torch.save(netD.state_dict(), "%s/netD_epoch_%d.pth" % (opt.outf, epoch))  # expect: TR502
