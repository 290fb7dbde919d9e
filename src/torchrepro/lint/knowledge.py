"""What the linter knows about library APIs, as tables (not code branches).

Every name here is a *normalised* qualified name (see :func:`normalise`): ``import numpy as np`` and
``np.random.seed`` give ``numpy.random.seed``; ``pytorch_lightning`` and ``lightning`` give ``lightning.pytorch``.
"""

from __future__ import annotations

RANDOM, NUMPY, TORCH = "random", "numpy", "torch"
LIBS = (RANDOM, NUMPY, TORCH)
ALL_LIBS = frozenset(LIBS)
LIB_LABEL = {RANDOM: "`random`", NUMPY: "`numpy.random`", TORCH: "`torch`"}
LIB_SEEDER = {RANDOM: "random.seed(seed)", NUMPY: "np.random.seed(seed)", TORCH: "torch.manual_seed(seed)"}

# Prefix rewrites applied to every resolved name (longest prefix first).
_PREFIXES = (
    ("pytorch_lightning.", "lightning.pytorch."),
    ("lightning_fabric.", "lightning.fabric."),
    ("torch.utils.data.dataloader.", "torch.utils.data."),
    ("torch.utils.data.sampler.", "torch.utils.data."),
    ("torch.utils.data.dataset.", "torch.utils.data."),
    ("torch.utils.data.distributed.", "torch.utils.data."),
    ("torch.random.", "torch."),
    ("numpy.random.mtrand.", "numpy.random."),
    ("torch.multiprocessing.spawn.", "torch.multiprocessing."),
)
# `import lightning as L; L.Trainer` is lightning.pytorch.Trainer.
_LIGHTNING_TOP = frozenset({"Trainer", "LightningModule", "LightningDataModule", "seed_everything", "Fabric"})


_NORMALISED: dict[str, str] = {}


def normalise(name: str) -> str:
    found = _NORMALISED.get(name)
    if found is None:
        if len(_NORMALISED) > 100_000:
            _NORMALISED.clear()
        found = _NORMALISED[name] = _normalise(name)
    return found


def _normalise(name: str) -> str:
    for old, new in _PREFIXES:
        if name.startswith(old):
            name = new + name[len(old):]
            break
    if name.startswith("lightning.") and name.count(".") == 1 and name[10:] in _LIGHTNING_TOP:
        name = ("lightning.fabric." if name.endswith("Fabric") else "lightning.pytorch.") + name[10:]
    if name in ("pytorch_lightning", "lightning_fabric"):
        name = {"pytorch_lightning": "lightning.pytorch", "lightning_fabric": "lightning.fabric"}[name]
    return name


