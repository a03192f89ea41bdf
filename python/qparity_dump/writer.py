"""A candidate in qparity's golden schema v1 (golden/SCHEMA.md), written with numpy and h5py.

Only numpy and h5py: an engine's activations arrive as arrays (the torch hooks in hooks.py
convert them), and this module checks and writes them the way qparity's own writer does: every
point [S*T, width] in sequence-major rows, named from the capture-point catalog, in execution
order; logits in 32 bits or more; the scores (target log-probabilities, per-sequence NLL and
perplexity) computed here in float64; chunked, shuffled, gzip-compressed datasets; the file
landed atomically (temporary file, fsync, rename) and never over an existing file unless asked.
"""
import datetime
import fnmatch
import os
import re
import tempfile

import numpy as np

from . import catalog

SCHEMA_VERSION = 1
DIALECTS = ("ideal", "compressed-tensors", "vllm", "sglang", "msmodelslim")
_POINT = re.compile(r"^(embed|final_norm|logits|layers\.\d+\.[a-z0-9_.]+)$")
_ABSENT = re.compile(r"^[A-Za-z0-9_.*?\[\]-]+$")


class CandidateError(ValueError):
    """Bad input to the writer, naming the point, attribute or file and the rule."""


def _rows(name, values, sequences, seq_len):
    a = np.asarray(values)
    if a.ndim == 3:
        if a.shape[:2] != (sequences, seq_len):
            raise CandidateError(f"points/{name}: shape {a.shape}, expected [{sequences}, "
                                 f"{seq_len}, width] or [{sequences * seq_len}, width]")
        a = a.reshape(sequences * seq_len, a.shape[2])
    if a.ndim == 1:
        a = a.reshape(-1, 1)
    if a.ndim != 2 or a.shape[0] != sequences * seq_len:
        raise CandidateError(f"points/{name}: shape {a.shape}, expected [S*T = "
                             f"{sequences * seq_len}, width] (rows sequence-major: s*T + t)")
    if a.shape[1] == 0:
        raise CandidateError(f"points/{name}: width 0")
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise CandidateError(f"points/{name}: dtype {a.dtype} is not numeric")
    return a


def next_token_targets(tokens):
    """The next token inside each sequence, -1 at each sequence's last position."""
    t = np.full(tokens.shape, -1, dtype=np.int64)
    t[:, :-1] = tokens[:, 1:]
    return t


def target_logprobs(logits, targets):
    """log_softmax(logits[r])[targets[r]] in float64; NaN where the target is -1."""
    x = np.asarray(logits, dtype=np.float64)
    out = np.full(x.shape[0], np.nan)
    rows = np.nonzero(targets >= 0)[0]
    if rows.size:
        sel = x[rows]
        mx = sel.max(axis=1, keepdims=True)
        lse = mx[:, 0] + np.log(np.exp(sel - mx).sum(axis=1))
        out[rows] = sel[np.arange(rows.size), targets[rows]] - lse
    return out


