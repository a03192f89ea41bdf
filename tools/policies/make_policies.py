#!/usr/bin/env python3
"""Writes tests/accuracy/policies/<scheme>.json: every threshold with the derivation behind it.

Run from the repository root: python3 tools/policies/make_policies.py
The numbers come from the formats' step sizes and the reduction lengths, as written in each
section's "derivation"; nothing here is fitted to a measurement.
"""
import json
import math
import pathlib

BF16_ULP = 2.0 ** -8  # relative spacing of bf16 at the bottom of a binade (7 stored mantissa bits)

# scheme -> (family, relative half-step of the format at its largest code, description)
#   int8 absmax: half step = 0.5/127 of amax; int4: 0.5/7; e4m3: 2^-4 of the value (3 mantissa
#   bits); e2m1: 2^-2 (1 mantissa bit) at the top binade; MX adds up to 2x from the power-of-two
#   scale.
SCHEMES = {
    "bf16": ("none", 0.0, "unquantized (bf16 weights)"),
    "w8a16-ch": ("weight", 0.5 / 127, "int8 per-channel weights"),
    "w8a16-g64": ("weight", 0.5 / 127, "int8 group-64 weights"),
    "w8a8-static": ("int8act", 0.5 / 127, "int8 weights, static int8 activations"),
    "w8a8s": ("int8act", 0.5 / 127, "int8 weights (sparse layout), static int8 activations"),
    "w8a8-int8-dyn": ("int8act", 0.5 / 127, "int8 weights, dynamic per-token int8 activations"),
    "smoothquant": ("int8act", 0.5 / 127, "smooth-quant folded int8 W8A8"),
    "w4a16-g32": ("weight", 0.5 / 7, "int4 group-32 weights"),
    "mxint4": ("weight", 0.5 / 7 * 2, "int4 group-32 weights, power-of-two scales"),
    "fp8-tensor": ("fp8act", 2.0 ** -4, "e4m3 weights and activations, per-tensor scales"),
    "fp8-channel": ("fp8act", 2.0 ** -4, "e4m3 weights per channel, activations per token"),
    "fp8-block": ("fp8act", 2.0 ** -4, "e4m3 128x128 weight blocks, 1x128 activation groups"),
    "mxfp8": ("fp8act", 2.0 ** -4 * 2, "e4m3 elements, E8M0 block-32 scales"),
    "nvfp4": ("fp4act", 2.0 ** -2, "e2m1 elements, e4m3 group-16 scales, global scale"),
    "mxfp4": ("fp4act", 2.0 ** -2 * 2, "e2m1 elements, E8M0 block-32 scales"),
    "kv-int8": ("kv", 0.5 / 127, "int8 KV cache (msModelSlim C8)"),
    "kv-fp8": ("kv", 2.0 ** -4, "e4m3 KV cache"),
}

# bf16 rounding flips between a correct engine and the reference (emulate mode): fp32 dot
# products of length K differ from the fp64 ones by ~sqrt(K) 2^-24 relative, which moves a value
# across a bf16 rounding boundary with probability ~sqrt(K) 2^-24 / 2^-8 = sqrt(K) 2^-16
# (K = 4096: ~1e-3).
P_BF16_FLIP = math.sqrt(4096) * 2.0 ** -16


def engine_default(family, half_step):
    # bf16 part: each flip moves an element by one ULP (2^-8 relative): RMS 2^-8 sqrt(1e-3) ~
    # 1.2e-4 per op, compounding over the stored ops of a layer and the layers above; half a ULP
    # in RMS (2^-9 = 1.95e-3) bounds that with margin and still catches a one-ULP shift of a whole
    # tensor (>= 2^-8 = 3.9e-3 relative).
    bf16_part = BF16_ULP / 2
    if not family.endswith("act"):
        return bf16_part
    # Activation codes: the engine quantizes inputs that differ from the reference's by those
    # bf16 flips; a flipped input (1e-3 of them, moved by 2^-8) crosses a code boundary with
    # probability 2^-8 / step, and then moves by one step: RMS sqrt(p_flip 2^-8 / step) * step =
    # sqrt(p_flip 2^-8 step). Independent of the bf16 part: added in quadrature.
    step = 2 * half_step
    flip_part = math.sqrt(P_BF16_FLIP * BF16_ULP * step)
    return math.hypot(bf16_part, flip_part)