# --- seeding ---------------------------------------------------------------------------------------------------
# A seeding call: name -> (libraries it seeds, position of the seed argument, keyword names of the seed).
# A position of None means the call restores a saved state (it seeds, and has no seed value to judge).
_SEED_ALL = (ALL_LIBS, 0, ("seed",))
SEEDERS: dict[str, tuple[frozenset[str], int | None, tuple[str, ...]]] = {
    "random.seed": (frozenset({RANDOM}), 0, ("a",)),
    "numpy.random.seed": (frozenset({NUMPY}), 0, ("seed",)),
    "torch.manual_seed": (frozenset({TORCH}), 0, ("seed",)),
    "torch.cuda.manual_seed": (frozenset(), 0, ("seed",)),
    "torch.cuda.manual_seed_all": (frozenset(), 0, ("seed",)),
    "lightning.pytorch.seed_everything": _SEED_ALL,
    "lightning.pytorch.utilities.seed.seed_everything": _SEED_ALL,
    "lightning.fabric.seed_everything": _SEED_ALL,
    "lightning.fabric.utilities.seed.seed_everything": _SEED_ALL,
    "transformers.set_seed": _SEED_ALL,
    "transformers.trainer_utils.set_seed": _SEED_ALL,
    "accelerate.utils.set_seed": _SEED_ALL,
    "torchrepro.seed_everything": _SEED_ALL,
    "torchrepro.seeding.seed_everything": _SEED_ALL,  # the module path before the package layout change (CHANGELOG.md)
    "torchrepro.control.seeding.seed_everything": _SEED_ALL,
    "mmengine.runner.set_random_seed": _SEED_ALL,
    "keras.utils.set_random_seed": _SEED_ALL,
    "monai.utils.set_determinism": _SEED_ALL,
    "random.setstate": (frozenset({RANDOM}), None, ()),
    "numpy.random.set_state": (frozenset({NUMPY}), None, ()),
    "torch.set_rng_state": (frozenset({TORCH}), None, ()),
    "torchrepro.load_rng_state": (ALL_LIBS, None, ()),
    "torchrepro.rng.load_rng_state": (ALL_LIBS, None, ()),
    "torchrepro.control.rng.load_rng_state": (ALL_LIBS, None, ()),
}
# Calls that take no seed and pick one from the OS or the clock (they "seed" nondeterministically).
ENTROPY_SEEDERS = {
    "random.seed": "random.seed() without an argument seeds from the OS entropy source",
    "numpy.random.seed": "np.random.seed() without an argument seeds from the OS entropy source",
    "torch.seed": "torch.seed() sets a nondeterministic seed taken from the OS",
    "torch.cuda.seed": "torch.cuda.seed() sets a nondeterministic seed",
    "torch.cuda.seed_all": "torch.cuda.seed_all() sets a nondeterministic seed",
}
# Method names that seed every library when called on any object (e.g. `fabric.seed_everything(0)`).
SEED_ALL_METHODS = frozenset({"seed_everything"})
# Hugging Face trainers seed every library with `args.seed` in their constructor.
HF_TRAINERS = frozenset({
    "transformers.Trainer", "transformers.Seq2SeqTrainer", "trl.SFTTrainer", "trl.DPOTrainer",
    "trl.RewardTrainer", "trl.ORPOTrainer", "trl.KTOTrainer", "trl.GRPOTrainer",
})
# Words that, in the last component of a function name we cannot resolve, mark a seeding helper
# (`set_seed`, `seed_all`, `fix_seeds`, ...) or a helper that enables deterministic mode. The linter assumes
# such a helper seeds every library, so that it never reports code whose helpers live elsewhere.
NOT_SEEDING_PREFIXES = ("get", "derive", "initial", "make", "generate", "new", "random", "worker", "load", "read")

# Constructors of generator objects: name -> (position of the seed argument, keyword names of the seed).
RNG_CONSTRUCTORS: dict[str, tuple[int, tuple[str, ...]]] = {
    "numpy.random.default_rng": (0, ("seed",)),
    "numpy.random.RandomState": (0, ("seed",)),
    "numpy.random.SeedSequence": (0, ("entropy",)),
    "numpy.random.PCG64": (0, ("seed",)),
    "numpy.random.PCG64DXSM": (0, ("seed",)),
    "numpy.random.Philox": (0, ("seed", "key")),
    "numpy.random.SFC64": (0, ("seed",)),
    "numpy.random.MT19937": (0, ("seed",)),
    "random.Random": (0, ("x",)),
}
TORCH_GENERATOR = "torch.Generator"

# Sources of a seed that differ from run to run.
NONDETERMINISTIC_SOURCES: dict[str, str] = {
    "time.time": "the clock", "time.time_ns": "the clock", "time.perf_counter": "the clock",
    "time.perf_counter_ns": "the clock", "time.monotonic": "the clock", "time.monotonic_ns": "the clock",
    "time.process_time": "the clock", "time.process_time_ns": "the clock", "time.thread_time": "the clock",
    "datetime.datetime.now": "the clock", "datetime.datetime.utcnow": "the clock",
    "datetime.datetime.today": "the clock", "datetime.date.today": "the clock",
    "os.urandom": "os.urandom", "os.getpid": "the process id", "uuid.uuid1": "uuid", "uuid.uuid4": "uuid",
    "secrets.randbits": "secrets", "secrets.randbelow": "secrets", "secrets.token_bytes": "secrets",
    "secrets.token_hex": "secrets", "random.SystemRandom": "the OS entropy source",
    "torch.seed": "torch.seed()", "torch.initial_seed": None,  # None: deterministic inside workers
    "id": "id() of an object (a memory address)",
}

