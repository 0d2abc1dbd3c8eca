"""Pure tensor math for low-rank compressors: tensors in, tensors out, no modules, no models.

All factorisations return balanced factors ``A`` (out x k) and ``B`` (k x in), ``k = min(max_rank, out, in)``, with
singular values split evenly (``A = U sqrt(S)``, ``B = sqrt(S) V^T ...``) so that ``A[:, :r] @ B[:r]`` is the best
rank-r approximation *in the compressor's metric* for every r <= k: the factorisation is computed once and any rank
is a slice (a ratio sweep never repeats an SVD). At ``k = min(out, in)`` each reproduces ``W`` to float precision.
With ``return_sigma=True`` they also return the k singular values ``S`` (float64) of the scaled / whitened weight:
the compressor's error curve (``S**2``), read without touching the factors.

**Methods** (``method``, see :data:`SVD_METHODS`). Each compressor's metric is ``||(W - A B) R||_F`` for a right factor
``R`` (plain SVD: ``I``; ASVD: ``diag(S)``; SVD-LLM: the whitening ``L``, ``L L^T = X^T X``), so the best rank-k
factors are ``A = U_k sqrt(s_k)``, ``B = U_k^T W / sqrt(s_k)`` with ``U_k``, ``s_k`` the top-k left singular pairs of
``M = W R`` (``A B = U_k U_k^T W``). Only ranks up to each target's cap are ever used, so:

* ``"exact"``: the full float64 LAPACK SVD of ``M`` (gesdd), truncated to k: the reference.
* ``"gram64"`` / ``"gram32"``: the top-k eigenpairs of the smaller Gram matrix of ``M`` in float64 / float32: ``M M^T``
  (out x out) when ``out <= in``, else ``M^T M`` (in x in, then ``U_k = M V_k / s_k``). For SVD-LLM with
  ``out <= in`` the Gram is ``W (X^T X) W^T``, or the accumulated output Gram ``Y^T Y`` (``Y = X W^T``, bias-free) when
  calibration collected it, which needs no X^T X and no whitening at all; with ``out > in`` the float64 Cholesky
  whitening is kept and, because ``B`` then goes through ``L^-1``, that whole path is float64 in both methods. Eigenvalues below ``1e-12`` (float64) /
  ``1e-6`` (float32) of the largest are floored there (they carry no energy); everything is computed on the
  device of ``W`` (a GPU when the model is on one) and returned there in float32.
* ``"randomized"``: ``torch.svd_lowrank`` (randomized range finder, ``k + 16`` columns, 2 power iterations) of ``M``,
  float32: kept for the comparison in docs/scale.md; at the caps used here (k is half to 80% of the full rank) it is
  no faster than the Gram methods and less accurate.
"""

from __future__ import annotations

import contextlib
import logging

import torch

from gac.errors import GacError, unknown_name

log = logging.getLogger(__name__)

SVD_METHODS = ("exact", "gram64", "gram32", "randomized")
DEFAULT_SVD = "gram32"  # the fastest method whose end-to-end perplexity on tiny is within 0.1% of exact (docs/scale.md)
_FLOOR = {torch.float64: 1e-12, torch.float32: 1e-6}
RANDOMIZED_OVERSAMPLE, RANDOMIZED_ITERS = 16, 2


SMALL_CPU = 2048  # CPU LAPACK calls on matrices up to this size run single-threaded (see lapack_threads)


@contextlib.contextmanager
def lapack_threads(*tensors: torch.Tensor):
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
    with lapack_threads(M):
        return torch.linalg.svd(M, full_matrices=False)


def _check(W: torch.Tensor, name: str, copy: bool = True) -> torch.Tensor:
    if W.ndim != 2:
        raise GacError(f"{name}: expected a 2-D weight, got shape {tuple(W.shape)}")
    if not torch.isfinite(W).all():
        raise GacError(f"{name}: the weight contains NaN or inf; cannot factorise it")
    return W.detach().to(torch.float64) if copy else W


def _balanced(U, S, Vh, k):
    r = S[:k].clamp_min(0).sqrt()
    return U[:, :k] * r[None, :], r[:, None] * Vh[:k]


def _rank(W, max_rank):
    full = min(W.shape)
    return full if max_rank is None else max(1, min(int(max_rank), full))


