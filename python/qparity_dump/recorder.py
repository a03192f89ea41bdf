"""Collects capture points from hooks, forward call by forward call, into [S*T, width] arrays.

Torch-free: a value is anything numpy can take, or a torch tensor (converted on the CPU: bf16 and
fp16 values are exact in float32, float64 stays float64, integer ids become int64). Each forward
call covers whole sequences (B sequences of T tokens, sequence-major); the recorder reshapes what
a hook saw to [B*T, width] and, at the end, concatenates the calls in order.
"""
import numpy as np

from . import catalog
from .writer import CandidateError


def to_numpy(x):
    if hasattr(x, "detach"):  # torch
        import torch
        x = x.detach()
        if x.dtype == torch.float64:
            return x.cpu().numpy()
        if x.is_floating_point():
            return x.float().cpu().numpy()
        return x.to(torch.int64).cpu().numpy()
    return np.asarray(x)


class Recorder:
    def __init__(self, points_expected=None):
        self.points_expected = points_expected  # names the map promised (checked at the end)
        self.chunks = {}   # name -> [per forward call arrays]
        self.parts = {}    # name -> {index: array} while a concatenation is incomplete
        self.calls = 0
        self.batch = self.seq_len = None

    def begin(self, batch, seq_len):
        """A forward call over `batch` sequences of `seq_len` tokens starts."""
        self.batch, self.seq_len = batch, seq_len
        self.calls += 1

    def end(self):
        if self.parts:
            name = sorted(self.parts)[0]
            raise CandidateError(f"points/{name}: only parts {sorted(self.parts[name])} of it "
                                 "arrived in this forward call")
        self.batch = self.seq_len = None

    def _rows(self, name, x):
        a = to_numpy(x)
        n = self.batch * self.seq_len
        if a.ndim >= 2 and a.shape[0] == self.batch and a.shape[1] == self.seq_len:
            return a.reshape(n, -1)
        if a.ndim >= 1 and a.shape[0] == n:
            return a.reshape(n, -1)
        raise CandidateError(f"points/{name}: a hook saw shape {tuple(a.shape)}; expected "
                             f"[{self.batch}, {self.seq_len}, ...] or [{n}, ...] (B sequences "
                             "of T tokens)")

    def put(self, name, x, part=None):
        """One forward call's value of a point; `part=(i, n)`: the i-th of n pieces concatenated
        along the width (q, k and v from three projections)."""
        if self.batch is None:
            raise CandidateError(f"points/{name}: a hook fired outside begin()/end()")
        rows = self._rows(name, x)
        if part is not None:
            i, n = part
            got = self.parts.setdefault(name, {})
            if i in got:
                raise CandidateError(f"points/{name}: part {i} arrived twice in one call")
            got[i] = rows
            if len(got) < n:
                return
            rows = np.concatenate([got[j] for j in range(n)], axis=1)
            del self.parts[name]
        calls = self.chunks.setdefault(name, [])
        if len(calls) >= self.calls:
            raise CandidateError(f"points/{name}: recorded twice in one forward call (a module "
                                 "that runs more than once per layer?)")
        if len(calls) != self.calls - 1:
            raise CandidateError(f"points/{name}: missing from an earlier forward call")
        calls.append(rows)

    def arrays(self):
        """name -> [S*T, width], after checking every point arrived in every call."""
        out = {}
        for name, calls in self.chunks.items():
            if len(calls) != self.calls:
                raise CandidateError(f"points/{name}: recorded in {len(calls)} of {self.calls} "
                                     "forward calls")
            out[name] = np.concatenate(calls, axis=0)
        if self.points_expected is not None:
            missing = [p for p in self.points_expected if p not in out]
            if missing:
                raise CandidateError(f"points/{missing[0]}: the map promised it, but no hook saw "
                                     f"it ({len(missing)} such points): the model's module "
                                     "structure differs from the map's")
        return out

    def fill(self, candidate, absent=()):
        """Adds every recorded point (catalog order) and the declarations to a Candidate."""
        arrays = self.arrays()
        for name in catalog.order_of(arrays):
            if name != "logits" or name in arrays:
                candidate.add_point(name, arrays[name])
        for glob, reason in absent:
            candidate.declare_absent(glob, reason)
        return candidate