# --- draws from the global generators ----------------------------------------------------------------------------
RANDOM_DRAWS = frozenset({
    "random.random", "random.randint", "random.randrange", "random.choice", "random.choices", "random.shuffle",
    "random.sample", "random.uniform", "random.gauss", "random.normalvariate", "random.lognormvariate",
    "random.expovariate", "random.betavariate", "random.gammavariate", "random.triangular",
    "random.vonmisesvariate", "random.paretovariate", "random.weibullvariate", "random.getrandbits",
    "random.randbytes", "random.binomialvariate",
})
# numpy.random.<name> that do not draw from the legacy global generator.
NUMPY_NOT_DRAWS = frozenset({
    "seed", "get_state", "set_state", "default_rng", "RandomState", "Generator", "SeedSequence", "PCG64",
    "PCG64DXSM", "Philox", "SFC64", "MT19937", "BitGenerator", "bit_generator",
})
TORCH_DRAWS = frozenset({
    "torch.rand", "torch.randn", "torch.randint", "torch.randperm", "torch.rand_like", "torch.randn_like",
    "torch.randint_like", "torch.normal", "torch.bernoulli", "torch.multinomial", "torch.poisson",
})
# Tensor methods that fill a tensor from torch's global generator unless given `generator=`.
TORCH_INPLACE_DRAWS = frozenset({
    "normal_", "uniform_", "bernoulli_", "random_", "exponential_", "geometric_", "cauchy_", "log_normal_",
})
# Methods that sample from torch's global generator when called with `do_sample=True` (transformers' generate).
SAMPLING_METHODS = frozenset({"generate"})
TORCH_INIT_PREFIX = "torch.nn.init."
TORCH_INIT_NOT_DRAWS = frozenset({"calculate_gain", "zeros_", "ones_", "constant_", "eye_", "dirac_"})
# Data-order randomness drawn from torch's global generator unless `generator=` is given.
# name -> position of its `generator` argument.
ORDER_DRAWS = {
    "torch.utils.data.RandomSampler": 3, "torch.utils.data.SubsetRandomSampler": 1,
    "torch.utils.data.WeightedRandomSampler": 3, "torch.utils.data.random_split": 2,
}
# DataLoader's positional parameters.
LOADER_SHUFFLE, LOADER_SAMPLER, LOADER_BATCH_SAMPLER, LOADER_WORKERS = 2, 3, 4, 5
LOADER_INIT_FN, LOADER_GENERATOR = 10, 12
DATALOADER = "torch.utils.data.DataLoader"
DISTRIBUTED_SAMPLER = "torch.utils.data.DistributedSampler"
DATASET_BASES = frozenset({"torch.utils.data.Dataset", "torch.utils.data.IterableDataset"})
LOADER_COLLATE = 6

# --- what DataLoader workers run (TR302) ------------------------------------------------------------------------
TRANSFORMS = "torchvision.transforms."  # and torchvision.transforms.v2.
# torchvision transforms that draw random numbers each time they run, besides every `Random*` one (RandomApply,
# RandomChoice and RandomOrder included). Every other torchvision transform is deterministic.
TRANSFORM_DRAWS = frozenset({
    "ColorJitter", "RandAugment", "AutoAugment", "TrivialAugmentWide", "AugMix", "GaussianBlur",
    "ElasticTransform", "ScaleJitter", "MixUp", "CutMix", "GaussianNoise", "JPEG",
})
TRANSFORM_CONTAINERS = frozenset({"Compose"})
# Transform factories: name -> (position, keyword) of the flag that adds random augmentations.
TRANSFORM_FACTORIES = {
    "timm.data.create_transform": (1, "is_training"),
    "timm.data.transforms_factory.create_transform": (1, "is_training"),
}
VISION_DATASETS = "torchvision.datasets."
# torchvision datasets: name -> positions of `transform` and `target_transform` (always accepted by keyword).
VISION_TRANSFORM_POSITIONS = {
    "ImageFolder": (1, 2), "DatasetFolder": (3, 4), "CIFAR10": (2, 3), "CIFAR100": (2, 3), "MNIST": (2, 3),
    "FashionMNIST": (2, 3), "KMNIST": (2, 3), "FakeData": (3, 4),
}
TRANSFORM_KEYWORDS = ("transform", "target_transform", "transforms")
# Datasets built from other datasets: name -> position of the dataset (or list of datasets) argument.
DATASET_WRAPPERS = {
    "torch.utils.data.Subset": 0, "torch.utils.data.random_split": 0, "torch.utils.data.ConcatDataset": 0,
    "torch.utils.data.ChainDataset": 0,
}
DETERMINISTIC_DATASETS = frozenset({"torch.utils.data.TensorDataset"})
# Methods that run in a DataLoader worker for each sample or batch (of a dataset, or of a transform object).
WORKER_METHODS = ("__getitem__", "__getitems__", "__iter__", "__next__", "__call__", "forward")

