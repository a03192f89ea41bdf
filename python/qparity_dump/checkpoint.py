"""The checkpoint hashes a golden records (golden/reference_run.cpp), in plain Python: a
candidate that records them lets `qparity compare --model` and `validate --candidate` check that
the engine ran the checkpoint the golden was made from."""
import hashlib
import json
import os
import struct


def config_hash(model_dir):
    """sha256 (hex) of config.json's bytes."""
    with open(os.path.join(model_dir, "config.json"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _shards(model_dir):
    names = os.listdir(model_dir)
    indexes = sorted(n for n in names if n.endswith(".safetensors.index.json") and len(n) > 23)
    if len(indexes) > 1:
        raise ValueError(f"{model_dir}: more than one *.safetensors.index.json: {indexes[:2]}")
    if indexes:
        with open(os.path.join(model_dir, indexes[0])) as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{os.path.join(model_dir, indexes[0])}: no weight_map object")
        shards = sorted(set(weight_map.values()))
        # qparity refuses an index entry that leaves the checkpoint directory (a path with a
        # separator or ".."): so does the hash, instead of reading what it names.
        for s in shards:
            if not isinstance(s, str) or not s or "/" in s or "\\" in s or s in (".", ".."):
                raise ValueError(f"{os.path.join(model_dir, indexes[0])}: weight_map names {s!r}, "
                                 f"not a file in the checkpoint directory")
    else:
        shards = sorted(n for n in names if n.endswith(".safetensors")
                        and os.path.isfile(os.path.join(model_dir, n)))
    if not shards:
        raise ValueError(f"{model_dir}: no *.safetensors files in the directory")
    return [os.path.join(model_dir, s) for s in shards]


def _header(path):
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: shorter than a safetensors header")
        (n,) = struct.unpack("<Q", raw)
        if n > os.path.getsize(path) - 8:
            raise ValueError(f"{path}: header length {n} runs past the end of the file")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return 8 + n, header


def checkpoint_hash(model_dir):
    """sha256 over the checkpoint's tensors sorted by name; per tensor the text
    `name|DTYPE|d0,d1,...,` (the safetensors dtype, every dimension followed by a comma) and then
    its raw bytes: qparity's checkpoint_tensor_hash."""
    tensors = {}
    for shard in _shards(model_dir):
        base, header = _header(shard)
        for name, info in header.items():
            if name in tensors:
                raise ValueError(f"{shard}: tensor {name} also in {tensors[name][0]}")
            begin, end = info["data_offsets"]
            tensors[name] = (shard, base + begin, end - begin, info["dtype"], info["shape"])
    h = hashlib.sha256()
    for name in sorted(tensors, key=lambda s: s.encode()):
        shard, offset, size, dtype, shape = tensors[name]
        h.update(f"{name}|{dtype}|{''.join(f'{d},' for d in shape)}".encode())
        with open(shard, "rb") as f:
            f.seek(offset)
            left = size
            while left:
                chunk = f.read(min(left, 1 << 24))
                if not chunk:
                    raise ValueError(f"{shard}: tensor {name} runs past the end of the file")
                h.update(chunk)
                left -= len(chunk)
    return h.hexdigest()
