#!/usr/bin/env python3
"""PyTorch GPT-2 training-throughput baseline, to compare with ./train on the same shapes.

    python3 bench/pytorch_gpt2.py --preset d12 --micro-batch 16 --steps 50 --warmup 10 --json d12.json
    python3 bench/pytorch_gpt2.py --preset d12 --micro-batch 64 --fp8 rowwise --json d12_fp8.json
    python3 bench/pytorch_gpt2.py --device cpu --preset tiny --micro-batch 2 --seq-len 64 --steps 4 --warmup 1
    python3 bench/pytorch_gpt2.py --preset d48 --micro-batch 4 --grad-accum 4 --optimizer bnb-adamw8bit \
        --checkpoint-blocks --bf16-weights --json d48_lowmem.json

Model: GPT-2 (learned positions, pre-LayerNorm, GELU with tanh, embedding tied to the output
layer, vocabulary padded to 50304 rows whose logits are left out of the loss: --loss mask (default)
adds -inf to the padded columns, --loss slice takes the first 50257; the same function, but on an H200
the compiled masked loss ran 7% faster at GPT-2 124M, B=64: 119.6 against 128.9 ms a step), fp32
parameters, bf16 autocast, F.scaled_dot_product_attention(is_causal=True), torch.compile, fused AdamW
(lr 6e-4, weight decay 0.1 on 2-D weights, betas 0.9/0.95, eps 1e-8), global grad-norm clipping at 1.0.
An optimizer step takes --grad-accum micro-steps of --micro-batch sequences of --seq-len tokens each.

Memory-saving options (what PyTorch users run GPT-2 1558M with on 16-24 GB cards), alone or together:
--optimizer bnb-adamw8bit: bitsandbytes.optim.AdamW8bit, torchao-adamw8bit: torchao.optim.AdamW8bit, both
  with AdamW's learning rate, betas, eps and weight-decay groups: the two moments in 8 bits with one scale
  per block of values. Tensors of fewer than 4096 values keep unquantized moments: fp32 in bitsandbytes,
  the parameter's dtype in torchao, which does the same for tensors whose size is no multiple of its
  256-value blocks. torchao's update is a function torch.compile'd per parameter shape during the first
  optimizer step (leave it to --warmup). Each needs its package (exit 1 naming it if the import fails);
  adamw (the default) is the fused torch.optim.AdamW above, its moments of the parameter's dtype.
--checkpoint-blocks: every transformer block runs under torch.utils.checkpoint.checkpoint(block, x,
  use_reentrant=False): the forward pass keeps only each block's input, the backward pass runs the block's
  forward again (one more forward of the blocks a micro-step, about a third more block FLOPs; MFU still
  counts 6 N + 6 L C T). Under torch.compile, dynamo traces each checkpointed block as a region whose
  activations the compiled backward recomputes, so the two combine (no graph break).
--bf16-weights: the parameters are cast to bf16 (model.to(torch.bfloat16)) before the optimizer is made,
  with no fp32 master copy: gradients (accumulated over --grad-accum micro-steps too) and the optimizer's
  update are on bf16 tensors, each update rounded to nearest bf16 (no stochastic rounding). bf16 autocast
  stays on as without the option (the ops it runs in fp32 still do, the loss still takes fp32 logits), but
  the residual stream, from the embeddings' sum through every block's residual adds, is now bf16 as well.
  It makes bf16 the default --dtype on the CPU too; --dtype fp32 is an error.

--fp8 tensorwise|rowwise: torchao's float8 training (torchao.float8.convert_to_float8_training with
Float8LinearConfig.from_recipe_name) on the four Linear layers of every block: their three products
(forward, input gradient, weight gradient) take FP8 operands with dynamic scales, one per tensor or one
per row, computed from each tensor as it is cast. The output layer (the tied embedding, F.linear) stays
bf16. Needs torchao and a CUDA GPU of compute capability >= 8.9; MFU still counts against the bf16 peak.

Reported numbers (one JSON object):
  median_step_ms   median of per-step times after --warmup steps (CUDA events around each step)
  tokens_per_s     micro_batch * seq_len * grad_accum / median step time
  n_params         parameters without the vocabulary padding rows (GPT-2 124M: 124,439,808),
                   the same count the trainer's log.h5 stores as n_params
  flops_per_token  6 * n_params + 6 * n_layer * n_embd * seq_len (as in docs/FORMATS.md)
  mfu              flops_per_token * tokens_per_s / peak_flops (989.5e12: H100/H200 dense bf16)
  peak_mem_bytes   torch.cuda.max_memory_allocated() over the steps: the most that tensors held at once
                   (CPU: peak resident set size)
  peak_reserved_bytes  torch.cuda.max_memory_reserved() over the steps: the most that PyTorch's caching
                   allocator held from the GPU (what the card must hold, besides the CUDA context);
                   null on the CPU
  fp8, fp8_linears  the --fp8 recipe ("none" without it), how many Linear layers it converted
  optimizer, checkpoint_blocks, bf16_weights  the options above; param_dtype: the parameters' dtype
                   ("float32", or "bfloat16" with --bf16-weights); bitsandbytes_version or
                   torchao_version: the package an 8-bit optimizer or --fp8 came from
Exit status: 0 done, 1 bad input (torchao missing or no FP8-capable GPU for --fp8, the package of an 8-bit
--optimizer missing, --bf16-weights with --dtype fp32 included), 3 out of memory (the JSON then has status
"oom", the shapes and options, and the error's first line as message).
"""
import argparse
import glob
import importlib
import json
import math
import os
import platform
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint
except ImportError:
    print("pytorch_gpt2: error: PyTorch is not installed (pip install torch)", file=sys.stderr)
    sys.exit(1)

