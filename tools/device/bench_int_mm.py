"""torch._int_mm and torch._scaled_mm on the Llama-3-8B decoder linears at M = 4096: the peers
bench_quant_linears' large-M rows are measured against (run in the same device call). CUDA-event
timed, 200 launches after 3 warm-ups, the mean per launch."""
import torch

SHAPES = [("qkv", 6144, 4096), ("o_proj", 4096, 4096), ("gate_up", 28672, 4096),
          ("down", 4096, 14336)]


def time_us(fn, reps=200):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def main():
    print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__)
    m = 4096
    for name, n, k in SHAPES:
        a = torch.randint(-127, 127, (m, k), dtype=torch.int8, device="cuda")
        b = torch.randint(-127, 127, (n, k), dtype=torch.int8, device="cuda")
        us_int = time_us(lambda: torch._int_mm(a, b.t()))
        af = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        bf = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
        sa = torch.rand(m, 1, device="cuda")
        sb = torch.rand(1, n, device="cuda")
        us_fp8 = time_us(lambda: torch._scaled_mm(af, bf.t(), scale_a=sa, scale_b=sb,
                                                  out_dtype=torch.bfloat16))
        flops = 2.0 * m * n * k
        print(f"llama3-8b {name} M={m} N={n} K={k}: torch._int_mm {us_int:.1f} us "
              f"({flops / us_int / 1e6:.0f} TOP/s); torch._scaled_mm fp8 per-token/per-channel "
              f"{us_fp8:.1f} us ({flops / us_fp8 / 1e6:.0f} TFLOP/s)")


if __name__ == "__main__":
    main()