class Candidate:
    """One dump: the inputs, the capture points the engine exposed, the logits, and metadata.

    tokens: int array [S, T]; every sequence ran from an empty KV cache.
    """

    def __init__(self, tokens, producer, producer_version="", model="", architecture="",
                 scheme="bf16", dialect="ideal", precision_mode="", device="",
                 model_dtype="", model_config_hash="", checkpoint_hash="", input_set="",
                 seed=0, run="free-run", point_dtype="float32"):
        tokens = np.asarray(tokens)
        if tokens.ndim == 1:
            tokens = tokens.reshape(1, -1)
        if tokens.ndim != 2 or tokens.size == 0 or not np.issubdtype(tokens.dtype, np.integer):
            raise CandidateError("inputs/tokens: need integer token ids [S, T] with S, T >= 1 "
                                 f"(got {tokens.dtype} {tokens.shape})")
        if (tokens < 0).any():
            raise CandidateError("inputs/tokens: negative token id")
        if not producer:
            raise CandidateError("attribute producer: name the engine (e.g. 'hf-transformers')")
        if dialect not in DIALECTS:
            raise CandidateError(f"attribute dialect '{dialect}': one of {', '.join(DIALECTS)}")
        if run not in ("free-run", "layer-local"):
            raise CandidateError(f"attribute run '{run}': free-run or layer-local")
        if point_dtype not in ("float32", "float64"):
            raise CandidateError(f"attribute point_dtype '{point_dtype}': float32 or float64")
        self.tokens = tokens.astype(np.int64)
        self.sequences, self.seq_len = self.tokens.shape
        self.attrs = dict(producer=producer, producer_version=producer_version, model=model,
                          architecture=architecture, model_config_hash=model_config_hash,
                          checkpoint_hash=checkpoint_hash, scheme=scheme, dialect=dialect,
                          precision_mode=precision_mode or producer,
                          input_set=input_set or f"file:{self.sequences}x{self.seq_len}",
                          device=device)
        self.seed = int(seed)
        self.run = run
        self.point_dtype = point_dtype
        self.model_dtype = model_dtype
        self.points = {}
        self.absent = []  # (glob, reason)
        self.logits = None

    @classmethod
    def for_checkpoint(cls, model_dir, tokens, producer, **kw):
        """Fills model, architecture and the hashes from a Hugging Face checkpoint directory, so
        that qparity can check the candidate ran the golden's checkpoint."""
        import json
        from . import checkpoint
        with open(os.path.join(model_dir, "config.json")) as f:
            config = json.load(f)
        kw.setdefault("model", os.path.basename(os.path.normpath(model_dir)))
        kw.setdefault("architecture", (config.get("architectures") or [""])[0])
        kw.setdefault("model_config_hash", checkpoint.config_hash(model_dir))
        kw.setdefault("checkpoint_hash", checkpoint.checkpoint_hash(model_dir))
        return cls(tokens, producer, **kw)

    def add_point(self, name, values):
        """A capture point under its catalog name: [S*T, width] or [S, T, width]."""
        if not _POINT.match(name) or (
                name.startswith("layers.") and name.split(".", 2)[2] not in
                catalog.LAYER_SUFFIXES + catalog.CODE_SUFFIXES):
            raise CandidateError(f"points/{name}: not a capture-point name of the catalog "
                                 f"(embed, layers.<i>.<suffix>, final_norm, logits; suffixes: "
                                 f"{', '.join(catalog.LAYER_SUFFIXES)})")
        if name in self.points:
            raise CandidateError(f"points/{name}: given twice")
        for glob, _ in self.absent:
            if _glob_match(glob, name):
                raise CandidateError(f"points/{name}: declared absent by '{glob}'")
        self.points[name] = _rows(name, values, self.sequences, self.seq_len)

    def declare_absent(self, glob, reason=""):
        """A point (or glob of points) this engine cannot expose, and why: compare lists the
        golden's points it names instead of failing them. An undeclared missing point fails."""
        if not _ABSENT.match(glob):
            raise CandidateError(f"absent_points '{glob}': a capture-point name or glob "
                                 "(no spaces, no '/')")
        if ": " in reason or "\n" in reason:
            reason = reason.replace(": ", " - ").replace("\n", " ")
        for name in self.points:
            if _glob_match(glob, name):
                raise CandidateError(f"absent_points '{glob}': names points/{name}, which is "
                                     "in the dump")
        self.absent.append((glob, reason))

    def set_logits(self, logits):
        """Full logits [S*T, vocab] (or [S, T, vocab]), stored in 32 bits or more."""
        a = _rows("logits", logits, self.sequences, self.seq_len)
        if a.dtype.itemsize < 4 or not np.issubdtype(a.dtype, np.floating):
            a = a.astype(np.float32)  # bf16/fp16 values are exact in float32
        self.logits = a

    def write(self, path, overwrite=False):
        """Writes the file atomically; an existing file is replaced only with overwrite=True."""
        if self.logits is None:
            raise CandidateError(f"{path}: outputs/logits not set (set_logits)")
        if not self.points:
            raise CandidateError(f"{path}: no capture point (compare needs at least one)")
        vocab = self.logits.shape[1]
        if (self.tokens >= vocab).any():
            raise CandidateError(f"inputs/tokens: id {int(self.tokens.max())} outside the "
                                 f"logits' vocabulary of {vocab}")
        if os.path.exists(path) and not overwrite:
            raise CandidateError(f"{path}: exists; pass overwrite=True (--force) to replace it")
        try:
            import h5py
        except ImportError as e:
            raise CandidateError(f"{path}: writing a candidate needs h5py ({e}); Debian: "
                                 "apt-get install python3-h5py, else pip install h5py") from None
        targets = next_token_targets(self.tokens)
        lp = target_logprobs(self.logits, targets.reshape(-1))
        scored = (targets >= 0).reshape(self.sequences, self.seq_len)
        nll = np.full(self.sequences, np.nan)
        for s in range(self.sequences):
            if scored[s].any():
                nll[s] = -lp.reshape(self.sequences, self.seq_len)[s][scored[s]].mean()
        ppl = np.exp(nll)
        point_type = np.float32 if self.point_dtype == "float32" else np.float64
        logits_type = np.float64 if self.logits.dtype == np.float64 else np.float32
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=directory)
        os.close(fd)
        try:
            with h5py.File(tmp, "w") as f:
                f.attrs.create("schema_version", SCHEMA_VERSION, dtype=np.int32)
                created = datetime.datetime.now(datetime.timezone.utc)
                for key, value in self.attrs.items():
                    f.attrs[key] = str(value)
                f.attrs["created"] = created.strftime("%Y-%m-%dT%H:%M:%SZ")
                f.attrs["point_dtype"] = self.point_dtype
                f.attrs["run"] = self.run
                if self.model_dtype:
                    f.attrs["model_dtype"] = self.model_dtype
                f.attrs.create("seed", self.seed, dtype=np.uint64)
                if self.absent:
                    entries = [g + (": " + r if r else "") for g, r in self.absent]
                    f.attrs.create("absent_points", np.array(entries, dtype=object),
                                   dtype=h5py.string_dtype())
                _dataset(f, "inputs/tokens", self.tokens)
                _dataset(f, "inputs/targets", targets)
                f.create_group("points")
                for order, name in enumerate(catalog.order_of(self.points)):
                    d = _dataset(f, "points/" + name, self.points[name].astype(point_type))
                    d.attrs.create("order", order, dtype=np.int64)
                _dataset(f, "outputs/logits", self.logits.astype(logits_type))
                _dataset(f, "outputs/target_logprobs", lp)
                _dataset(f, "outputs/sequence_nll", nll)
                _dataset(f, "outputs/sequence_ppl", ppl)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            if overwrite:
                os.replace(tmp, path)
            else:
                os.link(tmp, path)  # fails if the path appeared meanwhile: never clobber
                os.unlink(tmp)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return path


def _dataset(f, name, data):
    """Chunked in whole rows (about 1 MiB), shuffled and gzip-compressed, as qparity writes."""
    data = np.ascontiguousarray(data)
    row = data.shape[1] if data.ndim > 1 else 1
    chunk = (max(1, min(data.shape[0], (1 << 17) // max(row, 1))),) + data.shape[1:]
    return f.create_dataset(name, data=data, chunks=chunk, shuffle=True, compression="gzip",
                            compression_opts=4)


def _glob_match(glob, name):
    return fnmatch.fnmatchcase(name, glob)
