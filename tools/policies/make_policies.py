#!/usr/bin/env python3
"""Writes policies/<scheme>.json: every threshold with the derivation behind it.

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
    "w4a8-dyn": ("int8act", 0.5 / 127, "int4 per-channel weights, dynamic per-token int8 "
                 "activations (msModelSlim W4A8_DYNAMIC)"),
    "smoothquant": ("transform", 0.0, "smooth-quant factors folded into norms and linears, bf16"),
    "w4a16-g32": ("weight", 0.5 / 7, "int4 group-32 weights"),
    "mxint4": ("weight", 0.5 / 7 * 2, "int4 group-32 weights, power-of-two scales"),
    "fp8-tensor": ("fp8act", 2.0 ** -4, "e4m3 weights and activations, per-tensor scales"),
    "fp8-channel": ("fp8act", 2.0 ** -4, "e4m3 weights per channel, activations per token"),
    "fp8-block": ("fp8act", 2.0 ** -4, "e4m3 128x128 weight blocks, 1x128 activation groups"),
    "mxfp8": ("fp8act", 2.0 ** -4 * 2, "e4m3 elements, E8M0 block-32 scales"),
    "nvfp4": ("fp4act", 2.0 ** -2, "e2m1 elements, e4m3 group-16 scales, global scale"),
    "mxfp4": ("fp4act", 2.0 ** -2 * 2, "e2m1 elements, E8M0 block-32 scales"),
    "nvfp4a16": ("fp4weight", 2.0 ** -2, "e2m1 weights, e4m3 group-16 scales, global scale; "
                 "activations in the model dtype (compressed-tensors NVFP4A16)"),
    "mxfp4a16": ("fp4weight", 2.0 ** -2 * 2, "e2m1 weights, E8M0 block-32 scales; activations "
                 "in the model dtype (MXFP4A16)"),
    "mxfp8a16": ("fp8weight", 2.0 ** -4 * 2, "e4m3 weights, E8M0 block-32 scales; activations "
                 "in the model dtype (MXFP8A16)"),
    "fp8-tensor-a16": ("fp8weight", 2.0 ** -4, "e4m3 weights, per-tensor scale; activations in "
                       "the model dtype (FP8 weight-only)"),
    "fp8-channel-a16": ("fp8weight", 2.0 ** -4, "e4m3 weights per channel; activations in the "
                        "model dtype (FP8 weight-only)"),
    "fp8-block-a16": ("fp8weight", 2.0 ** -4, "e4m3 128x128 weight blocks; activations in the "
                      "model dtype (FP8 weight-only)"),
    "kv-int8": ("kv", 0.5 / 127, "int8 KV cache (msModelSlim C8)"),
    "kv-fp8": ("kv", 2.0 ** -4, "e4m3 KV cache"),
    # One scale per KV head: the same e4m3 grid relative to each head's own amax, so no head's
    # error exceeds the per-tensor bound.
    "kv-fp8-head": ("kv", 2.0 ** -4, "e4m3 KV cache, one scale per KV head (attn_head)"),
}

# compressed-tensors' integer weight-only space (`ct-w<b>a16-<g<N>|ch|tensor>[-asym][-actorder]`,
# schemes/description/scheme_registry.h): policies follow from the point, not from a preset name. The
# half step is that of the symmetric absmax grid 0.5/(2^(b-1)-1) (compressed-tensors' divisor
# (2^b-1)/2 gives a slightly smaller one, 1/(2^b-1); asymmetric grids spread 2^b-1 steps over
# max-min <= 2 amax: no larger). actorder changes which inputs share a scale, not its size.
# Written for the points qparity's presets name and a grid around them; `--scheme ID` writes any
# other point.
CT_INT_GRID = ([(4, g, sym, False) for g in (32, 64, 128, "ch") for sym in (True, False)] +
               [(8, g, sym, False) for g in (32, 64, 128, "ch") for sym in (True, False)] +
               [(b, g, sym, False) for b in (2, 3) for g in (64, 128) for sym in (True, False)] +
               [(4, 128, sym, True) for sym in (True, False)] + [(8, 128, True, True)])


# compressed-tensors' INT8 W8A8 space (`ct-w8a8-int8[-wtensor]-<dyn|static>[-asym]`): int8
# weights per channel or per tensor, int8 inputs dynamic per token or static per tensor
# (symmetric or not). The default point is w8a8-int8-dyn; the static ones share msModelSlim
# W8A8's static-step measurements (STATIC_INT8).
CT_INT8_POINTS = [(wt, st, sym) for wt in (False, True) for st in (False, True)
                  for sym in ((True, False) if st else (True,))]


def ct_int8_id(tensor_weights, static, sym):
    if (tensor_weights, static, sym) == (False, False, True):
        return "w8a8-int8-dyn"
    return ("ct-w8a8-int8" + ("-wtensor" if tensor_weights else "") +
            ("-static" if static else "-dyn") + ("" if sym else "-asym"))


def add_ct_int8_scheme(tensor_weights, static, sym):
    scheme = ct_int8_id(tensor_weights, static, sym)
    if scheme in SCHEMES:
        return
    desc = (f"int8 per-{'tensor' if tensor_weights else 'channel'} weights, " +
            (f"static per-tensor {'symmetric' if sym else 'asymmetric'} int8 activations"
             if static else "dynamic per-token int8 activations"))
    SCHEMES[scheme] = ("int8act", 0.5 / 127, desc)
    if tensor_weights:
        TENSOR_BLOCK.add(scheme)
    if static:
        STATIC_INT8.add(scheme)


def ct_int_id(bits, group, sym, act):
    if (bits, group, sym, act) == (4, 32, True, False):
        return "w4a16-g32"
    g = group if isinstance(group, str) else f"g{group}"
    return f"ct-w{bits}a16-{g}" + ("" if sym else "-asym") + ("-actorder" if act else "")


def ct_int_point(scheme):
    """The (bits, group, symmetric, actorder) of a ct-w<b>a16 id, or None."""
    import re
    m = re.fullmatch(r"ct-w([2-8])a16-(g([1-9][0-9]*)|ch|tensor)(-asym)?(-actorder)?", scheme)
    if not m:
        return None
    group = int(m.group(3)) if m.group(3) else m.group(2)
    return int(m.group(1)), group, m.group(4) is None, m.group(5) is not None


def add_ct_int_scheme(bits, group, sym, act):
    scheme = ct_int_id(bits, group, sym, act)
    if scheme in SCHEMES:
        return
    what = {"ch": "per-channel", "tensor": "per-tensor"}.get(group, f"group-{group}")
    desc = (f"int{bits} {what} weights, {'symmetric' if sym else 'asymmetric (zero points)'}"
            + (", columns grouped by weight_g_idx (actorder)" if act else ""))
    SCHEMES[scheme] = ("weight", 0.5 / (2 ** (bits - 1) - 1), desc)
    register_int_grid(scheme, bits, group)


def register_int_grid(scheme, bits, group):
    """The scale block of an integer-weight point (group / per tensor) and its 4-bit budgets."""
    if not isinstance(group, str):
        BLOCK[scheme] = group
    elif group == "tensor":
        TENSOR_BLOCK.add(scheme)
    if bits <= 4:
        WEIGHT4.add(scheme)


# Schemes whose engine rows are judged by another family and half step than their format rows.
ENGINE_FAMILY = {}

# compressed-tensors' WnA8 / W4AFP8 points (`ct-w<b><a8|afp8>-<g<N>|ch|tensor>...`): the same
# integer weights with 8-bit per-token inputs. The format's error is the weights' grid and the
# inputs' in quadrature (independent roundings of the two GEMM operands): int8 inputs' half step
# 0.5/127, fp8 e4m3's relative 2^-4. The presets' points: W2A8..W7A8 and W4A8 (int, group 128),
# W4AFP8.
CT_WA8_GRID = [(b, 128, True, False, "a8") for b in range(2, 8)] + [(4, 128, True, False, "afp8")]


def add_ct_wa8_scheme(bits, group, sym, act, inputs):
    weight_id = ct_int_id(bits, group, sym, act)
    if weight_id == "w4a16-g32":
        weight_id = "ct-w4a16-g32"
    scheme = weight_id.replace("a16-", inputs + "-", 1)
    if scheme in SCHEMES:
        return
    hw = 0.5 / (2 ** (bits - 1) - 1)
    ha = 0.5 / 127 if inputs == "a8" else 2.0 ** -4
    what = {"ch": "per-channel", "tensor": "per-tensor"}.get(group, f"group-{group}")
    desc = (f"int{bits} {what} weights, {'symmetric' if sym else 'asymmetric'}; "
            f"{'int8' if inputs == 'a8' else 'fp8 e4m3'} inputs quantized per token at run time "
            f"(weights' half step {hw:.4g} and inputs' {ha:.4g} in quadrature)")
    SCHEMES[scheme] = ("weight", math.sqrt(hw * hw + ha * ha), desc)
    # The engine quantizes the inputs as w8a8-int8-dyn / fp8-channel do: its rows are judged as
    # theirs (the codes' own points, one input code step in the column gates), while the format's
    # error above is the weights' and the inputs' together.
    ENGINE_FAMILY[scheme] = ("int8act", 0.5 / 127) if inputs == "a8" else ("fp8act", 2.0 ** -4)
    register_int_grid(scheme, bits, group)


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


def single_flip():
    # Layer-local points inherit the flips of the intermediates computed before them in the layer
    # (gate_up -> act -> down; an expert's intermediates are not even captured). One flipped
    # element that dominates an output row (an outlier channel meeting an outlier weight column,
    # the massive-activation pattern) moves that whole row by its own relative change, and a row
    # that dominates the tensor's norm moves rel_l2 by as much: one bf16 ULP, up to 2^-7 at the
    # bottom of a binade (measured: one act flip in expert 7 of the qwen3-moe-small fixture moves
    # its expert_out by 4.3e-3, reproduced by an fp32-accumulation emulation on the CPU). Rare
    # (p ~ 1e-3 per element), but one is enough. Not allowed for: a dominant input crossing an
    # fp8 / fp4 activation-code boundary (one step, 2^-3 .. 2^-1; probability p 2^-8 / step per
    # element): it fails the point, and bisect shows where.
    return 2 * BF16_ULP


def section_engine_default(scheme, family, half_step, desc):
    t = engine_default(family, half_step)
    f = single_flip()
    deriv = (
        f"{scheme} ({desc}), engine vs the reference golden of the same scheme in emulate mode, "
        "layer-local (each layer run on the golden's own inputs: `qparity engine run --local`): "
        "a point then carries one layer's own error. A free run's points also carry upstream "
        "error, amplified layer after layer by the model (measured x4-x6 per layer on the "
        "random-weight fixtures), which these bounds do not model: free runs are judged end to "
        "end. bf16 storage: fp32 accumulation order flips the bf16 rounding of ~sqrt(K)*2^-16 of "
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
    deriv += (
        f" That RMS bound ({t:.3g}) gates the median token (row): an error spread over every "
        f"token fails there. The whole tensor may also carry one inherited flip that dominates "
        f"it: an intermediate element feeding a dominant token through an outlier weight moves "
        f"that token by one ULP (2^-7 at the bottom of a binade): tensor threshold rel_l2 <= {t:.3g} + {f:.3g} = {t + f:.3g}.")
    code_points = []
    # A column (one output channel over the tokens) may also carry one activation code that an
    # inherited bf16 flip moved across a boundary: one step of that token's scale (measured: a
    # w8a8-int8-dyn down_proj channel of the qwen3-small fixture at 0.0127 on an H100, above the
    # bf16-only bound 0.0117).
    # Measured for int8 and e4m3 activations (the activation-quantized schemes the GPU runs):
    # fp8-tensor on the qwen3-moe tiny fixture, a one-ULP flip of attn.core moved an o_proj code
    # by one e4m3 step and gate_up's channel 304 to 0.017. Not for the coarser MX / fp4 steps
    # (2^-2 and up), which would blunt the gate against a wrong channel scale (1.25x): their
    # engines will measure their own.
    # The quantized KV caches likewise: measured on an H200 (validate, the mistral small fixture,
    # 2 x 32 tokens, kv-fp8), layers.2.attn.v_cache channel 214 at 0.0239, every code the
    # engine writes the reference's on identical inputs (test_gpu_kv_cache): an inherited flip of
    # v moved one e4m3 code by a step.
    step = 2 * half_step
    code_step = step if family in ("int8act", "fp8act", "kv") and step < 0.2 else 0.0
    col = 2 * f + 2 * t + code_step
    kld = max(1e-3, 4 * t * t * 1e2)
    scale_gate = t + f
    scale_why = ("per-token scales follow each token's maximum: identical unless that maximum "
                 "flipped (one bf16 ULP, 2^-8 relative)")
    if scheme == "mxfp8":
        # Measured on an H100 (validate, the qwen3-small fixture, 4 x 32 tokens): layer 0's
        # input_norm differs from the reference by bf16 flips (rel_l2 1.5e-5); they moved 63 qkv,
        # 118 o_proj, 121 gate_up and 200 down_proj codes of 65k-131k (every kernel bit-exact on
        # identical inputs), mlp.act channel 297 reached 0.0212, and one flip moved a 32-block's
        # maximum across a power of two, doubling that E8M0 scale: down_proj x_scales rel_l2
        # 0.0257. Bounds: twice those (a wrong channel scale, 1.25x, still fails).
        col = max(col, 2 * 0.0212)
        scale_gate = max(scale_gate, 2 * 0.0257)
        scale_why = ("E8M0 block scales follow each 32-block's maximum: one inherited flip across "
                     "a power of two doubles a block's scale (measured 0.0257 on one down_proj "
                     "of the qwen3-small fixture, H100); bound: twice that. The codes x scale "
                     "are judged at x_values")
    if scheme in STATIC_INT8:
        # A static per-tensor step is absolute (the calibrated range / 255): for the many tokens
        # far below that range one code is a large relative change. Measured on an H100, the
        # qwen3-small fixture (seed 1), 2 x 16 tokens: one inherited bf16 flip in
        # post_attn_norm moved gate_up codes (x_values rel_l2 8.2e-4), and layers.0.mlp.out
        # channel 352 reached 0.0568 layer-local; the free run's mean KLD 9.4e-4 (upper 2.63e-3)
        # with every code of its kernel bit-exact on identical inputs. Bounds: twice that.
        col = max(col, 2 * 0.0568)
        kld = max(kld, 2 * 2.63e-3)
    if family.endswith("act"):
        code_points = [
            {"match": "*.x_values", "max_rel_l2": round(t + f, 6),
             "max_median_row_rel_l2": round(t, 6),
             "why": "the activation codes the GEMM was fed, compared exactly (mismatches are "
                    "counted and reported): the quantization kernel matches the dialect bit for "
                    "bit on identical inputs (the gpu kernel tests), but a layer's engine-computed "
                    "input differs from the reference's by bf16 flips (p ~ 1e-3), and a flipped "
                    "element moves its code by one step, a flipped token maximum rescales its "
                    "whole row by 2^-8: gated like a stored tensor (rel_l2 and the median token), "
                    "not per channel, where one step of a small code is a large relative change"},
            {"match": "*.x_scales", "max_rel_l2": round(scale_gate, 6),
             "max_median_row_rel_l2": round(t, 6),
             "why": scale_why},
        ]
    # SiLU-and-mul columns: act = silu(g) * u amplifies a relative error of g by the condition
    # number c(g) = 1 + g (1 - sigmoid(g)), |c| <= 1.28 for g >= 0 but 2.93 at g = -4 (c(-4) =
    # -2.928). A column of few tokens can be dominated by an element with a negative g (its act is
    # small, but so are the others'): measured on an H200, the qwen3-moe tiny fixture in
    # w4a8-dyn, 4 tokens, layers.1.mlp.act channel 249 at 0.034 with gate_up passing (12 inherited
    # code moves of 10824 downstream). Bound: the dominant g's flip amplified up to g = -4 plus the
    # act's own rounding, f (|c(-4)| + 1), then 2t and the code step as for every column. A wrong
    # channel of gate_up is caught at gate_up, whose column gate is not widened.
    c_silu = abs(1 - 4 * (1 - 1 / (1 + math.exp(4))))
    col_act = max(col, f * (c_silu + 1) + 2 * t + code_step)
    act_point = {
        "match": "*.mlp.act", "max_rel_l2": round(t + f, 6), "max_median_row_rel_l2": round(t, 6),
        "min_cosine": round(1 - (t + f) ** 2 / 2 - 1e-6, 9),
        "max_col_rel_l2": round(col_act, 6),
        "why": f"as '*', with the column gate widened for SiLU's condition number: a flip of the "
               f"column's dominant gate value g moves silu(g) by |1 + g (1 - sigmoid(g))| times "
               f"its relative size, {c_silu:.3g} at g = -4; bound f ({c_silu:.3g} + 1) + 2t"
               f"{' + one code step' if code_step else ''} = {col_act:.3g} (measured 0.034 on "
               f"a 4-token w4a8-dyn qwen3-moe column, H200). gate_up keeps the plain column gate, "
               f"so a wrong channel scale is still caught there"}
    return {
        "derivation": deriv,
        "provenance": "derived (tools/policies/make_policies.py); measurements folded in where "
                      "the bounds say so: one NVIDIA H100 80GB HBM3 (sm_90), the tiny and small "
                      "fixtures, 2-3 sequences of 16-32 tokens; not yet a spread over seeds",
        "point_gates_apply_to": ["layer-local"],
        "optional_points": OPTIONAL_POINTS,
        "points": code_points + [act_point,
            {"match": "*.moe.topk_ids", "max_mismatches": 0,
             "why": "router ids are integers: a flip changes which experts run; it is reported "
                    "per layer and not tolerated silently"},
            {"match": "*", "max_rel_l2": round(t + f, 6), "max_median_row_rel_l2": round(t, 6),
             "min_cosine": round(1 - (t + f) ** 2 / 2 - 1e-6, 9),
             "max_col_rel_l2": round(col, 6),
             "why": "rel_l2: the RMS bound plus one inherited dominant flip; the median token: "
                    "the RMS bound alone, so a systematic error of every token (a shifted tensor, "
                    "a wrong rounding mode) still fails; cosine = 1 - rel_l2^2/2 for a small "
                    "error orthogonal to the signal. Per channel: a column of T tokens holds few "
                    "flips, and one flip on the column's largest element is a whole ULP (up to "
                    "2^-7) of the column's norm, twice that when it passed two stored roundings "
                    "(gate_up, then act: measured 0.014 on a w8a16-ch down_proj channel of the "
                    "qwen3-small fixture on an H100); that plus twice the RMS bound (plus, for "
                    "activation-quantized schemes and quantized KV caches, one code step: an "
                    "inherited flip that moved one code), so a wrong per-channel scale (a systematic error of that channel) is "
                    "not diluted by the others"},
        ],
        "end_to_end": {
            "max_kld_upper": round(kld, 6),
            "min_top1_lower": 0.75,
            "why": "logit error rel_l2 e moves log-probs by ~e*|logit| (|logit| ~ 10): KLD ~ "
                   "(10 e)^2/2; bound 4x that, floored at 1e-3" +
                   ("; static int8 activations: twice the measured 2.63e-3 (see the column gate)"
                    if scheme in STATIC_INT8 else "") +
                   ". Top-1: an engine that agrees everywhere has a Wilson lower bound >= 0.75 "
                   "from 12 positions on.",
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
        "optional_points": OPTIONAL_POINTS,
        "points": [
            {"match": "*.moe.topk_ids", "max_mismatches": 0, "why": "integers: identical"},
            {"match": "*", "max_rel_l2": 1e-12, "why": "see derivation"},
        ],
        "end_to_end": {"max_kld_upper": 1e-12, "min_top1_lower": 0.75,
                       "why": "identical logits give KLD 0; Wilson bound as in default"},
    }


# Static per-tensor int8 activations (msModelSlim W8A8 / W8A8S): see section_engine_default.
STATIC_INT8 = {"w8a8-static", "w8a8s"}

# Points a candidate may leave out without failing (golden/SCHEMA.md): per-expert outputs, which
# an engine whose grouped GEMM never materializes them cannot dump. Any other missing point fails.
OPTIONAL_POINTS = ["*.moe.expert_out"]

# Schemes whose weights have another step than their activations (the tuple's half step is the
# activations', which the engine section's code flips use): the weights' half step.
WEIGHT_HALF_STEP = {"w4a8-dyn": 0.5 / 7}

# Default acceptance budgets of the format role, per family: what a user may lose to the format,
# end to end. A budget is a judgement, not a prediction: `--budget` states the user's own. Each
# entry: (max Δ ln PPL = max mean KLD, min top-1 agreement, description).
BUDGETS = {
    "none": (1e-12, 0.75, "unquantized: nothing may change (top-1: a run that agrees "
             "everywhere has a Wilson lower bound >= 0.75 from 12 positions on)"),
    "transform": (1e-3, 0.95, "a numerically neutral rewrite (smoothing folded into bf16 "
                  "weights): only bf16 re-rounding"),
    "weight": (0.01, 0.9, "8-bit weights"),
    "int8act": (0.02, 0.85, "8-bit weights and activations"),
    "fp8act": (0.02, 0.85, "8-bit weights and activations"),
    "kv": (0.01, 0.9, "an 8-bit KV cache"),
    "weight4": (0.05, 0.8, "4-bit weights"),
    "fp4act": (0.10, 0.75, "4-bit weights and activations"),
    "fp4weight": (0.05, 0.8, "4-bit weights"),
    "fp8weight": (0.01, 0.9, "8-bit weights"),
}


WEIGHT4 = {"w4a16-g32", "mxint4", "w4a8-dyn"}  # weight-only formats of at most 4 bits
TENSOR_BLOCK = set()  # absmax over a whole tensor


def budget_family(scheme, family):
    if scheme in WEIGHT4:
        return "weight4"
    return family


def section_budget(scheme, family, desc):
    fam = budget_family(scheme, family)
    dln, top1, what = BUDGETS[fam]
    return {
        "derivation": (
            f"The default acceptance budget for {what} ({scheme}: {desc}): is this format "
            f"acceptable for this model? A judgement to state your own against (`--budget "
            f"kld=..,top1=..,dln_ppl=..`), not a prediction of the format's error; each bound is "
            f"applied to the 95% confidence bound of the measurement, so a short evaluation "
            f"cannot pass by luck. Perplexity: at most {dln:g} in ln(PPL_q / PPL), i.e. "
            f"{100 * (math.exp(dln) - 1):.3g}% more perplexity"
            + (" (8-bit formats are expected to be near lossless; 4-bit ones to cost a few per "
               "cent)" if fam not in ("none", "transform") else "")
            + f". Mean KLD: the same {dln:g}; when the targets follow the unquantized model's "
            f"own distribution, the expected Δ ln PPL is exactly the mean KL divergence, so the "
            f"two bounds ask the same of the whole distribution and of the sampled targets. "
            f"Top-1 agreement with the "
            f"unquantized model: at least {top1:g} (lower Wilson bound)."),
        "end_to_end": {
            "max_kld_upper": dln,
            "min_top1_lower": top1,
            "max_dln_ppl_upper": dln,
            "why": "see derivation",
        },
    }


# Block sizes of the absmax formats (elements sharing one scale) where the block is fixed by the
# format; None where it is a whole row (per-channel / per-token: K depends on the model).
BLOCK = {"w8a16-g64": 64, "w4a16-g32": 32, "mxint4": 32}
# Assumed bound on amax/RMS within a row-sized block: Llama/Qwen weight rows and per-token
# activations stay below it outside outlier features. A model beyond it fails the format gate,
# which then says what the user needs to hear: the format does worse on this model than its step
# predicts for well-behaved data.
KAPPA_ROW = 16.0
# A whole tensor's amax/RMS: its largest row's outlier against every row's RMS; twice the row's.
KAPPA_TENSOR = 2 * KAPPA_ROW
MARGIN = 2.0  # gate = twice the predicted RMS, so sampling noise on small fixtures stays inside


def section_format(scheme, family, half_step, desc):
    """What the format does to the model: the quantized reference against the unquantized one.

    Gated where the format's error is its own: layers.0.attn.qkv, the first quantized linear,
    whose input (layer 0's input_norm of the embedding) is the same on both sides; KV formats at
    layers.0.attn.core, the first op reading the cache. Further down, errors compound with the
    model's depth and conditioning, and the end-to-end KLD depends on the logit scale: those are
    reported, not gated (whether that is acceptable is the user's call, which the report informs).
    """
    if family == "none":
        return {"derivation": "bf16 against itself: no quantization, so the format adds nothing.",
                "points": [{"match": "*", "max_rel_l2": 1e-12, "why": "identical computation"}],
                "end_to_end": {"max_kld_upper": 1e-12, "why": "identical"}}
    if family == "transform":
        ulp_rms = BF16_ULP / math.sqrt(12)
        bound = MARGIN * math.sqrt(3) * ulp_rms
        return {
            "derivation": (
                f"{scheme} ({desc}) against the unquantized reference. Folding the smoothing "
                f"factors re-rounds three bf16 tensors on the path to layers.0.attn.qkv: the norm "
                f"weight, the linear's weight and the norm's output; each rounding is uniform "
                f"within half a bf16 ULP, RMS 2^-8/sqrt(12) = {ulp_rms:.3g} relative, three in "
                f"quadrature {math.sqrt(3) * ulp_rms:.3g}; gate {MARGIN:g}x that = {bound:.3g}."),
            "points": [{"match": "layers.0.attn.qkv", "max_rel_l2": round(bound, 6),
                        "why": "first linear after the first folded norm; see derivation"}],
        }
    floating = (family in ("fp8act", "fp4act", "fp8weight", "fp4weight") or
                (family == "kv" and "fp8" in scheme))
    step = 2 * half_step
    if floating:
        elem = step / math.sqrt(12)
        how = (f"a floating format: each element's rounding error is uniform within +-{half_step:.4g}"
               f" of its own value (top of the binade; less below), RMS {elem:.3g} relative, "
               f"whatever the block's amax")
        if family in ("fp4act", "fp4weight"):
            how += (" (e2m1 has one mantissa bit; values below its smallest subnormal flush, which"
                    " this model covers with margin: quantizing Gaussian, Laplace and Student-t(3)"
                    " blocks gives 0.087-0.094 for nvfp4 and 0.115-0.150 for mxfp4)")
    else:
        block = BLOCK.get(scheme)
        if scheme in TENSOR_BLOCK:
            kappa = KAPPA_TENSOR
            kwhy = (f"amax/RMS <= {KAPPA_TENSOR:g} assumed for a whole tensor (see KAPPA_TENSOR "
                    f"in tools/policies/make_policies.py)")
        elif block:
            kappa = math.sqrt(block)
            kwhy = (f"amax/RMS <= sqrt({block}) = {kappa:.3g} in any block of {block} (equality "
                    f"for a single spike)")
        else:
            kappa = KAPPA_ROW
            kwhy = (f"amax/RMS <= {KAPPA_ROW:g} assumed for whole rows (per-channel / per-token "
                    f"blocks; see KAPPA_ROW in tools/policies/make_policies.py)")
        elem = step / math.sqrt(12) * kappa
        how = (f"an absmax format: each element's error is uniform within +-{half_step:.4g} of its "
               f"block's amax, RMS {step / math.sqrt(12):.3g}"
               f" of amax; {kwhy}: RMS <= {elem:.3g} of the block's RMS")
    parts = 1
    where = "layers.0.attn.qkv"
    if scheme in WEIGHT_HALF_STEP:  # int4 weights, int8 activations: the two in quadrature
        act = elem
        elem = 2 * WEIGHT_HALF_STEP[scheme] / math.sqrt(12) * kappa
        how = (f"an absmax format: the weights' error is uniform within "
               f"+-{WEIGHT_HALF_STEP[scheme]:.4g} of the row's amax, RMS <= {elem:.3g} of the row's "
               f"RMS ({kwhy}); the activations' (per token) within +-{half_step:.4g}, RMS <= "
               f"{act:.3g}; in quadrature")
        elem = math.hypot(elem, act)
    elif family.endswith("act"):
        parts = 2
        how += "; activations are quantized as well: the same again, in quadrature"
    if family == "kv":
        parts = 2
        where = "layers.0.attn.core"
        how += ("; K and V both carry it; attention averages V rows and the score error from K "
                "enters through the softmax: bounded by the same relative size, K and V in "
                "quadrature")
    predicted = elem * math.sqrt(parts)
    bound = min(MARGIN * predicted, 1.0)
    return {
        "derivation": (
            f"{scheme} ({desc}) against the unquantized reference: {how}. The output of a linear "
            f"of K inputs keeps the weights' relative error (K independent errors add as "
            f"sqrt(K), as the signal does): predicted rel_l2 {predicted:.3g} at {where}, whose "
            f"input is identical on both sides; gate {MARGIN:g}x = {bound:.3g}. Later points "
            f"inherit and compound it; they are reported, not gated."),
        "points": [{"match": where, "max_rel_l2": round(bound, 6),
                    "why": "the first op carrying the format's error alone; see derivation"}],
    }


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scheme", action="append", default=[],
                    help="also write this ct-w<b>a16-... point's policy (repeatable)")
    ap.add_argument("--out", default="policies", help="the policies directory")
    args = ap.parse_args()
    for point in CT_INT_GRID:
        add_ct_int_scheme(*point)
    for point in CT_INT8_POINTS:
        add_ct_int8_scheme(*point)
    for point in CT_WA8_GRID:
        add_ct_wa8_scheme(*point)
    for scheme in args.scheme:
        point = ct_int_point(scheme)
        if point is None and scheme in map(lambda p: ct_int8_id(*p), CT_INT8_POINTS):
            continue
        if point is None:
            ap.error(f"--scheme {scheme}: not a ct-w<b>a16-<g<N>|ch|tensor>[-asym][-actorder] id")
        add_ct_int_scheme(*point)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for scheme, (family, half_step, desc) in SCHEMES.items():
        policy = {
            "scheme": scheme,
            "comment": "generated by tools/policies/make_policies.py; edit there, not here",
            "engine": {
                "default": section_engine_default(scheme,
                                                  *ENGINE_FAMILY.get(scheme, (family, half_step)),
                                                  desc),
                "cpu-reference": section_cpu_reference(scheme),
            },
            "format": section_format(scheme, family, half_step, desc),
            "budget": section_budget(scheme, family, desc),
        }
        (out / f"{scheme}.json").write_text(json.dumps(policy, indent=2) + "\n")


if __name__ == "__main__":
    main()
