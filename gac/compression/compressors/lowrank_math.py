"""Pure tensor math for low-rank compressors: tensors in, tensors out, no modules, no models.

All factorisations return balanced factors ``A`` (out x k) and ``B`` (k x in), ``k = min(max_rank, out, in)``, with
singular values split evenly (``A = U sqrt(S)``, ``B = sqrt(S) V^T ...``) so that ``A[:, :r] @ B[:r]`` is the best
rank-r approximation *in the compressor's metric* for every r <= k: the factorisation is computed once and any rank
is a slice (a ratio sweep never repeats an SVD). At ``k = min(out, in)`` each reproduces ``W`` to float precision.
"""

from __future__ import annotations

import contextlib
import logging

import torch

from gac.errors import GacError

log = logging.getLogger(__name__)


SMALL_CPU = 2048  # CPU LAPACK calls on matrices up to this size run single-threaded (see _lapack_threads)


@contextlib.contextmanager
def _lapack_threads(*tensors: torch.Tensor):
    """Run small CPU decompositions on one thread: multi-threaded LAPACK on small matrices gains nothing and, on a
    busy machine, OpenMP contention made a 128 x 344 float64 SVD 100x slower (1.4 s vs 12 ms measured)."""
    small_cpu = all(t.device.type == "cpu" and max(t.shape) <= SMALL_CPU for t in tensors)
    old = torch.get_num_threads()
    if small_cpu and old > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if small_cpu and old > 1:
            torch.set_num_threads(old)


def _svd(M: torch.Tensor):
    with _lapack_threads(M):
        return torch.linalg.svd(M, full_matrices=False)


def _check(W: torch.Tensor, name: str) -> torch.Tensor:
    if W.ndim != 2:
        raise GacError(f"{name}: expected a 2-D weight, got shape {tuple(W.shape)}")
    if not torch.isfinite(W).all():
        raise GacError(f"{name}: the weight contains NaN or inf; cannot factorise it")
    return W.detach().to(torch.float64)


def _balanced(U, S, Vh, k):
    r = S[:k].clamp_min(0).sqrt()
    return U[:, :k] * r[None, :], r[:, None] * Vh[:k]


def _rank(W, max_rank):
    full = min(W.shape)
    return full if max_rank is None else max(1, min(int(max_rank), full))


def svd_factors(W: torch.Tensor, max_rank: int | None = None, name: str = "weight") -> tuple[torch.Tensor, torch.Tensor]:
    """Plain truncated SVD: ``W ~ A @ B`` minimising ``||W - AB||_F`` (PaLU's per-group decomposition)."""
    W64 = _check(W, name)
    k = _rank(W64, max_rank)
    U, S, Vh = _svd(W64)
    A, B = _balanced(U, S, Vh, k)
    return A.float(), B.float()


def asvd_scaling(act_abs_mean: torch.Tensor, alpha: float = 0.5, name: str = "weight") -> torch.Tensor:
    """ASVD's per-input-channel scale ``S_j = mean_t |x_tj| ** alpha`` (channels never seen get the smallest positive scale)."""
    a = act_abs_mean.detach().to(torch.float64)
    if not torch.isfinite(a).all():
        raise GacError(f"{name}: NaN or inf in the activation statistics used for ASVD scaling")
    if not 0 <= alpha <= 4:
        raise GacError(f"ASVD alpha must be in [0, 4] (the paper uses 0.5), got {alpha}")
    s = a.clamp_min(0).pow(alpha)
    pos = s[s > 0]
    floor = (pos.min() if pos.numel() else torch.tensor(1.0, dtype=torch.float64)) * 1e-3
    return torch.where(s > 0, s, floor)


def asvd_factors(
    W: torch.Tensor, act_abs_mean: torch.Tensor, alpha: float = 0.5, max_rank: int | None = None, name: str = "weight"
) -> tuple[torch.Tensor, torch.Tensor]:
    """ASVD: SVD of ``W diag(S)`` with ``S`` from :func:`asvd_scaling`, ``S^-1`` folded back into ``B``."""
    W64 = _check(W, name)
    if act_abs_mean.shape != (W64.shape[1],):
        raise GacError(f"{name}: activation statistics have shape {tuple(act_abs_mean.shape)}, expected ({W64.shape[1]},)")
    s = asvd_scaling(act_abs_mean, alpha, name)
    k = _rank(W64, max_rank)
    U, S, Vh = _svd(W64 * s[None, :])
    A, B = _balanced(U, S, Vh, k)
    return A.float(), (B / s[None, :]).float()


