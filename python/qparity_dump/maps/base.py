"""Name maps: which module of an engine's model gives which capture point. Torch-free data, so
that CI checks every map against the catalog; torch_hooks.py turns a map into forward hooks.

A Tap says: the point `suffix` of layer i ("attn.qkv"; or a model-level name: "embed") is what
module `module` ("model.layers.{i}.self_attn.q_proj") gives as `take`:
  "output"      the module's output (the first element when it returns a tuple: vLLM's
                linears return (output, bias));
  "output[k]"   the k-th element of its output tuple (vLLM's rotary_emb returns (q, k));
  "output:sum"  the sum of its output tuple's two tensors (vLLM's and SGLang's decoder layers
                return (hidden, residual) and add them in the next layer's fused add-norm);
  "input"       its first positional input (o_proj's input is attn.core);
`part=(i, n)`: the i-th of n pieces concatenated along the width (q, k, v -> attn.qkv);
`transform`: a name from TRANSFORMS applied before recording; `when`: which layers have the tap
("all", "dense", "moe", "qk_norm").
Whatever a map cannot expose it declares in `absent` with the reason; planning fails when a
catalog point is neither tapped nor declared (a map must account for every point).
"""
from .. import catalog


class Tap:
    def __init__(self, suffix, module, take="output", part=None, transform=None, when="all"):
        self.suffix, self.module, self.take = suffix, module, take
        self.part, self.transform, self.when = part, transform, when

    def applies(self, shape, layer):
        if self.when == "all":
            return True
        if self.when == "qk_norm":
            return shape.qk_norm
        moe = shape.is_moe_layer(layer)
        return moe if self.when == "moe" else not moe

    def point(self, layer):
        return self.suffix if layer is None else f"layers.{layer}.{self.suffix}"


# Heads-first [B, H, T, D] (transformers' q and k after rotary) -> [B, T, H*D].
def heads_first_to_tokens(x):
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1)


TRANSFORMS = {"heads_first": heads_first_to_tokens}


class EngineMap:
    def __init__(self, name, model_taps, layer_taps, absent, notes=""):
        self.name = name
        self.model_taps = model_taps  # embed, final_norm, logits: layer None
        self.layer_taps = layer_taps
        self.absent = absent          # suffix or model-level name -> reason
        self.notes = notes

    def plan(self, shape, kv_cache_points=True):
        """(taps [(layer or None, Tap)], expected point names, absent [(glob, reason)]) for a
        model of this shape; a ValueError naming the point a map does not account for."""
        taps = [(None, t) for t in self.model_taps]
        for i in range(shape.num_layers):
            taps += [(i, t) for t in self.layer_taps if t.applies(shape, i)]
        tapped = {t.point(i) for i, t in taps}
        absent, declared = [], set()
        for p in shape.points(kv_cache=kv_cache_points):
            if p in tapped:
                continue
            key = p if not p.startswith("layers.") else p.split(".", 2)[2]
            if key not in self.absent:
                raise ValueError(f"map '{self.name}' neither taps nor declares absent {p} "
                                 f"({shape.architecture})")
            glob = key if key == p else "layers.*." + key
            if glob not in declared:
                declared.add(glob)
                absent.append((glob, self.absent[key]))
        for i, t in taps:
            if t.transform is not None and t.transform not in TRANSFORMS:
                raise ValueError(f"map '{self.name}': unknown transform {t.transform}")
            if t.point(i) not in catalog.order_of([t.point(i)]) or (
                    i is not None and t.suffix not in catalog.LAYER_SUFFIXES):
                raise ValueError(f"map '{self.name}': {t.point(i)} is not a catalog point")
        expected = sorted(tapped)
        return taps, expected, absent
