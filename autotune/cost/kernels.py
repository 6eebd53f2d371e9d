"""Kernel rates of one GPU for one plan: GEMMs, attention, memory-bound kernels, FP8 casts.

Each rate is a measured fact of the GPU (``GPUSpec.kernel_facts()``, from ``autotune/presets/gpus.yaml``) times
the few fitted, GPU-independent parameters of :class:`~autotune.cost.efficiency.Efficiency`:

* a GEMM of [m x k] @ [k x n] runs at ``peak(precision) x gemm_fraction(precision) x gemm_peak_fraction x
  shape``, with ``shape = prod(d / (d + half))`` over the three dimensions and ``half = gemm_half_dim x
  peak / HBM bandwidth`` (the GPU's machine balance in FLOP/byte: a GEMM with a dimension near it is
  bandwidth-bound, so a faster GPU needs wider matrices; OpenXLA's sm_90 table shows 4096x4096x256 at half
  the rate of 4096^3 on H100, tests/cost/test_kernels.py checks the curve against it);
* causal fused attention at ``peak(16-bit) x attention_fraction(kernel) x gemm_peak_fraction``, the asymptote of
  long calls (``autotune.cost.attention_seq`` scales it by ``L / (L + a)`` for calls of ``L`` keys), the kernel the
  plan's engine runs (FlashAttention-2 through torch SDPA, FA3-class cuDNN attention through Transformer
  Engine on Hopper), falling back to the generation the GPU has; where the fraction is another GPU's (a part
  whose attention is not measured takes its sibling's, ``KernelFacts.attention_exp_tera_per_s``), each executed
  exponential of the softmax costs ``(1 / sfu_exp(this GPU) - 1 / sfu_exp(that GPU)) / gemm_peak_fraction`` more
  (``Rates.exp_delta_s``): on Blackwell the softmax's exponentials run on the special function units between a
  tile's two GEMMs and the tensor cores wait for them (NVIDIA technical blog "Making Softmax More Efficient with
  NVIDIA Blackwell Ultra": on GB200 BMM2 waits for the softmax's MUFU.EX2 work, which Blackwell Ultra's doubled
  SFU throughput halves; Together AI, FlashAttention-4: the B200 forward is bound by the exponential units),
  so the kernel's time moves by the exponentials' time;
* memory-bound kernels at ``HBM x hbm_fraction x hbm_efficiency``.

FP8 (``fp8_recipe``): only the linear layers' GEMMs run at the FP8 rate (its own reachable fraction); every FP8
GEMM first casts its inputs (``FP8_CAST_BYTES``: bytes moved per element cast, by recipe) and attention, norms,
the output layer and communication stay 16-bit (FP8 attention: ``autotune.cost.fp8_attention``; the MXFP8 output
layer: ``autotune.cost.fp8_head``). FP4 (NVFP4, ``autotune.specs.nvfp4``) the same at the GPU's FP4
tensor-core rate, each operand quantised as ``NVFP4_CAST_BYTES`` says.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.cost.efficiency import Efficiency
from autotune.specs.hardware import GB, ClusterSpec
from autotune.specs.nvfp4 import FP4_PRECISION, NVFP4_CAST_BYTES
from autotune.specs.plan import FP8_BLOCK_SCALE_BYTES, FP8_RECIPES

__all__ = ["Rates", "rates", "FP8_RECIPES", "FP8_CAST_BYTES", "DERIVED_ATTENTION_KERNELS", "TRITON_FLASH",
           "GROUPED_ROWS_HALF_DIM"]

GROUPED_ROWS_HALF_DIM = 0.92
"""The routed experts' grouped GEMM (E experts, r rows each): its rate over the rows per expert, r / (r + half) with
``half = GROUPED_ROWS_HALF_DIM x`` the GPU's machine balance (FLOP/byte), the experts' k and n on the dense curve.
Measured: ``torch._grouped_mm`` (CUTLASS grouped GEMM on sm90, the kernel torchtitan's MoE runs) over 56 expert
shapes (8-128 experts of Qwen3-30B-A3B, GPT-OSS-120B and DeepSeek-V3, 64-4,096 rows each) on one H200
(bench/data/h200_kernels.json, bench/gpu_probe/kernels.py): the rows' half-rate point that makes the model/measured
ratio flattest over r is 190 rows = 0.92 x the H200's 206 FLOP/byte (log spread 0.18; median ratio 1.07, the dense
GEMMs' 1.11 beside them): at 2,048 rows a grouped GEMM runs 8% slower than a dense one of the same shape, at 512
31%. With the dense curve's 27 rows the ratio fell from 3.5 (64 rows) to 1.20 (4,096). Other GPUs: the same
multiple of their balance, an assumption (as for ``Efficiency.gemm_half_dim``); TE's grouped GEMM (cuBLASLt) is
taken to behave as CUTLASS's.

The balance is the 16-bit one at every precision: what a few rows per expert cannot amortise is the expert's weight
read, 2 k n FLOPs per row against k n weight elements, and an FP8 (NVFP4) weight element is a half (a quarter) of
a 16-bit one's bytes while its tensor-core rate is twice (four times) as high, so the row count where the read
stops mattering stays where the 16-bit measurement put it. DeepGEMM's FP8 grouped GEMMs on H800
(bench/data/deepgemm_h800_fp8.csv, ``python bench/grouped_fp8_rows.py``) run 0.70-0.74 / 0.78-0.82 / 0.79-0.97 of
their dense 4,096-row rate at 256 / 512 / 1,024 rows per expert: flatter still, a hand-tuned kernel; on H100 this
curve gives 0.49 / 0.67 / 0.81 with the 16-bit balance and 0.33 / 0.49 / 0.67 with the FP8 one."""

TRITON_FLASH = "fa-triton"
"""FlashAttention in pre-MLIR Triton (HazyResearch flash-attention eff9fe6b flash_attn/flash_attn_triton.py), the
kernel llm-foundry's MPT ran with ``attn_impl: triton`` (llm-foundry b2a43a147, the commit that added the MPT
benchmark tables: scripts/train/benchmarking/submit_benchmarks.py:144 ``--attn_impl`` default ``'triton'``;
llmfoundry/models/layers/flash_attn_triton.py, "Copied from" that file)."""

DERIVED_ATTENTION_KERNELS = {TRITON_FLASH: ("fa2", 1 / 1.3)}
"""Attention kernels without a per-GPU measured fraction, as (measured kernel, rate relative to it). Triton
FlashAttention: "FlashAttention-2 is 1.7-3.0x faster than FlashAttention, 1.3-2.5x faster than FlashAttention in
Triton" (Dao 2023, arXiv 2307.08691, Sec. 4, A100, forward + backward, sequence 512-16k, head dim 64 / 128, with
and without the causal mask). The smallest gap of that range is taken (an assumption: the Triton kernel splits its
forward over query blocks and, autotuned, its backward over key blocks (llm-foundry b2a43a147
flash_attn_triton.py:625 grid ``cdiv(seqlen_q, BLOCK_M)``, :695 ``SEQUENCE_PARALLEL``), so at the long sequences
of the runs that used it the GPU is full, as with FlashAttention-2). Sec. 4.1 splits the gap by pass,
1.3-1.5x forward and about 2x backward, which over a full-recompute step's attention passes (two forwards, a
backward of 2.5 forwards) is 1.7x against the paper's FlashAttention-2 rate; the model's FlashAttention-2 rate is
that of ``attention_fraction`` times ``gemm_peak_fraction`` (0.73 when this was compared, before the key-length
curve of ``autotune.cost.attention_seq`` and its refit to 0.75), so the absolute Triton rates of the two readings
differed by 3%. The kernel's own header: forward + backward slightly slower than FlashAttention-1's CUDA kernel.
Pre-MLIR Triton has no Hopper instructions, nor has FlashAttention-2: the ratio holds on H100 too (an assumption)."""

# Bytes of HBM traffic per element cast to FP8, per recipe (read 16-bit = 2, write FP8 = 1, amax pass = 2):
#   te-delayed: amax from the history, fused into the cast kernel (TE delayed scaling): 2 + 1
#   te-current: a separate amax reduction over the tensor, then the cast (TE Float8CurrentScaling): 2 + 2 + 1
#   torchao-tensorwise: dynamic scaling, amax reduction then cast (torchao.float8 tensorwise): 2 + 2 + 1
#   torchao-rowwise: per-row amax fused with the cast, but each tensor is cast along both axes (rowwise scales
#       differ per axis; torchao float8 README: +10.1% vs +25.0% tensorwise on Llama3-8B): 2 x (2 + 1)
#   te-blockwise / te-mxfp8: one kernel reads the 16-bit tensor once, takes each block's amax in registers and
#       writes a row-wise and a column-wise FP8 copy with their scales (TE MXFP8BlockScaling / Float8BlockScaling:
#       "both versions are computed from the high precision input"; scale bytes: specs.plan.FP8_BLOCK_SCALE_BYTES,
#       the 1-D blocks of activations and gradients): 2 + 2 x (1 + scale)
# Their GEMMs run at the GPU's FP8 peak: Blackwell's fifth-generation tensor cores take the MX block scales in the
# MMA (NVIDIA DGX B200 datasheet: 72 PFLOPS "FP8 and FP6" for 8 GPUs with sparsity, one figure for FP8 and the
# MX formats; B200 = 4.5 PFLOPS dense FP8, autotune/presets/gpus.yaml); Hopper's block-scaled FP8 GEMM applies the
# scales per 128-wide K block in the accumulator (TE forces use_split_accumulator for Float8BlockScaling): no
# published rate beside the FP8 peak, so the FP8 rate too (an assumption).
#   torchao-mxfp8: torchao's MX linear casts each GEMM operand once per axis it is needed along, each cast reading the
#       16-bit source (torchao v0.16.0 prototype/mx_formats/mx_linear.py mx_mm: input, weight and grad_output each
#       through MXTensor.to_mx along dim 0 and _to_mxfp8_dim1_kernel_wrapper along dim 1; v0.18.0
#       moe_training/mxfp8_linear.py the same): 2 x (2 + 1 + scale)
_MX_ACT_SCALE = FP8_BLOCK_SCALE_BYTES["torchao-mxfp8"][0]
FP8_CAST_BYTES = {"te-delayed": 3.0, "te-current": 5.0, "torchao-tensorwise": 5.0, "torchao-rowwise": 6.0,
                  **{r: 2.0 + 2 * (1.0 + act) for r, (act, _) in FP8_BLOCK_SCALE_BYTES.items() if r.startswith("te-")},
                  "torchao-mxfp8": 2 * (2.0 + 1.0 + _MX_ACT_SCALE)}
if tuple(FP8_CAST_BYTES) != FP8_RECIPES:  # the plan's names (autotune.specs.plan) and their costs, one list
    raise AssertionError(f"FP8_CAST_BYTES {tuple(FP8_CAST_BYTES)} != the plan's FP8_RECIPES {FP8_RECIPES}")


@dataclass(frozen=True, slots=True)
class Rates:
    """Per-second rates of one GPU under one plan (FLOP/s, bytes/s) and the GEMM shape scale."""

    linear_peak: float
    """FLOP/s of a large linear-layer GEMM at the plan's precision (FP8 for fp8 plans, FP4 for fp4 ones)."""
    linear_half: float
    bf16_peak: float
    """FLOP/s of a large 16-bit GEMM (output layer, router, unfused attention)."""
    bf16_half: float
    attention: float
    """FLOP/s of the fused attention kernel (executed FLOPs) on long calls: ``attention_seq.key_length_factor``
    scales it for the key length of each call."""
    attention_kernel: str
    hbm: float
    cast_bytes: float
    """HBM bytes per element cast to FP8 or NVFP4 (0 in 16-bit)."""
    cuda_core_peak: float = 0.0
    """FLOP/s of a 16-bit GEMM that cannot take the tensor-core path (``unaligned_s``): the GPU's FP32 CUDA-core
    peak (datasheet) x gemm_peak_fraction; 0 where the preset gives no FP32 figure (then the tensor-core rate)."""
    cuda_core_half: float = 0.0
    grouped_half: float = 0.0
    """The rows per expert at which a grouped GEMM runs at half its shape's rate (``GROUPED_ROWS_HALF_DIM``); 0: the
    dense curve's ``linear_half``."""
    exp_delta_s: float = 0.0
    """Seconds each executed softmax exponential of the fused attention takes beyond (negative: short of) those of
    the GPU ``attention_fraction`` was taken from (module docstring); 0 where the fraction is this GPU's own."""

    @staticmethod
    def shape(half: float, m: float, k: float, n: float) -> float:
        return (m / (m + half)) * (k / (k + half)) * (n / (n + half))

    def linear_s(self, flops: float, m: float, k: float, n: float) -> float:
        return flops / (self.linear_peak * self.shape(self.linear_half, m, k, n))

    def grouped_s(self, flops: float, rows: float, k: float, n: float) -> float:
        """The routed experts' grouped GEMM at the linear layers' precision, ``rows`` per expert."""
        half = self.grouped_half or self.linear_half
        return flops / (self.linear_peak * (rows / (rows + half)) * (k / (k + self.linear_half))
                        * (n / (n + self.linear_half)))

    def bf16_s(self, flops: float, m: float, k: float, n: float) -> float:
        return flops / (self.bf16_peak * self.shape(self.bf16_half, m, k, n))

    def unaligned_s(self, flops: float, m: float, k: float, n: float) -> float:
        """A 16-bit GEMM whose operands are not 16-byte aligned: the tensor-core kernels load 128-bit vectors
        (cp.async of 16 bytes on sm_80; NVIDIA's Matrix Multiplication Background guide, "Tensor Core
        Requirements": dimensions and strides in multiples of 16 bytes), so the library runs it on the CUDA
        cores, at the FP32 FMA rate (A100: 19.5 of 312 TFLOP/s)."""
        if self.cuda_core_peak <= 0:
            return self.bf16_s(flops, m, k, n)
        return flops / (self.cuda_core_peak * self.shape(self.cuda_core_half, m, k, n))