def section_engine_default(scheme, family, half_step, desc):
    t = engine_default(family, half_step)
    deriv = (
        f"{scheme} ({desc}), engine vs the reference golden of the same scheme in emulate mode. "
        "bf16 storage: fp32 accumulation order flips the bf16 rounding of ~sqrt(K)*2^-16 of "
        "elements by one ULP (2^-8 relative), RMS ~1.2e-4 per op for K = 4096; bound: half a bf16 "
        "ULP in RMS, 2^-9 = 1.95e-3, which still catches a one-ULP shift of a whole tensor "
        "(>= 2^-8 = 3.9e-3).")
    if family.endswith("act"):
        step = 2 * half_step
        deriv += (
            f" Activation codes: the engine quantizes inputs that differ by those bf16 flips "
            f"(p ~ {P_BF16_FLIP:.2g}, by 2^-8); one crosses a code boundary with probability "
            f"2^-8/step (step {step:.4g} relative at the top code) and then moves by one step: "
            f"RMS sqrt(p 2^-8 step) = {math.sqrt(P_BF16_FLIP * BF16_ULP * step):.3g}, added in "
            f"quadrature.")
    deriv += f" Point threshold rel_l2 <= {t:.3g}."
    return {
        "derivation": deriv,
        "provenance": "derived (tools/policies/make_policies.py); no GPU measurement folded in",
        "points": [
            {"match": "*.moe.topk_ids", "max_mismatches": 0,
             "why": "router ids are integers: a flip changes which experts run; it is reported "
                    "per layer and not tolerated silently"},
            {"match": "*", "max_rel_l2": round(t, 6), "min_cosine": round(1 - t * t / 2 - 1e-6, 9),
             "max_col_rel_l2": round(2 * BF16_ULP + 2 * t, 6),
             "why": "rel_l2 bound above; cosine = 1 - rel_l2^2/2 for a small error orthogonal "
                    "to the signal. Per channel: a column of T tokens holds few flips, and one "
                    "flip on the column's largest element is a whole ULP (2^-8) of the column's "
                    "norm; two ULPs plus twice the tensor bound, so a wrong per-channel scale "
                    "(a systematic error of that channel) is not diluted by the others"},
        ],
        "end_to_end": {
            "max_kld_upper": round(max(1e-3, 4 * t * t * 1e2), 6),
            "min_top1_lower": 0.75,
            "why": "logit error rel_l2 e moves log-probs by ~e*|logit| (|logit| ~ 10): KLD ~ "
                   "(10 e)^2/2; bound 4x that, floored at 1e-3. Top-1: an engine that agrees "
                   "everywhere has a Wilson lower bound >= 0.75 from 12 positions on.",
        },
    }


def section_cpu_reference(scheme):
    return {
        "derivation": (
            "The candidate is the qparity reference itself (a rerun, another thread count, "
            "another machine): fixed-order fp64 reductions make it bit-identical on one build; "
            "across libm versions exp/log/sin may differ by an ULP (2^-52 relative), amplified "
            "through a few dozen ops: 1e-12 relative bounds that by four orders of magnitude."),
        "provenance": "derived; the accuracy tests reproduce committed goldens to this bound",
        "points": [
            {"match": "*.moe.topk_ids", "max_mismatches": 0, "why": "integers: identical"},
            {"match": "*", "max_rel_l2": 1e-12, "why": "see derivation"},
        ],
        "end_to_end": {"max_kld_upper": 1e-12, "min_top1_lower": 0.75,
                       "why": "identical logits give KLD 0; Wilson bound as in default"},
    }


def section_format(scheme, family, half_step, desc):
    """What to expect of the quantized reference against the unquantized one. Informational in
    this version: no gates (whether a format's error is acceptable for a model is a judgement the
    report informs; it does not follow from the step size alone)."""
    if family == "none":
        return {"derivation": "bf16 against itself: no quantization, so the format adds nothing.",
                "points": [{"match": "*", "max_rel_l2": 1e-12, "why": "identical computation"}],
                "end_to_end": {"max_kld_upper": 1e-12, "why": "identical"}}
    floating = family in ("fp8act", "fp4act") or (family == "kv" and "fp8" in scheme)
    if floating:
        rel = half_step * 2 / math.sqrt(12)
        how = (f"a floating format: each element's error is uniform in +-{half_step:.4g} of its "
               f"own value, RMS {rel:.3g} relative")
    else:
        kappa = 8.0
        rel = half_step * 2 / math.sqrt(12) * kappa
        how = (f"an integer absmax format: each element's error is uniform in +-{half_step:.4g} "
               f"of its block's amax, RMS {half_step * 2 / math.sqrt(12):.3g} of amax, about "
               f"{rel:.3g} of the RMS value for rows with amax/RMS ~ {kappa:g} (heavy tails, "
               f"outlier channels)")
    if family.endswith("act"):
        how += "; activations are quantized as well, adding the same again in quadrature"
        rel *= math.sqrt(2)
    return {
        "derivation": (
            f"{scheme} ({desc}) against the unquantized reference: {how}. A linear's output keeps "
            f"that relative size (K independent errors average): expect rel_l2 ~ {rel:.3g} at the "
            f"first quantized linear, growing about as sqrt(number of linears) down the residual "
            f"stream. Reported by qparity validate, not gated."),
        "points": [],
    }


def main():
    out = pathlib.Path("tests/accuracy/policies")
    out.mkdir(parents=True, exist_ok=True)
    for scheme, (family, half_step, desc) in SCHEMES.items():
        policy = {
            "scheme": scheme,
            "comment": "generated by tools/policies/make_policies.py; edit there, not here",
            "engine": {
                "default": section_engine_default(scheme, family, half_step, desc),
                "cpu-reference": section_cpu_reference(scheme),
            },
            "format": section_format(scheme, family, half_step, desc),
        }
        (out / f"{scheme}.json").write_text(json.dumps(policy, indent=2) + "\n")


if __name__ == "__main__":
    main()