VOCAB_SIZE = 50257
PADDED_VOCAB_SIZE = 50304  # next multiple of 128
MAX_SEQ_LEN = 1024
PEAK_FLOPS_BF16 = 989.5e12  # H100/H200 SXM dense bf16
SHARD_MAGIC, SHARD_VERSION, SHARD_HEADER_BYTES = 20240520, 1, 1024

# name: (n_layer, n_head, n_embd)
PRESETS = {
    "tiny": (2, 4, 64),
    "d12": (12, 12, 768),     # GPT-2 124M
    "d24": (24, 16, 1024),    # GPT-2 350M
    "d36": (36, 20, 1280),    # GPT-2 774M
    "d48": (48, 25, 1600),    # GPT-2 1558M
}


@dataclass
class GPTConfig:
    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int = VOCAB_SIZE
    padded_vocab_size: int = PADDED_VOCAB_SIZE
    max_seq_len: int = MAX_SEQ_LEN
    init_std: float = 0.02
    loss: str = "mask"  # how the padded logits are left out: "mask" or "slice"


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)   # weight (3C, C)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)      # weight (C, C), a residual projection

    def forward(self, x):  # x: (B, T, C)
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, hs).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class FeedForward(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)    # weight (4C, C)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)  # weight (C, 4C), a residual projection

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = FeedForward(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg, checkpoint_blocks=False):
        super().__init__()
        self.cfg = cfg
        self.checkpoint_blocks = checkpoint_blocks  # recompute each block's activations in backward
        self.wte = nn.Embedding(cfg.padded_vocab_size, cfg.n_embd)  # (Vp, C), also the output layer
        self.wpe = nn.Embedding(cfg.max_seq_len, cfg.n_embd)        # (maxT, C)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        pad = torch.zeros(cfg.padded_vocab_size)
        pad[cfg.vocab_size:] = float("-inf")
        self.register_buffer("vocab_mask", pad, persistent=False)  # (Vp,): 0, then -inf on the padding
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        std = self.cfg.init_std
        resid_std = std / math.sqrt(2 * self.cfg.n_layer)
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
            elif ".ln" in name or name.startswith("ln_f"):
                p.fill_(1.0)
            elif name.endswith("attn.proj.weight") or name.endswith("mlp.proj.weight"):
                p.normal_(0.0, resid_std)
            else:
                p.normal_(0.0, std)
        self.wte.weight[self.cfg.vocab_size:].zero_()  # padding rows: never used, stay zero

    def n_params(self):
        """Parameters without the vocabulary padding rows."""
        total = sum(p.numel() for p in self.parameters())
        return total - (self.cfg.padded_vocab_size - self.cfg.vocab_size) * self.cfg.n_embd

    def forward(self, idx, targets):  # idx, targets: (B, T) int64
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)  # (B, T, C)
        for block in self.blocks:
            if self.checkpoint_blocks and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        x = self.ln_f(x)
        logits = F.linear(x, self.wte.weight)  # (B, T, Vp)
        if self.cfg.loss == "mask":  # padded columns at -inf: probability 0, gradient 0
            logits = logits.float() + self.vocab_mask
        else:
            logits = logits[..., :self.cfg.vocab_size].float()  # (B, T, V)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def require_fp8(recipe, device):
    """Raises ValueError unless torchao's float8 training can run on this device."""
    try:
        import torchao.float8  # noqa: F401
    except ImportError as e:
        raise ValueError(f"--fp8 {recipe} needs torchao's float8 training (pip install torchao): {e}")
    if device.type != "cuda":
        raise ValueError(f"--fp8 {recipe} needs a CUDA GPU of compute capability >= 8.9 (FP8 tensor "
                         f"cores); this run is on the {device.type}")
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        raise ValueError(f"--fp8 {recipe} needs a CUDA GPU of compute capability >= 8.9 (FP8 tensor cores); "
                         f"{torch.cuda.get_device_name(device)} has {major}.{minor}")