# --- models ---------------------------------------------------------------------------------------------------
# torch.nn layers whose parameters are drawn from torch's global generator when constructed.
RANDOM_INIT_LAYERS = frozenset({
    "Linear", "Bilinear", "LazyLinear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
    "ConvTranspose3d", "LazyConv1d", "LazyConv2d", "LazyConv3d", "Embedding", "EmbeddingBag", "RNN", "LSTM",
    "GRU", "RNNCell", "LSTMCell", "GRUCell", "Transformer", "TransformerEncoderLayer",
    "TransformerDecoderLayer", "MultiheadAttention",
})
MODULE_BASES = frozenset({
    "torch.nn.Module", "lightning.pytorch.LightningModule", "transformers.PreTrainedModel",
    "transformers.modeling_utils.PreTrainedModel",
})
MODEL_FACTORIES = frozenset({"timm.create_model", "torch.hub.load"})
MODEL_FACTORY_PREFIXES = ("torchvision.models.",)
# Members of a factory prefix that build no model: look-ups of names, builders and weights, and wrappers of a
# model built elsewhere. Any member named `*_Weights` (an enum of weights, and its entries and methods) is one
# too, and so is any name beginning with `_` (but `models.__dict__[name]()`, which calls a builder).
NOT_MODEL_MEMBERS = frozenset({
    "list_models", "get_model_weights", "get_weight", "get_model_builder", "register_model", "Weights",
    "WeightsEnum", "feature_extraction", "get_graph_node_names", "create_feature_extractor",
    "load_state_dict_from_url",
})
WEIGHTS_ENUM_SUFFIX = "_Weights"
# Calls that return torchvision weights (an entry, or the enum of an arch): `weights=get_weight(...)` is pretrained.
WEIGHTS_LOOKUPS = frozenset({"torchvision.models.get_weight", "torchvision.models.get_model_weights"})
# `X.from_pretrained(...)` / `X.from_config(...)` on a transformers name builds a model unless X is one of these.
NOT_MODEL_SUFFIXES = ("Tokenizer", "TokenizerFast", "Config", "Processor", "FeatureExtractor", "ImageProcessor")
MODEL_BUILDER_METHODS = frozenset({"from_pretrained", "from_config"})
# Functions (transformers' and the project's own) that build a model and then overwrite its initial weights with
# a checkpoint: the initialisation draws nothing that matters.
PRETRAINED_LOADERS = frozenset({"from_pretrained"})
# ...unless the checkpoint lacks a task head, which is then initialised randomly: transformers classes named
# with one of these words, or a from_pretrained call given one of these keywords.
NEW_HEAD_WORDS = ("Classification", "QuestionAnswering", "MultipleChoice", "Segmentation", "ObjectDetection",
                  "ForCTC")
