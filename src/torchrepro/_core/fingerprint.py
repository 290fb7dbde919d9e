"""Exact, fast tensor fingerprints computed on the tensor's own device.

A fingerprint is a 128-bit digest of a tensor's bytes, dtype and shape, written as 32 hex digits. There are two
algorithms, each named by a tag that run directories record (``fingerprint_algorithm`` in ``manifest.json``):
equal bytes give equal fingerprints under one algorithm, on every device and thread count; fingerprints taken
with different algorithms are not comparable, and ``torchrepro diff`` says so instead of comparing them.

``xxh3-128-chunks-1MiB/1`` (CPU tensors, when ``xxhash`` and NumPy are installed):

1. The tensor's bytes (C order) are cut into chunks of 1 MiB (``CHUNK`` bytes; the last one shorter).
2. Each chunk is hashed with XXH3-128; the 16-byte digests are in canonical (big-endian) byte order. Large
   tensors have their chunks hashed in parallel (``torch.get_num_threads()`` shares, on torch's own OpenMP
   threads where possible: see ``_ompteam``); the result does not depend on the thread count.
3. The fingerprint is XXH3-128 of ``"{dtype}|{shape}|{nbytes}|"`` (UTF-8, e.g. ``torch.float32|(3, 4)|48|``)
   followed by the chunk digests in order.

``splitmix64-sum-128/1`` (tensors on other devices, computed there with no device-to-host copy of the data;
and CPU tensors when ``xxhash`` or NumPy is missing):

1. The bytes are zero-padded to a multiple of 8 and read as little-endian 64-bit words ``w_i``.
2. For two salts ``s``, lane ``L_s`` is the sum mod 2**64 of ``splitmix64(w_i + i * 0x9E3779B97F4A7C15 + s)``
   (the splitmix64 finaliser is a bijection; integer addition is associative, so the sum is exact and the
   same in any order). Long tensors are processed in slices of ``TORCH_SLICE_WORDS`` words to bound memory.
3. The fingerprint is BLAKE2b-128 of ``"{dtype}|{shape}|{nbytes}"`` followed by ``L_0`` and ``L_1`` (8 bytes
   each, little-endian).

Tensors that are not plain strided arrays are digested through the dense tensors that hold their bits:
sparse COO tensors through their coalesced indices and values, CSR/CSC/BSR/BSC tensors through their
compressed indices, plain indices and values, quantized tensors through their integer representation and
quantization parameters, nested tensors through their components, MKL-DNN tensors through their dense copy.
The digest of such a tensor is BLAKE2b-128 over a header (layout, dtype, shape, ...) and the fingerprints of
those parts. A DTensor (FSDP2, tensor parallel) is fingerprinted as its local shard, with no collective
(``_core/dtensor``). Every dtype torch has (float8 and float4 variants, bool, complex, unsigned and sub-byte integers,
bit types) is read as raw bytes. Plain contiguous CPU tensors are hashed in place; others are copied out first
(same digest). Only tensors without data of their own cannot be fingerprinted: ``meta`` tensors, tensors whose
storage was freed or shrunk under them, tensors inside ``torch.func`` transforms.

Guarantees: no known blind spot. Any change of bytes, including a swap of two different values at any
distance, changes the fingerprint except with the probability of a collision of the underlying 128-bit hash
(XXH3-128), or about 2**-64 for the keyed sums (a change of one 8-byte word always changes them: the
finaliser is a bijection). Runs recorded before the algorithm was named used ``fold63-splitmix64/0``
(``LEGACY_ALGORITHM``), which missed swaps of words 63 apart.

Example:
    >>> import torch, torchrepro
    >>> torchrepro.fingerprint(torch.zeros(3)) == torchrepro.fingerprint(torch.zeros(3))
    True
    >>> torchrepro.fingerprint(torch.zeros(3)) == torchrepro.fingerprint(torch.zeros(3, dtype=torch.float64))
    False
"""

# The code lives in three modules, by job; this one holds the specification above and the names the rest of
# torchrepro imports: `tensorbits` reads a tensor's bits (checks, parts of sparse/quantized/nested tensors, bytes
# in place), `tensordigest` hashes them (both algorithms, `fingerprint_many`), `treedigest` digests data batches.
from .tensorbits import UnfingerprintableError as UnfingerprintableError
from .tensorbits import _direct_bytes as _direct_bytes
from .tensorbits import check_fingerprintable as check_fingerprintable
from .tensordigest import ALGORITHM_TORCH as ALGORITHM_TORCH
from .tensordigest import ALGORITHM_XXH3 as ALGORITHM_XXH3
from .tensordigest import CHUNK as CHUNK
from .tensordigest import LEGACY_ALGORITHM as LEGACY_ALGORITHM
from .tensordigest import _digests_torch as _digests_torch
from .tensordigest import algorithms_since as algorithms_since
from .tensordigest import fingerprint as fingerprint
from .tensordigest import fingerprint_many as fingerprint_many
from .tensordigest import plain_cpu_fingerprint as plain_cpu_fingerprint
from .tensordigest import small_cpu_fingerprint_at as small_cpu_fingerprint_at
from .tensordigest import usage_mark as usage_mark
from .treedigest import MAX_DEPTH as MAX_DEPTH
from .treedigest import MAX_NODES as MAX_NODES
from .treedigest import UNREADABLE as UNREADABLE
from .treedigest import UnreadableError as UnreadableError
from .treedigest import fingerprint_object as fingerprint_object
from .treedigest import unreadable_text as unreadable_text