def _check_method(method: str) -> str:
    if method not in SVD_METHODS:
        raise unknown_name("factorisation method (compressor option svd)", str(method), SVD_METHODS)
    return method


def _dtype_of(method: str) -> torch.dtype:
    return torch.float32 if method in ("gram32", "randomized") else torch.float64


def _eigh_top(G: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k eigenpairs of a symmetric (PSD) ``G`` in its own dtype: ``(s, Q)`` with ``s = sqrt(lambda)`` descending
    (eigenvalues floored at a relative ``_FLOOR`` of the largest) and ``Q`` [n, k]."""
    with lapack_threads(G):
        lam, Q = torch.linalg.eigh(G)
    lam, Q = lam.flip(0)[:k], Q.flip(1)[:, :k]
    top = lam[0].clamp_min(torch.finfo(G.dtype).tiny) if lam.numel() else lam.new_tensor(1.0)
    return lam.clamp_min(top * _FLOOR[G.dtype]).sqrt(), Q


def _from_left(U: torch.Tensor, s: torch.Tensor, W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Factors from the top-k left singular pairs of ``M = W R``: ``A = U sqrt(s)``, ``B = U^T W / sqrt(s)``."""
    r = s.sqrt()
    return U * r[None, :], (U.T @ W.to(U.dtype)) / r[:, None]


def _lowrank_gram(M: torch.Tensor, W: torch.Tensor, k: int, right_inv) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k factors of ``M = W R`` (already in the working dtype) from its smaller Gram matrix.

    ``right_inv(Bm)`` returns ``Bm R^-1`` (used on the n-side, where ``B = sqrt(s) V^T R^-1``)."""
    m, n = M.shape
    if m <= n:
        s, U = _eigh_top(M @ M.T, k)
        A, B = _from_left(U, s, W)
    else:
        s, V = _eigh_top(M.T @ M, k)
        r = s.sqrt()
        A = (M @ V) / r[None, :]
        B = right_inv(r[:, None] * V.T)
    return A, B, s


def _lowrank_randomized(M: torch.Tensor, k: int, right_inv) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q = min(k + RANDOMIZED_OVERSAMPLE, *M.shape)
    U, S, V = torch.svd_lowrank(M, q=q, niter=RANDOMIZED_ITERS)
    U, S, V = U[:, :k], S[:k], V[:, :k]
    r = S.clamp_min(0).sqrt()
    return U * r[None, :], right_inv(r[:, None] * V.T), S


def _out(A, B, s, return_sigma):
    # row-major float32: LAPACK's U and V^T come column-major, and a column-major factor would be copied whole
    # wherever a contiguous one is needed (the prepared-state cache copied every factor at once for its file)
    A, B = A.float().contiguous(), B.float().contiguous()
    return (A, B, s.double()) if return_sigma else (A, B)


def svd_factors(W: torch.Tensor, max_rank: int | None = None, name: str = "weight", method: str = DEFAULT_SVD,
                return_sigma: bool = False):
    """Plain truncated SVD: ``W ~ A @ B`` minimising ``||W - AB||_F`` (PaLU's per-group decomposition)."""
    return asvd_factors(W, None, max_rank=max_rank, name=name, method=method, return_sigma=return_sigma)


def asvd_scaling(act_abs_mean: torch.Tensor, alpha: float = 0.5, name: str = "weight") -> torch.Tensor:
    """ASVD's per-input-channel scale ``S_j = mean_t |x_tj| ** alpha`` (channels never seen get the smallest positive scale)."""
    a = act_abs_mean.detach().to(torch.float64)
    if not torch.isfinite(a).all():
        raise GacError(f"{name}: NaN or inf in the activation statistics used for ASVD scaling")
    if not 0 <= alpha <= 4:
        raise GacError(f"ASVD alpha must be in [0, 4] (the paper uses 0.5), got {alpha}")
    s = a.clamp_min(0).pow(alpha)
    pos = s[s > 0]
    floor = (pos.min() if pos.numel() else torch.tensor(1.0, dtype=torch.float64, device=s.device)) * 1e-3
    return torch.where(s > 0, s, floor)


def asvd_factors(
    W: torch.Tensor, act_abs_mean: torch.Tensor | None, alpha: float = 0.5, max_rank: int | None = None,
    name: str = "weight", method: str = DEFAULT_SVD, return_sigma: bool = False,
):
    """ASVD: SVD of ``W diag(S)`` with ``S`` from :func:`asvd_scaling`, ``S^-1`` folded back into ``B``
    (``act_abs_mean=None``: no scaling, the plain SVD)."""
    _check_method(method)
    _check(W, name, copy=False)
    if act_abs_mean is not None and act_abs_mean.shape != (W.shape[1],):
        raise GacError(f"{name}: activation statistics have shape {tuple(act_abs_mean.shape)}, expected ({W.shape[1]},)")
    dt = _dtype_of(method)
    s = None if act_abs_mean is None else asvd_scaling(act_abs_mean.to(W.device), alpha, name).to(dt)
    Wd = W.detach().to(dt)
    M = Wd if s is None else Wd * s[None, :]
    k = _rank(W, max_rank)

    def right_inv(Bm):
        return Bm if s is None else Bm / s[None, :]

    if method == "exact":
        U, S, Vh = _svd(M)
        A, B = _balanced(U, S, Vh, k)
        return _out(A, right_inv(B), S[:k], return_sigma)
    if method == "randomized":
        return _out(*_lowrank_randomized(M, k, right_inv), return_sigma)
    with lapack_threads(M):
        A, B, S = _lowrank_gram(M, Wd, k, right_inv)
    return _out(A, B, S, return_sigma)


def whitening(xtx: torch.Tensor, eps: float = 1e-6, name: str = "weight", tries: int = 6) -> tuple[torch.Tensor, str]:
    """A square root ``L`` of ``X^T X`` (``X^T X ~ L L^T``, L invertible), in float64, for SVD-LLM.

    Cholesky of ``X^T X + eps * mean(diag) * I``; when that fails the regulariser grows tenfold per try; when all
    tries fail (the matrix is far from positive definite: dead channels, fewer tokens than channels, fp16 overflow),
    the fallback is the symmetric square root from an eigendecomposition with eigenvalues clamped at
    ``eps * mean(diag)``. Returns ``(L, how)`` where ``how`` says which path was taken (``L`` is lower triangular
    exactly when ``how`` starts with ``"cholesky"``). Holds two n x n float64 matrices besides the input.
    """
    if xtx.ndim != 2 or xtx.shape[0] != xtx.shape[1]:
        raise GacError(f"{name}: X^T X must be square, got shape {tuple(xtx.shape)}")
    if not torch.isfinite(xtx).all():
        raise GacError(f"{name}: NaN or inf in X^T X; the calibration activations are not finite")
    C = xtx.detach().to(torch.float64)
    C = (C + C.T).mul_(0.5)  # a fresh symmetric copy: regularised in place below, the caller's X^T X untouched
    scale = float(C.diagonal().mean().clamp_min(1e-30))
    e, added = eps, 0.0
    for t in range(tries):
        C.diagonal().add_(e * scale - added)
        added = e * scale
        L, info = torch.linalg.cholesky_ex(C)
        if int(info) == 0:
            how = "cholesky" if t == 0 else f"cholesky (regularised, eps={e:g})"
            if t:
                log.warning("%s: X^T X not positive definite; Cholesky succeeded with eps=%g", name, e)
            return L, how
        del L
        e *= 10.0
    C.diagonal().sub_(added)
    w, Q = torch.linalg.eigh(C)
    w = w.clamp_min(eps * scale)
    log.warning(
        "%s: X^T X is not positive definite even with eps=%g; falling back to a clamped eigendecomposition square root",
        name, e / 10,
    )
    return Q * w.sqrt()[None, :], "eigh (clamped fallback)"


def _right_solve(L: torch.Tensor, how: str, Bm: torch.Tensor) -> torch.Tensor:
    """``Bm L^-1`` in float64 (triangular solve for a Cholesky factor, LU otherwise)."""
    Bm = Bm.to(torch.float64)
    with lapack_threads(L):
        if how.startswith("cholesky"):
            return torch.linalg.solve_triangular(L, Bm, upper=False, left=False)
        return torch.linalg.solve(L.T, Bm.T, left=True).T


def svdllm_factors(
    W: torch.Tensor, xtx: torch.Tensor | None, max_rank: int | None = None, eps: float = 1e-6, name: str = "weight",
    method: str = DEFAULT_SVD, yty: torch.Tensor | None = None, trace: float | None = None, return_sigma: bool = False,
):
    """SVD-LLM truncation-aware whitening: SVD of ``W L`` (``L L^T = X^T X + eps mean(diag) I``), ``B = sqrt(S) V^T L^-1``.

    Truncating the SVD of ``W L`` minimises the output error ``||(W - AB) X^T||_F`` directly. Returns (A, B, how)
    (and S with ``return_sigma``). ``yty``: the output Gram ``Y^T Y`` (out x out), which the Gram methods use instead
    of X^T X when ``out <= in`` (``W (X^T X + c I) W^T = Y^T Y + c W W^T``, so ``Y`` must not hold the module's
    bias: calibration subtracts it; ``trace`` = tr(X^T X) gives ``c``);
    ``how`` is then ``"gram"`` (no whitening needed).
    """
    _check_method(method)
    _check(W, name, copy=False)
    m, n = W.shape
    if xtx is None and yty is None:
        raise GacError(f"{name}: SVD-LLM needs X^T X (or the output Gram Y^T Y); calibration recorded neither")
    if xtx is not None and xtx.shape != (n, n):
        raise GacError(f"{name}: X^T X has shape {tuple(xtx.shape)}, expected ({n}, {n})")
    if yty is not None and yty.shape != (m, m):
        raise GacError(f"{name}: Y^T Y has shape {tuple(yty.shape)}, expected ({m}, {m})")
    k = _rank(W, max_rank)
    dt = _dtype_of(method)
    Wd = W.detach().to(dt)
    if method.startswith("gram") and m <= n:
        with lapack_threads(Wd):
            if yty is not None:
                if not torch.isfinite(yty).all():
                    raise GacError(f"{name}: NaN or inf in Y^T Y; the calibration activations are not finite")
                if trace is None:
                    trace = float(xtx.diagonal().sum()) if xtx is not None else 0.0
                c = eps * max(float(trace) / n, 1e-30)
                G = yty.to(device=W.device, dtype=dt) + c * (Wd @ Wd.T)
            else:
                if not torch.isfinite(xtx).all():
                    raise GacError(f"{name}: NaN or inf in X^T X; the calibration activations are not finite")
                C = xtx.to(device=W.device, dtype=dt)
                C = (C + C.T).mul_(0.5)
                C.diagonal().add_(eps * float(C.diagonal().mean().clamp_min(1e-30)))
                G = Wd @ (C @ Wd.T)
                del C
            G = (G + G.T).mul_(0.5)
            s, U = _eigh_top(G, k)
            del G
            A, B = _from_left(U, s, Wd)
        A, B, s = _out(A, B, s, True)
        return (A, B, "gram", s) if return_sigma else (A, B, "gram")
    if xtx is None:
        raise GacError(f"{name}: SVD-LLM with method {method!r} on a {m} x {n} weight needs X^T X, but calibration "
                       f"recorded only Y^T Y; collect X^T X (the compressor's stat_plan) or use method 'gram32'/'gram64'")
    with lapack_threads(xtx):
        L, how = whitening(xtx.to(W.device), eps, name)
    if method == "exact":
        W64 = W.detach().to(torch.float64)
        U, S, Vh = _svd(W64 @ L)
        A, Mb = _balanced(U, S, Vh, k)
        B, S = _right_solve(L, how, Mb), S[:k]
    else:
        # through the whitening (out > in): B needs L^-1, whose conditioning is that of X^T X's square root, so the
        # product W L and its Gram stay float64 in both Gram methods (float32 lost W entirely on an ill-conditioned
        # X^T X: tests/compression/test_math.py); only the comparison method "randomized" runs it in float32
        if method != "randomized":
            Wd = W.detach().to(torch.float64)
        M = Wd @ L.to(Wd.dtype)

        def right_inv(Bm):
            return _right_solve(L, how, Bm)

        with lapack_threads(M):
            A, B, S = (_lowrank_randomized(M, k, right_inv) if method == "randomized"
                       else _lowrank_gram(M, Wd, k, right_inv))
    if not torch.isfinite(B).all():
        raise GacError(f"{name}: whitening produced non-finite factors ({how}); raise eps")
    A, B, S = _out(A, B, S, True)
    return (A, B, how, S) if return_sigma else (A, B, how)


# ----------------------------------------------------------------------------------------------- compact factors
def compact_factors(A: torch.Tensor, B: torch.Tensor, S: torch.Tensor, col_scale: torch.Tensor | None = None) -> dict:
    """Keep only the smaller factor (and ``S``); :func:`rank_factors` rebuilds the other from ``W`` at apply time.

    Valid for factors of the form ``A = U sqrt(S)``, ``B = U^T W / sqrt(S)`` (every Gram-method factorisation with
    ``out <= in``, where ``A`` is kept: ``B = A^T W / S``) and, with ``out > in``, ``A = W R V / sqrt(S)``,
    ``B = sqrt(S) V^T R^-1`` for a diagonal ``R = diag(col_scale)`` (plain SVD: ``col_scale`` None; ASVD), where
    ``B`` is kept: ``A = W diag(col_scale^2) B^T / S``. A factor pair holds about as many numbers as the dense weight
    (up to the break-even rank); the kept factor alone 1.25-5x fewer (docs/scale.md).
    """
    m, n = A.shape[0], B.shape[1]
    if m <= n:
        return {"A": A, "S": S}
    out = {"B": B, "S": S}
    if col_scale is not None:
        out["col_scale2"] = col_scale.detach().double().pow(2).float().cpu()
    return out


def rank_factors(f: dict, W: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A[:, :r], B[:r])`` on ``W``'s device in float32, rebuilding a factor :func:`compact_factors` dropped."""
    if "A" in f and "B" in f:
        return f["A"][:, :r].to(W.device), f["B"][:r].to(W.device)
    S = f["S"][:r].to(device=W.device, dtype=torch.float32)
    Wf = W.detach().float()
    if "A" in f:
        A = f["A"][:, :r].to(device=W.device, dtype=torch.float32)
        return A, (A.T @ Wf) / S[:, None]
    B = f["B"][:r].to(device=W.device, dtype=torch.float32)
    c = f.get("col_scale2")
    Bs = B if c is None else B * c.to(device=W.device, dtype=torch.float32)[None, :]
    return (Wf @ Bs.T) / S[None, :], B


def whitened_factors(
    W: torch.Tensor, L: torch.Tensor, max_rank: int | None = None, name: str = "weight", method: str = "exact",
    how: str = "cholesky", return_sigma: bool = False,
):
    """SVD of ``W L`` for a given square root ``L`` of ``X^T X`` (from :func:`whitening`, ``how`` its second result),
    ``B = sqrt(S) V^T L^-1``. Returns (A, B) (and S with ``return_sigma``).

    The truncation minimises the output error ``||(W - AB) X^T||_F``. PaLU's default ``whiten`` decomposition: one
    ``L`` per projection, shared by its head groups (``W`` is one group's rows). ``method`` as in the module
    docstring; with the Gram methods and ``out <= in`` (a head group is narrower than the hidden size) the factors
    come from the eigenvectors of ``(W L)(W L)^T = W X^T X W^T`` and ``B = U^T W / sqrt(s)``, so ``L^-1`` is never
    applied; with ``out > in`` the path is float64 as in :func:`svdllm_factors`.
    """
    _check_method(method)
    _check(W, name, copy=False)
    m, n = W.shape
    if L.shape != (n, n):
        raise GacError(f"{name}: the whitening factor has shape {tuple(L.shape)}, expected ({n}, {n})")
    k = _rank(W, max_rank)
    L64 = L.to(device=W.device, dtype=torch.float64)

    def right_inv(Bm):
        return _right_solve(L64, how, Bm)

    if method == "exact":
        W64 = W.detach().to(torch.float64)
        U, S, Vh = _svd(W64 @ L64)
        A, Mb = _balanced(U, S, Vh, k)
        B, S = right_inv(Mb), S[:k]
    else:
        dt = _dtype_of(method) if (m <= n or method == "randomized") else torch.float64
        Wd = W.detach().to(dt)
        M = Wd @ L64.to(dt)
        with lapack_threads(M):
            A, B, S = (_lowrank_randomized(M, k, right_inv) if method == "randomized"
                       else _lowrank_gram(M, Wd, k, right_inv))
    if not torch.isfinite(B).all() or not torch.isfinite(A).all():
        raise GacError(f"{name}: whitening produced non-finite factors; the calibration X^T X is degenerate")
    return _out(A, B, S, return_sigma)