NEW_HEAD_KEYWORDS = ("num_labels", "id2label", "ignore_mismatched_sizes")
# Model factories whose weights come from a checkpoint with these arguments: name -> (keyword, value that means
# pretrained: True, or None for "weights that are surely given": a non-empty string, a `*_Weights` entry or a
# lookup of one, not None, `"DEFAULT" if args.pretrained else None` or a value the linter cannot know), and the
# keyword that asks for a new classifier head.
PRETRAINED_FACTORIES: dict[str, tuple[tuple[str, bool | None], ...]] = {
    "torchvision.models.": (("weights", None), ("pretrained", True)),  # weights: a string, enum or entry
    "timm.create_model": (("pretrained", True),),
}
NEW_CLASSIFIER_KEYWORDS = {"timm.create_model": "num_classes"}

# --- deterministic mode ------------------------------------------------------------------------------------------
DETERMINISM_ENABLERS = frozenset({
    "torch.use_deterministic_algorithms", "torch.set_deterministic_debug_mode", "torchrepro.deterministic",
    "torchrepro.determinism.deterministic", "torchrepro.control.determinism.deterministic",
    "transformers.enable_full_determinism",
    "transformers.trainer_utils.enable_full_determinism", "accelerate.utils.enable_full_determinism",
})
LIGHTNING_TRAINER = "lightning.pytorch.Trainer"
HF_TRAINING_ARGUMENTS = frozenset({"transformers.TrainingArguments", "transformers.Seq2SeqTrainingArguments"})
CUDNN = "torch.backends.cudnn"

# --- CUDA ------------------------------------------------------------------------------------------------------
# torch.cuda functions that do not create a CUDA context or touch cuBLAS.
CUDA_HARMLESS = frozenset({
    "is_available", "device_count", "manual_seed", "manual_seed_all", "is_initialized", "get_device_name",
    "get_device_capability", "get_device_properties", "current_device", "memory_allocated", "empty_cache",
})

# Signs that code runs on a GPU (TR203 reports ops that vary only on CUDA only where there is one; lint/devices.py).
# torch.cuda members that neither put work on a GPU nor say the program means to (seeding helpers of CPU-only
# scripts call them too); every other torch.cuda member, and every torch.accelerator one, is a sign.
CUDA_NOT_USE = frozenset({
    "is_available", "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state",
    "get_rng_state_all", "set_rng_state", "set_rng_state_all", "is_initialized",
})
ACCELERATOR = "torch.accelerator"  # torch >= 2.6: current_accelerator(), the device of whatever GPU there is
CUDA_STRINGS = frozenset({"cuda", "gpu", "nccl"})  # also "cuda:N" and "torch.cuda.*" (set_default_tensor_type)
# Objects holding command-line or configuration options: `.to(args.device)` picks a device at run time.
OPTION_HOLDERS = frozenset({"args", "opt", "opts", "options", "cfg", "config", "conf", "hparams", "hp", "flags",
                            "params", "training_args"})
DEVICE_WORDS = ("device", "gpu", "cuda", "rank")
RANK_NAMES = frozenset({"rank", "local_rank", "gpu", "gpu_id", "device_id", "gpu_index"})  # `.to(rank)`: a GPU
DATA_PARALLEL = frozenset({"torch.nn.DataParallel", "torch.nn.parallel.DataParallel", "deepspeed.initialize"})
DDP = frozenset({"torch.nn.parallel.DistributedDataParallel", "torch.nn.DistributedDataParallel"})
ACCELERATE = "accelerate.Accelerator"
FABRIC = "lightning.fabric.Fabric"

# --- distributed ----------------------------------------------------------------------------------------------
DIST_INIT = frozenset({
    "torch.distributed.init_process_group", "torch.nn.parallel.DistributedDataParallel",
    "torch.distributed.fsdp.FullyShardedDataParallel", "deepspeed.initialize",
    "torch.distributed.device_mesh.init_device_mesh",
})
RANK_WORDS = ("rank", "get_rank", "process_index", "global_rank", "local_rank")