def _peak(cluster: ClusterSpec, precision: str) -> float:
    gpu = cluster.gpu
    if gpu.supports(precision):
        return gpu.peak_flops_per_s(precision)
    if precision == "bf16" and gpu.supports("fp16"):
        return gpu.peak_flops_per_s("fp16")
    return max(gpu.peak_tflops.values()) * 1e12


_rates_cache: dict[tuple, tuple[ClusterSpec, Efficiency, Rates]] = {}


def rates(cluster: ClusterSpec, precision: str, eff: Efficiency, attention_kernel: str,
          fp8_recipe: str | None) -> Rates:
    """The rates of ``cluster``'s GPU for a plan of ``precision`` (``fp8_recipe`` for fp8 plans). Cached (the step
    time asks them for every new stage time, ~10^3 a search, with a few distinct answers): keyed by the specs' ids
    (they hash slowly; frozen, so the same object gives the same rates), each entry keeping its specs, so a reused
    id cannot match."""
    key = (id(cluster), precision, id(eff), attention_kernel, fp8_recipe)
    hit = _rates_cache.get(key)
    if hit is None or hit[0] is not cluster or hit[1] is not eff:
        if len(_rates_cache) > 256:
            _rates_cache.clear()
        hit = _rates_cache[key] = (cluster, eff, _rates(cluster, precision, eff, attention_kernel, fp8_recipe))
    return hit[2]


