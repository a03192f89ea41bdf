"""Token inputs: the same text format `qparity golden make --tokens` reads, or a golden's own."""
import numpy as np

from .writer import CandidateError


def read_tokens(path, seq_len=0):
    """[S, T] int64 ids from a file of ids (whitespace or comma separated; cut into sequences
    of seq_len, one sequence when 0) or from a golden .h5 (its inputs/tokens)."""
    with open(path, "rb") as f:
        head = f.read(8)
    if head == b"\x89HDF\r\n\x1a\n":
        import h5py
        with h5py.File(path, "r") as f:
            if "inputs/tokens" not in f:
                raise CandidateError(f"{path}: an HDF5 file without inputs/tokens")
            t = np.asarray(f["inputs/tokens"][()], dtype=np.int64)
        if seq_len and seq_len != t.shape[1]:
            raise CandidateError(f"{path}: sequences of {t.shape[1]} tokens, --seq-len {seq_len}")
        return t
    with open(path) as f:
        items = f.read().replace(",", " ").split()
    ids = []
    for item in items:
        if not item.isdigit():
            raise CandidateError(f"{path}: '{item}' is not a token id (non-negative integer)")
        ids.append(int(item))
    if not ids:
        raise CandidateError(f"{path}: no tokens")
    n = seq_len or len(ids)
    if len(ids) % n:
        raise CandidateError(f"{path}: {len(ids)} tokens do not split into sequences of {n}")
    return np.asarray(ids, dtype=np.int64).reshape(-1, n)