def whitening(xtx: torch.Tensor, eps: float = 1e-6, name: str = "weight", tries: int = 6) -> tuple[torch.Tensor, str]:
    """A square root ``L`` of ``X^T X`` (``X^T X ~ L L^T``, L invertible), in float64, for SVD-LLM.

    Cholesky of ``X^T X + eps * mean(diag) * I``; when that fails the regulariser grows tenfold per try; when all
    tries fail (the matrix is far from positive definite: dead channels, fewer tokens than channels, fp16 overflow),
    the fallback is the symmetric square root from an eigendecomposition with eigenvalues clamped at
    ``eps * mean(diag)``. Returns ``(L, how)`` where ``how`` says which path was taken.
    """
    C = xtx.detach().to(torch.float64)
    if C.ndim != 2 or C.shape[0] != C.shape[1]:
        raise GacError(f"{name}: X^T X must be square, got shape {tuple(C.shape)}")
    if not torch.isfinite(C).all():
        raise GacError(f"{name}: NaN or inf in X^T X; the calibration activations are not finite")
    C = 0.5 * (C + C.T)
    scale = float(C.diagonal().mean().clamp_min(1e-30))
    eye = torch.eye(C.shape[0], dtype=torch.float64, device=C.device)
    e = eps
    for t in range(tries):
        L, info = torch.linalg.cholesky_ex(C + (e * scale) * eye)
        if int(info) == 0:
            how = "cholesky" if t == 0 else f"cholesky (regularised, eps={e:g})"
            if t:
                log.warning("%s: X^T X not positive definite; Cholesky succeeded with eps=%g", name, e)
            return L, how
        e *= 10.0
    w, Q = torch.linalg.eigh(C)
    w = w.clamp_min(eps * scale)
    log.warning(
        "%s: X^T X is not positive definite even with eps=%g; falling back to a clamped eigendecomposition square root",
        name, e / 10,
    )
    return Q * w.sqrt()[None, :], "eigh (clamped fallback)"


def svdllm_factors(
    W: torch.Tensor, xtx: torch.Tensor, max_rank: int | None = None, eps: float = 1e-6, name: str = "weight"
) -> tuple[torch.Tensor, torch.Tensor, str]:
    """SVD-LLM truncation-aware whitening: SVD of ``W L`` (``L L^T = X^T X``), ``B = sqrt(S) V^T L^-1``.

    Truncating the SVD of ``W L`` minimises the output error ``||(W - AB) X^T||_F`` directly. Returns (A, B, how).
    """
    W64 = _check(W, name)
    if xtx.shape != (W64.shape[1], W64.shape[1]):
        raise GacError(f"{name}: X^T X has shape {tuple(xtx.shape)}, expected ({W64.shape[1]}, {W64.shape[1]})")
    with _lapack_threads(xtx):
        L, how = whitening(xtx.to(W64.device), eps, name)
    k = _rank(W64, max_rank)
    U, S, Vh = _svd(W64 @ L)
    A, M = _balanced(U, S, Vh, k)
    with _lapack_threads(L):
        B = torch.linalg.solve(L.T, M.T, left=True).T  # M L^-1
    if not torch.isfinite(B).all():
        raise GacError(f"{name}: whitening produced non-finite factors ({how}); raise eps")
    return A.float(), B.float(), how


def whitened_factors(
    W: torch.Tensor, L: torch.Tensor, max_rank: int | None = None, name: str = "weight"
) -> tuple[torch.Tensor, torch.Tensor]:
    """SVD of ``W L`` for a given square root ``L`` of ``X^T X`` (from :func:`whitening`), ``B = sqrt(S) V^T L^-1``.

    The truncation minimises the output error ``||(W - AB) X^T||_F``. PaLU's default ``whiten`` decomposition: one
    ``L`` per projection, shared by its head groups (``W`` is one group's rows).
    """
    W64 = _check(W, name)
    n = W64.shape[1]
    if L.shape != (n, n):
        raise GacError(f"{name}: the whitening factor has shape {tuple(L.shape)}, expected ({n}, {n})")
    L = L.to(device=W64.device, dtype=torch.float64)
    k = _rank(W64, max_rank)
    U, S, Vh = _svd(W64 @ L)
    A, M = _balanced(U, S, Vh, k)
    with _lapack_threads(L):
        B = torch.linalg.solve(L.T, M.T, left=True).T  # M L^-1
    if not torch.isfinite(B).all():
        raise GacError(f"{name}: whitening produced non-finite factors; the calibration X^T X is degenerate")
    return A.float(), B.float()