def _rates(cluster: ClusterSpec, precision: str, eff: Efficiency, attention_kernel: str,
           fp8_recipe: str | None) -> Rates:
    kf = cluster.gpu.kernel_facts()
    hbm_raw = cluster.gpu.hbm_bandwidth_gb_per_s * GB
    sixteen = "fp16" if precision == "fp16" else "bf16"
    linear_prec = precision if cluster.gpu.supports(precision) else sixteen

    def gemm_fraction(prec: str) -> float:
        try:
            return kf.gemm(prec)
        except KeyError:
            return max(kf.gemm_fraction.values())

    bf16_peak = _peak(cluster, sixteen) * gemm_fraction(sixteen) * eff.gemm_peak_fraction
    linear_peak = _peak(cluster, linear_prec) * gemm_fraction(linear_prec) * eff.gemm_peak_fraction
    base, relative = DERIVED_ATTENTION_KERNELS.get(attention_kernel, (attention_kernel, 1.0))
    kernel, attn_fraction = kf.attention(base)
    if relative != 1.0 and kernel == base:  # a GPU without the measured kernel keeps what it falls back to
        kernel, attn_fraction = attention_kernel, attn_fraction * relative
    fp8 = precision == "fp8" and cluster.gpu.supports("fp8")
    cast_bytes = (FP8_CAST_BYTES[fp8_recipe or "te-delayed"] if fp8 else
                  NVFP4_CAST_BYTES if precision == FP4_PRECISION and cluster.gpu.supports(FP4_PRECISION) else 0.0)
    cuda_core = cluster.gpu.peak_flops_per_s("fp32") if cluster.gpu.supports("fp32") else 0.0
    exp_delta = 0.0
    if kf.attention_exp_tera_per_s is not None and kf.sfu_exp_tera_per_s is not None:
        exp_delta = (1 / kf.sfu_exp_tera_per_s - 1 / kf.attention_exp_tera_per_s) / 1e12 / eff.gemm_peak_fraction
    return Rates(linear_peak=linear_peak, linear_half=eff.gemm_half_dim * _peak(cluster, linear_prec) / hbm_raw,
                 bf16_peak=bf16_peak, bf16_half=eff.gemm_half_dim * _peak(cluster, sixteen) / hbm_raw,
                 attention=_peak(cluster, sixteen) * attn_fraction * eff.gemm_peak_fraction, attention_kernel=kernel,
                 hbm=hbm_raw * kf.hbm_fraction * eff.hbm_efficiency,
                 cast_bytes=cast_bytes,
                 cuda_core_peak=cuda_core * eff.gemm_peak_fraction,
                 cuda_core_half=eff.gemm_half_dim * cuda_core / hbm_raw, exp_delta_s=exp_delta,
                 grouped_half=GROUPED_ROWS_HALF_DIM * _peak(cluster, sixteen) / hbm_raw)  # 16-bit: docstring