def convert_to_fp8(model, recipe):
    """Swaps the model's nn.Linear layers for torchao's Float8Linear with the given recipe, in place, and
    returns the names of those swapped. Float8Linear keeps the layer's parameters (the optimizer may be
    made before or after). The output layer is F.linear on the embedding, no nn.Linear, so it stays
    bf16; FP8 products need both dimensions of a weight to be multiples of 16 (every preset's are)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    converted = []

    def eligible(module, fqn):
        ok = module.in_features % 16 == 0 and module.out_features % 16 == 0
        if ok:
            converted.append(fqn)
        return ok

    convert_to_float8_training(model, module_filter_fn=eligible,
                               config=Float8LinearConfig.from_recipe_name(recipe))
    if not converted:
        raise ValueError(f"--fp8 {recipe}: no Linear layer has dimensions that are multiples of 16")
    return converted


# --optimizer name: (package, what to import from it, its class)
OPTIMIZER_CLASSES = {
    "bnb-adamw8bit": ("bitsandbytes", "bitsandbytes.optim", "AdamW8bit"),
    "torchao-adamw8bit": ("torchao", "torchao.optim", "AdamW8bit"),
}
OPTIMIZERS = ["adamw", *OPTIMIZER_CLASSES]


def optimizer_class(name):
    """The class of an 8-bit --optimizer, imported now; ValueError naming the package if that fails."""
    package, module, cls = OPTIMIZER_CLASSES[name]
    try:
        return getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"--optimizer {name} needs {module}.{cls} (pip install {package}): {e}")


def make_optimizer(model, lr, weight_decay, betas, fused, name="adamw"):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=1e-8, fused=fused)
    return optimizer_class(name)(groups, lr=lr, betas=betas, eps=1e-8)


class ShardBatches:
    """Consecutive (B, T) batches from llm.c token shards, cycling through the files."""

    def __init__(self, pattern, B, T, device):
        self.files = sorted(glob.glob(pattern))
        if not self.files:
            raise ValueError(f"--data {pattern!r}: no file matches")
        self.B, self.T, self.device = B, T, device
        self.shards = [self._open(f) for f in self.files]
        self.shard, self.pos = 0, 0

    def _open(self, path):
        header = np.fromfile(path, dtype="<i4", count=256)
        if len(header) < 256 or header[0] != SHARD_MAGIC or header[1] != SHARD_VERSION:
            raise ValueError(f"{path}: not an llm.c token shard (expected magic {SHARD_MAGIC}, "
                             f"version {SHARD_VERSION})")
        n = int(header[2])
        expected = SHARD_HEADER_BYTES + 2 * n
        if os.path.getsize(path) != expected:
            raise ValueError(f"{path}: {os.path.getsize(path)} bytes, header says {n} tokens "
                             f"({expected} bytes)")
        if n < self.B * self.T + 1:
            raise ValueError(f"{path}: {n} tokens, fewer than one batch needs ({self.B * self.T + 1})")
        return np.memmap(path, dtype="<u2", mode="r", offset=SHARD_HEADER_BYTES, shape=(n,))

    def next(self):
        need = self.B * self.T + 1
        if self.pos + need > len(self.shards[self.shard]):
            self.shard, self.pos = (self.shard + 1) % len(self.shards), 0
        buf = torch.from_numpy(self.shards[self.shard][self.pos:self.pos + need].astype(np.int64))
        self.pos += self.B * self.T
        if self.device.type == "cuda":
            buf = buf.pin_memory().to(self.device, non_blocking=True)
        return buf[:-1].view(self.B, self.T), buf[1:].view(self.B, self.T)


class RandomBatches:
    """Uniformly random token ids on the device: throughput without a data set."""

    def __init__(self, B, T, device, seed):
        self.B, self.T, self.device = B, T, device
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(seed)

    def next(self):
        buf = torch.randint(0, VOCAB_SIZE, (self.B, self.T + 1), device=self.device, generator=self.gen)
        return buf[:, :-1], buf[:, 1:]


def peak_memory_bytes(device):
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def hardware_name(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="d12", choices=sorted(PRESETS))
    ap.add_argument("--micro-batch", type=int, default=8, help="sequences per micro-step")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--grad-accum", type=int, default=1, help="micro-steps per optimizer step")
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps in all, warm-up included")
    ap.add_argument("--warmup", type=int, default=10, help="first steps left out of the timing")
    ap.add_argument("--data", help="glob of llm.c token shards (default: random tokens)")
    ap.add_argument("--json", help="write the result here (default: stdout only)")
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--dtype", choices=["bf16", "fp32"], help="autocast precision (default bf16 on CUDA or "
                    "with --bf16-weights, else fp32 on CPU)")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="torch.compile the model (default on for CUDA, off for CPU)")
    ap.add_argument("--peak-flops", type=float, help=f"per-device peak FLOP/s for MFU (default "
                    f"{PEAK_FLOPS_BF16:g} on CUDA, none on CPU)")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--loss", choices=["mask", "slice"], default="mask",
                    help="how the padded vocabulary is left out of the loss (the same function either way)")
    ap.add_argument("--fp8", choices=["none", "tensorwise", "rowwise"], default="none",
                    help="torchao float8 training of the blocks' Linear layers, scales per tensor or per row "
                    "(needs torchao and a GPU of compute capability >= 8.9)")
    ap.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw",
                    help="fused torch AdamW, or AdamW with 8-bit moments from bitsandbytes or torchao")
    ap.add_argument("--checkpoint-blocks", action="store_true",
                    help="activation checkpointing of every transformer block (recomputed in backward)")
    ap.add_argument("--bf16-weights", action="store_true",
                    help="parameters, gradients and the optimizer's update in bf16, no fp32 master copy")
    ap.add_argument("--seed", type=int, default=1337)
    args = ap.parse_args(argv)
    for name in ("micro_batch", "seq_len", "grad_accum", "steps"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be > 0")
    if args.seq_len > MAX_SEQ_LEN:
        ap.error(f"--seq-len {args.seq_len} exceeds the {MAX_SEQ_LEN} learned positions")
    if not 0 <= args.warmup < args.steps:
        ap.error(f"--warmup must be in [0, --steps) so that some steps are timed (got {args.warmup})")
    return args


def run(args):
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device visible to PyTorch")
    device = torch.device(args.device)
    dtype = args.dtype or ("bf16" if device.type == "cuda" or args.bf16_weights else "fp32")
    if args.fp8 != "none":
        require_fp8(args.fp8, device)
        if dtype != "bf16":
            raise ValueError(f"--fp8 {args.fp8} runs under bf16 autocast, not --dtype {dtype}")
    if args.bf16_weights and dtype != "bf16":
        raise ValueError(f"--bf16-weights runs under bf16 autocast, not --dtype {dtype}")
    if args.optimizer != "adamw":
        optimizer_class(args.optimizer)  # the package is there, before any model is built
    use_compile = args.compile if args.compile is not None else device.type == "cuda"
    peak_flops = args.peak_flops if args.peak_flops is not None else (
        PEAK_FLOPS_BF16 if device.type == "cuda" else 0.0)
    torch.manual_seed(args.seed)
    torch.set_float32_matmul_precision("high")

    n_layer, n_head, n_embd = PRESETS[args.preset]
    cfg = GPTConfig(n_layer, n_head, n_embd, loss=args.loss)
    B, T, accum = args.micro_batch, args.seq_len, args.grad_accum
    result = {
        "preset": args.preset, **asdict(cfg), "micro_batch": B, "seq_len": T, "grad_accum": accum,
        "tokens_per_step": B * T * accum, "steps": args.steps, "warmup": args.warmup,
        "device": device.type, "hardware": hardware_name(device), "dtype": dtype,
        "compile": use_compile, "data": args.data or "random", "torch_version": torch.__version__,
        "peak_flops": peak_flops, "fp8": args.fp8, "optimizer": args.optimizer,
        "checkpoint_blocks": args.checkpoint_blocks, "bf16_weights": args.bf16_weights,
        "status": "running", "message": "",
    }
    model = GPT(cfg, checkpoint_blocks=args.checkpoint_blocks).to(device)
    if args.bf16_weights:  # before the optimizer and Float8Linear see the parameters
        model.to(torch.bfloat16)
    result["param_dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    if args.fp8 != "none":  # before torch.compile sees the layers
        result["fp8_linears"] = len(convert_to_fp8(model, args.fp8))
        result["torchao_version"] = sys.modules["torchao"].__version__
    n_params = model.n_params()
    flops_per_token = 6 * n_params + 6 * n_layer * n_embd * T
    result.update(n_params=n_params, n_params_padded=sum(p.numel() for p in model.parameters()),
                  flops_per_token=flops_per_token)
    opt = make_optimizer(model, args.lr, args.weight_decay, (0.9, 0.95), fused=device.type == "cuda",
                         name=args.optimizer)
    if args.optimizer != "adamw":
        package = OPTIMIZER_CLASSES[args.optimizer][0]
        result[f"{package}_version"] = getattr(sys.modules[package], "__version__", "unknown")
    step_model = torch.compile(model) if use_compile else model
    batches = ShardBatches(args.data, B, T, device) if args.data else RandomBatches(B, T, device, args.seed)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16")

    def step():
        loss_sum = torch.zeros((), device=device)
        for _ in range(accum):
            x, y = batches.next()
            with autocast:
                loss = step_model(x, y)
            (loss / accum).backward()
            loss_sum += loss.detach()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip) if args.grad_clip > 0 \
            else torch.zeros((), device=device)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss_sum / accum, norm.detach()

    losses, norms, times_ms = [], [], []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(args.steps)]
        for start, end in events:
            start.record()
            loss, norm = step()
            end.record()
            losses.append(loss)
            norms.append(norm)
        torch.cuda.synchronize(device)
        times_ms = [s.elapsed_time(e) for s, e in events]
    else:
        for _ in range(args.steps):
            t0 = time.perf_counter()
            loss, norm = step()
            times_ms.append((time.perf_counter() - t0) * 1000.0)
            losses.append(loss)
            norms.append(norm)

    timed = times_ms[args.warmup:]
    median_ms = statistics.median(timed)
    tokens_per_s = B * T * accum / (median_ms / 1000.0)
    result.update(
        status="ok",
        median_step_ms=median_ms,
        mean_step_ms=statistics.fmean(timed),
        step_ms=times_ms,
        tokens_per_s=tokens_per_s,
        tokens_per_s_per_gpu=tokens_per_s,
        mfu=flops_per_token * tokens_per_s / peak_flops if peak_flops > 0 else None,
        peak_mem_bytes=peak_memory_bytes(device),
        peak_reserved_bytes=torch.cuda.max_memory_reserved(device) if device.type == "cuda" else None,
        losses=[float(v) for v in losses],
        grad_norms=[float(v) for v in norms],
        final_loss=float(losses[-1]),
    )
    return result


def write_result(result, path):
    text = json.dumps(result, indent=1)
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(text + "\n")
        os.replace(tmp, path)


def main(argv=None):
    args = parse_args(argv)
    code = 0
    try:
        result = run(args)
    except ValueError as e:
        print(f"pytorch_gpt2: error: {e}", file=sys.stderr)
        return 1
    except torch.cuda.OutOfMemoryError as e:
        result = {"preset": args.preset, "micro_batch": args.micro_batch, "seq_len": args.seq_len,
                  "grad_accum": args.grad_accum, "fp8": args.fp8, "optimizer": args.optimizer,
                  "checkpoint_blocks": args.checkpoint_blocks, "bf16_weights": args.bf16_weights,
                  "status": "oom", "message": str(e).splitlines()[0]}
        code = 3
    write_result(result, args.json)
    if result["status"] == "ok":
        mfu = f"{100 * result['mfu']:.1f}%" if result["mfu"] is not None else "n/a"
        options = [args.optimizer] + ["checkpointed blocks"] * args.checkpoint_blocks + \
            ["bf16 weights"] * args.bf16_weights
        print(f"{args.preset} B={args.micro_batch} T={args.seq_len} accum={args.grad_accum} "
              f"({', '.join(options)}) {result['hardware']}: {result['median_step_ms']:.1f} ms/step, "
              f"{result['tokens_per_s']:,.0f} tokens/s, MFU {mfu}, "
              f"peak {result['peak_mem_bytes'] / 2**30:.2f} GiB, final loss {result['final_loss']:.4f}")
    else:
        print(f"pytorch_gpt2: out of memory: {result['message']}", file=sys.stderr)
    if not args.json:
        print(json.dumps(result))
    return code


if __name__ == "__main__":
    sys.exit(main())
