#!/usr/bin/env python3
"""The peer of attention_bench: torch scaled_dot_product_attention on the same GPU.

bf16, head dim 64, 12 heads, B x S = 32768 tokens, no mask, no dropout, q, k, v
laid out [B, S, H, D] and seen as [B, H, S, D] (as ours), for each SDPA backend
torch offers here (flash, cuDNN, memory-efficient); then the flash and cuDNN
backends with attention dropout 0.1, as RoFormer-base trains
(torch-flash-dropout, torch-cudnn-dropout: beside our model's kernels with
dropout, whose cost attention_table.sh's "dropout / none" line compares).
FLOPs as FlashAttention counts them: forward 4 B H S^2 D, backward 2.5 x
that. Prints one line per (backend, S) in attention_bench's format:

  attention impl=torch-flash S=512 B=64 H=12 D=64 fwd_ms=... bwd_ms=... fwd_tflops=... bwd_tflops=...

A backend that refuses (not built, not supported on this GPU) is reported as
"attention impl=torch-<name> S=... unavailable: <reason>".
"""
import argparse
import sys

HEADS, DIM, TOKENS = 12, 64, 32768


def time_ms(torch, fn, min_seconds=0.3):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    iters, elapsed = 0, 0.0
    start.record()
    while elapsed < min_seconds * 1e3 or iters % 5:
        fn()
        iters += 1
        if iters % 5 == 0:
            end.record()
            torch.cuda.synchronize()
            elapsed = start.elapsed_time(end)
    return elapsed / iters


# The backends also timed with dropout: the peers a BERT trainer would use.
DROPOUT_P, DROPOUT_BACKENDS = 0.1, ("torch-flash", "torch-cudnn")


def sdpa_backends(torch):
    """(name, context manager factory) for each SDPA backend of this torch."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # torch < 2.3: the older switch, no cuDNN backend
        sdp = torch.backends.cuda.sdp_kernel
        return [
            ("torch-flash", lambda: sdp(enable_flash=True, enable_math=False, enable_mem_efficient=False)),
            ("torch-efficient", lambda: sdp(enable_flash=False, enable_math=False, enable_mem_efficient=True)),
        ]
    names = [("torch-flash", "FLASH_ATTENTION"), ("torch-cudnn", "CUDNN_ATTENTION"),
             ("torch-efficient", "EFFICIENT_ATTENTION")]
    return [(name, lambda b=getattr(SDPBackend, member): sdpa_kernel([b]))
            for name, member in names if hasattr(SDPBackend, member)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("lengths", nargs="*", type=int, default=[512, 1536, 4096, 16384])
    args = parser.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"attention_bench_torch: torch is needed ({e})")
        return 0
    if not torch.cuda.is_available():
        print("attention_bench_torch: no GPU on this machine, nothing measured")
        return 0
    backends = sdpa_backends(torch)
    for S in args.lengths:
        B = max(1, TOKENS // S)
        gen = torch.Generator(device="cuda").manual_seed(S)

        def heads():
            x = torch.randn(B, S, HEADS, DIM, device="cuda", generator=gen, dtype=torch.bfloat16)
            return x.transpose(1, 2)

        q, k, v, grad = heads(), heads(), heads(), heads()
        q.requires_grad_(True)
        k.requires_grad_(True)
        v.requires_grad_(True)
        flops = 4.0 * B * HEADS * S * S * DIM
        runs = [(name, backend, 0.0) for name, backend in backends]
        runs += [(name + "-dropout", backend, DROPOUT_P) for name, backend in backends
                 if name in DROPOUT_BACKENDS]
        for name, backend, p in runs:
            try:
                with backend():
                    fwd = time_ms(torch, lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=p))
                    out = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
                    bwd = time_ms(
                        torch, lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
                    )
            except Exception as e:  # noqa: BLE001 -- a backend this build or GPU lacks
                reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                print(f"attention impl={name} S={S} unavailable: {reason[:160]}")
                continue
            print(
                f"attention impl={name} S={S} B={B} H={HEADS} D={DIM} fwd_ms={fwd:.3f} "
                f"bwd_ms={bwd:.3f} fwd_tflops={flops / fwd * 1e-9:.1f} "
                f"bwd_tflops={2.5 * flops / bwd * 1e-9:.1f}",
                flush=True,
            )
        del q, k, v, grad
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