# --- processes ------------------------------------------------------------------------------------------------
# Calls that run a function in a new process: name -> (position of the function, its keyword, start method).
# A start method of None is the platform's default: fork on Linux before Python 3.14, forkserver on Linux
# from 3.14, spawn on macOS and Windows. Only a forked child inherits the parent's generator states.
PROCESS_STARTERS: dict[str, tuple[int, str, str | None]] = {
    "torch.multiprocessing.spawn": (0, "fn", "spawn"),
    "torch.multiprocessing.start_processes": (0, "fn", "spawn"),
    "multiprocessing.Process": (1, "target", None),
    "torch.multiprocessing.Process": (1, "target", None),
}
START_METHOD_ARGUMENT = {"torch.multiprocessing.start_processes": (5, "start_method")}
# `ctx.Process(target=fn)` on a context from get_context(method): (position of the function, its keyword).
CONTEXT_PROCESS = ("Process", 1, "target")
GET_CONTEXT = frozenset({"multiprocessing.get_context", "torch.multiprocessing.get_context"})
SET_START_METHOD = frozenset({"multiprocessing.set_start_method", "torch.multiprocessing.set_start_method"})
PARTIAL = "functools.partial"
# Keyword arguments whose function runs somewhere else (DataLoader workers, pool workers): not followed.
DEFERRED_CALLBACKS = frozenset({"worker_init_fn", "initializer"})

# --- logging a seed -------------------------------------------------------------------------------------------
# Calls that record their arguments (by the last part of the name: print, logger.info, writer.add_text, ...).
LOG_CALL_NAMES = frozenset({
    "print", "info", "debug", "warning", "warn", "error", "critical", "exception", "log", "write", "log_param",
    "log_params", "log_hyperparams", "add_text", "save_hyperparameters", "dump", "dumps", "pprint", "echo",
})
LOG_CALLS = frozenset({"wandb.init", "wandb.config.update"})

# --- checkpoints ----------------------------------------------------------------------------------------------
# torch.optim optimizers: name -> what a checkpoint without their state_dict() loses on resuming (TR502).
OPTIMIZER_STATE = {
    "Adam": "moment estimates restart at zero", "AdamW": "moment estimates restart at zero",
    "Adamax": "moment estimates restart at zero", "NAdam": "moment estimates restart at zero",
    "RAdam": "moment estimates restart at zero", "SparseAdam": "moment estimates restart at zero",
    "Adafactor": "moment estimates restart at zero", "Adagrad": "accumulated squared gradients restart at zero",
    "Adadelta": "running averages restart at zero", "RMSprop": "running averages restart at zero",
    "Rprop": "step sizes restart from their initial values", "ASGD": "averages restart",
    "LBFGS": "curvature history restarts empty", "SGD": "momentum buffers restart at zero",
}
STATELESS_UNLESS = {"SGD": ("momentum", 2)}  # SGD keeps no state without momentum (keyword, position)
# Words that mark a checkpoint meant to resume training, or a file that is an export of the weights.
RESUME_WORDS = ("resume", "resumes", "resumed", "resuming", "continue training", "continue from", "restart training")
CHECKPOINT_NAME_WORDS = ("checkpoint", "ckpt", "resume", "last", "latest")
EXPORT_NAME_WORDS = ("final", "best", "export", "deploy", "infer", "pretrained")
SAVE_CALLS = frozenset({"torch.save"})
RNG_STATE_CALLS = frozenset({
    "torch.get_rng_state", "torch.cuda.get_rng_state", "torch.cuda.get_rng_state_all", "numpy.random.get_state",
    "random.getstate", "torchrepro.RNGState.capture", "torchrepro.rng.RNGState.capture",
    "torchrepro.control.rng.RNGState.capture",
})
RNG_STATE_METHODS = frozenset({"get_state", "getstate", "get_rng_state", "get_rng_state_all", "capture"})
RNG_KEY_WORDS = ("rng", "random_state", "torch_state", "numpy_state", "python_state", "cuda_state")
POSITION_KEY_WORDS = ("epoch", "step", "iter", "batch", "sampler", "position", "loader", "samples_seen")
OPTIMIZER_WORDS = ("optim", "opt")
NOT_MODEL_WORDS = ("sched", "scaler", "lr", "ema_decay", "args", "config", "cfg", "metric", "best", "loss", "acc")
