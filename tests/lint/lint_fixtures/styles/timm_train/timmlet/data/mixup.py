"""Mixup and CutMix on a batch, with the mixing weight drawn from NumPy's global generator."""

import numpy as np
import torch


def one_hot(x, num_classes, on_value=1.0, off_value=0.0):
    x = x.long().view(-1, 1)
    return torch.full((x.size(0), num_classes), off_value, device=x.device).scatter_(1, x, on_value)  # ok: a scalar, one index per row


def mixup_target(target, num_classes, lam=1.0, smoothing=0.0):
    off_value = smoothing / num_classes
    on_value = 1.0 - smoothing + off_value
    y1 = one_hot(target, num_classes, on_value=on_value, off_value=off_value)
    y2 = one_hot(target.flip(0), num_classes, on_value=on_value, off_value=off_value)
    return y1 * lam + y2 * (1.0 - lam)


class Mixup:
    def __init__(self, mixup_alpha=1.0, cutmix_alpha=0.0, prob=1.0, switch_prob=0.5, label_smoothing=0.1,
                 num_classes=1000):
        self.mixup_alpha = mixup_alpha
        self.cutmix_alpha = cutmix_alpha
        self.mix_prob = prob
        self.switch_prob = switch_prob
        self.label_smoothing = label_smoothing
        self.num_classes = num_classes

    def _params_per_batch(self):
        lam = 1.0
        use_cutmix = False
        if np.random.rand() < self.mix_prob:  # ok: NumPy is seeded by utils.random_seed in train.py
            if self.mixup_alpha > 0.0 and self.cutmix_alpha > 0.0:
                use_cutmix = np.random.rand() < self.switch_prob
                alpha = self.cutmix_alpha if use_cutmix else self.mixup_alpha
            else:
                use_cutmix = self.cutmix_alpha > 0.0
                alpha = self.cutmix_alpha if use_cutmix else self.mixup_alpha
            lam = float(np.random.beta(alpha, alpha))
        return lam, use_cutmix

    def __call__(self, x, target):
        assert len(x) % 2 == 0, "batch size must be even for mixup"
        lam, use_cutmix = self._params_per_batch()
        if lam != 1.0:
            if use_cutmix:
                _, _, h, w = x.shape
                cut = np.sqrt(1.0 - lam)
                ch, cw = int(h * cut), int(w * cut)
                cy, cx = np.random.randint(h), np.random.randint(w)
                y0, y1 = np.clip(cy - ch // 2, 0, h), np.clip(cy + ch // 2, 0, h)
                x0, x1 = np.clip(cx - cw // 2, 0, w), np.clip(cx + cw // 2, 0, w)
                x[:, :, y0:y1, x0:x1] = x.flip(0)[:, :, y0:y1, x0:x1]
                lam = 1.0 - (y1 - y0) * (x1 - x0) / float(h * w)
            else:
                x.mul_(lam).add_(x.flip(0).mul_(1.0 - lam))
        return x, mixup_target(target, self.num_classes, lam, self.label_smoothing)
