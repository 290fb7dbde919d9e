"""Train a word-level language model on a Wikitext-2 style corpus (style of pytorch/examples word_language_model).

Seeded with torch.manual_seed; batches are contiguous slices of the corpus (no shuffling, no workers). The best
model (by validation loss) is pickled whole with torch.save(model, f) and loaded back for the final test: a
model to evaluate, not a checkpoint to continue training from.
"""

import argparse
import math
import time

import torch
import torch.nn as nn

import data
from model import RNNModel

parser = argparse.ArgumentParser(description="RNN/LSTM/GRU language model")
parser.add_argument("--data", type=str, default="./data/wikitext-2", help="corpus directory")
parser.add_argument("--model", type=str, default="LSTM", help="RNN_TANH, RNN_RELU, LSTM or GRU")
parser.add_argument("--emsize", type=int, default=200)
parser.add_argument("--nhid", type=int, default=200)
parser.add_argument("--nlayers", type=int, default=2)
parser.add_argument("--lr", type=float, default=20)
parser.add_argument("--clip", type=float, default=0.25)
parser.add_argument("--epochs", type=int, default=40)
parser.add_argument("--batch_size", type=int, default=20)
parser.add_argument("--bptt", type=int, default=35, help="sequence length")
parser.add_argument("--dropout", type=float, default=0.2)
parser.add_argument("--tied", action="store_true")
parser.add_argument("--seed", type=int, default=1111)
parser.add_argument("--cuda", action="store_true")
parser.add_argument("--log-interval", type=int, default=200)
parser.add_argument("--save", type=str, default="model.pt", help="where the best model goes")
parser.add_argument("--dry-run", action="store_true")
args = parser.parse_args()

torch.manual_seed(args.seed)
device = torch.device("cuda" if args.cuda else "cpu")

corpus = data.Corpus(args.data)


def batchify(ids, bsz):
    """Cut the corpus into bsz contiguous columns (the last partial row is dropped)."""
    nbatch = ids.size(0) // bsz
    ids = ids.narrow(0, 0, nbatch * bsz)
    return ids.view(bsz, -1).t().contiguous().to(device)


eval_batch_size = 10
train_data = batchify(corpus.train, args.batch_size)
val_data = batchify(corpus.valid, eval_batch_size)
test_data = batchify(corpus.test, eval_batch_size)

ntokens = len(corpus.dictionary)
model = RNNModel(args.model, ntokens, args.emsize, args.nhid, args.nlayers, args.dropout, args.tied).to(device)
criterion = nn.NLLLoss()


def repackage_hidden(h):
    """Detach hidden states from the graph of the previous batch."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def get_batch(source, i):
    seq_len = min(args.bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


def evaluate(data_source):
    model.eval()
    total_loss = 0.0
    hidden = model.init_hidden(eval_batch_size)
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, args.bptt):
            inputs, targets = get_batch(data_source, i)
            output, hidden = model(inputs, hidden)
            hidden = repackage_hidden(hidden)
            total_loss += len(inputs) * criterion(output, targets).item()
    return total_loss / (len(data_source) - 1)


def train():
    model.train()
    total_loss = 0.0
    start_time = time.time()
    hidden = model.init_hidden(args.batch_size)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        inputs, targets = get_batch(train_data, i)
        hidden = repackage_hidden(hidden)
        model.zero_grad()
        output, hidden = model(inputs, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        total_loss += loss.item()
        if batch % args.log_interval == 0 and batch > 0:
            cur_loss = total_loss / args.log_interval
            elapsed = time.time() - start_time
            print(f"| epoch {epoch:3d} | {batch:5d} batches | lr {lr:02.2f} | ms/batch "
                  f"{elapsed * 1000 / args.log_interval:5.2f} | loss {cur_loss:5.2f} | ppl {math.exp(cur_loss):8.2f}")
            total_loss = 0.0
            start_time = time.time()
        if args.dry_run:
            break


lr = args.lr
best_val_loss = None
try:
    for epoch in range(1, args.epochs + 1):
        epoch_start_time = time.time()
        train()
        val_loss = evaluate(val_data)
        print(f"| end of epoch {epoch:3d} | time {time.time() - epoch_start_time:5.2f}s | valid loss {val_loss:5.2f}")
        if not best_val_loss or val_loss < best_val_loss:
            with open(args.save, "wb") as f:
                torch.save(model, f)  # ok: the best model, for the test below: not a checkpoint to continue training
            best_val_loss = val_loss
        else:
            lr /= 4.0  # no improvement on the validation set: anneal
except KeyboardInterrupt:
    print("Exiting from training early")

with open(args.save, "rb") as f:
    model = torch.load(f, weights_only=False)
    model.rnn.flatten_parameters()

test_loss = evaluate(test_data)
print(f"| end of training | test loss {test_loss:5.2f} | test ppl {math.exp(test_loss):8.2f}")
